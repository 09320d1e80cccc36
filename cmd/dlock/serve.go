package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	etcdversion "go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/server/v3/embed"
)

const serveUsage = `Usage: dlock serve [--data-dir DIR] [--listen 127.0.0.1:2379]

Runs a single-node etcd server in this process: a real lock server with
nothing to install. Clients use --url etcd://LISTEN (or DLOCK_URL). The peer
port is the client port + 1. Stops cleanly on SIGINT or SIGTERM; the data
directory keeps locks' fencing revisions across restarts.

Examples:
  dlock serve
  dlock serve --listen 127.0.0.1:12379 --data-dir /var/lib/dlock &
  DLOCK_URL=etcd://127.0.0.1:12379 dlock run nightly -- ./batch.sh

Options:
`

// serveReady is printed once the server accepts clients (tests wait for it).
const serveReady = "dlock serve: ready"

func cmdServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data-dir", filepath.Join(stateDir(), "etcd"), "data directory")
	listen := fs.String("listen", "127.0.0.1:2379", "client address host:port")
	fs.Usage = func() { fmt.Fprint(fs.Output(), serveUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dlock serve: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	host, portStr, err := net.SplitHostPort(*listen)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || host == "" || port < 1 || port > 65534 {
		fmt.Fprintf(stderr, "dlock serve: --listen %q must be host:port with a port in 1-65534 (the peer port is port+1)\n", *listen)
		return exitUsage
	}
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		fmt.Fprintf(stderr, "dlock serve: data directory: %v\n", err)
		return exitBackend
	}
	clientURL := url.URL{Scheme: "http", Host: *listen}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort(host, strconv.Itoa(port+1))}
	cfg := embed.NewConfig()
	cfg.Name = "dlock"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.LogLevel = "warn"
	logPath := filepath.Join(*dataDir, "etcd.log")
	cfg.LogOutputs = []string{logPath}

	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigc)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "dlock serve: %v\n", err)
		return exitBackend
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		fmt.Fprintf(stderr, "dlock serve: %v\n", err)
		return exitBackend
	case <-time.After(60 * time.Second):
		fmt.Fprintln(stderr, "dlock serve: etcd not ready after 60s")
		return exitBackend
	case sig := <-sigc:
		fmt.Fprintf(stderr, "dlock serve: %v before ready; stopping\n", sig)
		return 0
	}
	fmt.Fprintf(stdout, "%s: etcd %s on %s (data in %s, log in %s)\n", serveReady, etcdversion.Version, clientURL.String(), *dataDir, logPath)
	fmt.Fprintf(stdout, "use: --url etcd://%s   or   export DLOCK_URL=etcd://%s\n", *listen, *listen)
	select {
	case sig := <-sigc:
		fmt.Fprintf(stdout, "dlock serve: %v: stopping\n", sig)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(stderr, "dlock serve: %v\n", err)
		return exitBackend
	}
}
