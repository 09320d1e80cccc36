package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	etcdversion "go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
)

const serveUsage = `Usage: dlock serve [--data-dir DIR] [--listen 127.0.0.1:2379]
                   [--peer-listen ADDR] [--cert FILE --key FILE [--ca FILE]]
                   [--auth [--root-password-file FILE]] [--insecure-listen]

Runs a single-node etcd server in this process: a real lock server with
nothing to install. Clients use --url etcd://LISTEN (or DLOCK_URL). Stops
cleanly on SIGINT or SIGTERM; the data directory keeps locks' fencing
revisions (and, with --auth, the users) across restarts.

--peer-listen is the etcd peer address (default: the client host, port+1);
the cluster still has this one member.

TLS: --cert and --key (PEM) serve clients, and peers, over TLS: clients use
etcds://LISTEN?ca=FILE. With --ca, clients must present a certificate signed
by that CA: etcds://LISTEN?ca=FILE&cert=FILE&key=FILE.

Auth: --auth turns etcd authentication on, with a user root whose password is
read from $DLOCK_ROOT_PASSWORD or from --root-password-file (never from the
command line, which other users can read); clients then use
etcd[s]://root:PASSWORD@LISTEN. Authentication stays on in the data
directory; a later serve with --auth checks the password against it.

A --listen address that is not loopback needs TLS (--cert, --key) and client
authentication (--ca or --auth), a --peer-listen address TLS and --ca (peers
authenticate by certificate): anyone who can reach the port could otherwise
take or break locks. --insecure-listen allows it anyway.

Examples:
  dlock serve
  dlock serve --listen 127.0.0.1:12379 --data-dir /var/lib/dlock &
  DLOCK_URL=etcd://127.0.0.1:12379 dlock run nightly -- ./batch.sh
  dlock serve --listen 10.0.0.5:2379 --cert srv.pem --key srv.key --ca ca.pem

Options:
`

// serveReady is printed once the server accepts clients (tests wait for it).
const serveReady = "dlock serve: ready"

// rootPasswordEnv holds the root password for --auth.
const rootPasswordEnv = "DLOCK_ROOT_PASSWORD"

// serveConfig is what the serve flags ask for, checked.
type serveConfig struct {
	dataDir       string
	client, peer  url.URL
	cert, key, ca string
	auth          bool
	rootPassword  string
	// tls: clients and peers are served over TLS (--cert).
	tls bool
}

// usageError is a bad serve flag (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

func cmdServe(args []string, stdout, stderr io.Writer) int {
	o := newOptions("serve", serveUsage)
	var (
		dataDir               = filepath.Join(stateDir(), "etcd")
		listen                = "127.0.0.1:2379"
		peerListen, cert, key string
		ca, rootPwFile        string
		auth, insecure        bool
	)
	o.String(&dataDir, "", "data-dir", "DIR", "data directory (default: etcd in your state directory, "+filepath.Join(stateDir(), "etcd")+")")
	o.String(&listen, "", "listen", "ADDR", "client address host:port (default 127.0.0.1:2379)")
	o.String(&peerListen, "", "peer-listen", "ADDR", "peer address host:port (default: the client host, port+1)")
	o.String(&cert, "", "cert", "FILE", "PEM certificate to serve TLS with (clients and peers)")
	o.String(&key, "", "key", "FILE", "PEM private key of --cert")
	o.String(&ca, "", "ca", "FILE", "PEM CA certificates: require client certificates signed by them")
	o.Bool(&auth, "", "auth", "turn etcd authentication on, user root (password: $"+rootPasswordEnv+" or --root-password-file)")
	o.String(&rootPwFile, "", "root-password-file", "FILE", "file holding root's password, for --auth")
	o.Bool(&insecure, "", "insecure-listen", "allow non-loopback addresses without TLS and client authentication")
	rest, code, ok := o.Parse(args, stdout, stderr)
	if !ok {
		return code
	}
	if len(rest) > 0 {
		return o.UsageError(stderr, "unexpected argument %s", strconv.Quote(rest[0]))
	}
	sc, err := checkServeFlags(dataDir, listen, peerListen, cert, key, ca, auth, rootPwFile, insecure)
	if err != nil {
		return o.UsageError(stderr, "%s", oneLine(err.Error()))
	}
	return serve(sc, stdout, stderr)
}

// checkServeFlags checks the flags, reads the password and checks the TLS
// files, before anything starts. Errors are one line; they never show a
// password or a key.
func checkServeFlags(dataDir, listen, peerListen, cert, key, ca string, auth bool, rootPwFile string, insecure bool) (*serveConfig, error) {
	sc := &serveConfig{dataDir: dataDir, cert: cert, key: key, ca: ca, auth: auth}
	host, port, err := serveAddr("--listen", listen)
	if err != nil {
		return nil, err
	}
	peer := peerListen
	if peer == "" {
		if port == 65535 {
			return nil, usagef("--listen %q: the default peer port (port+1) is out of range: give --peer-listen", listen)
		}
		peer = net.JoinHostPort(host, strconv.Itoa(port+1))
	}
	if _, _, err := serveAddr("--peer-listen", peer); err != nil {
		return nil, err
	}
	if canonAddr(peer) == canonAddr(listen) {
		return nil, usagef("--peer-listen %q is the client address: give another port", peer)
	}
	switch {
	case cert != "" && key == "":
		return nil, usagef("--cert without --key: the certificate needs its private key")
	case key != "" && cert == "":
		return nil, usagef("--key without --cert: the private key needs its certificate")
	case ca != "" && cert == "":
		return nil, usagef("--ca needs --cert and --key: client certificates are checked over TLS")
	case rootPwFile != "" && !auth:
		return nil, usagef("--root-password-file without --auth")
	}
	if cert != "" {
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return nil, usagef("--cert %q, --key %q: %s", cert, key, strings.TrimPrefix(pathError(err).Error(), "tls: "))
		}
		sc.tls = true
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, usagef("--ca: %v", pathError(err))
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, usagef("--ca %q holds no PEM certificate", ca)
		}
	}
	if auth {
		if sc.rootPassword, err = rootPassword(rootPwFile); err != nil {
			return nil, err
		}
	}
	if !insecure {
		// Clients authenticate by certificate or password; peers by
		// certificate only.
		if !isLoopback(listen) && (cert == "" || ca == "" && !auth) {
			return nil, usagef("--listen %q is not a loopback address: it needs TLS (--cert, --key) and client authentication (--ca or --auth), or --insecure-listen", listen)
		}
		if !isLoopback(peer) && (cert == "" || ca == "") {
			return nil, usagef("--peer-listen %q is not a loopback address: it needs TLS with peer certificates (--cert, --key, --ca), or --insecure-listen", peer)
		}
	}
	scheme := "http"
	if sc.tls {
		scheme = "https"
	}
	sc.client = url.URL{Scheme: scheme, Host: listen}
	sc.peer = url.URL{Scheme: scheme, Host: peer}
	return sc, nil
}

// serveAddr checks a host:port flag.
func serveAddr(flag, addr string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(p)
	if err != nil || perr != nil || h == "" || n < 1 || n > 65535 || p != strconv.Itoa(n) || !validHost(h) {
		return "", 0, usagef("%s %q must be host:port with a port in 1-65535", flag, addr)
	}
	return h, n, nil
}

// canonAddr is host:port with an IP address in canonical form.
func canonAddr(addr string) string {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		h = ip.Unmap().String()
	}
	return strings.ToLower(net.JoinHostPort(h, p))
}

// isLoopback reports whether addr's host is a loopback address or
// "localhost" (a name that resolves elsewhere is not loopback).
func isLoopback(addr string) bool {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.Unmap().IsLoopback()
}

// maxPasswordFile bounds the root password file read.
const maxPasswordFile = 4096

// rootPassword reads root's password from file, else $DLOCK_ROOT_PASSWORD.
// A trailing newline is not part of it.
func rootPassword(file string) (string, error) {
	pw := os.Getenv(rootPasswordEnv)
	from := "$" + rootPasswordEnv
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return "", usagef("--root-password-file: %v", pathError(err))
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxPasswordFile+1))
		if err != nil {
			return "", usagef("--root-password-file: %v", err)
		}
		if len(b) > maxPasswordFile {
			return "", usagef("--root-password-file %q is longer than %d bytes: not a password file?", file, maxPasswordFile)
		}
		pw, from = strings.TrimRight(string(b), "\r\n"), "--root-password-file "+strconv.Quote(file)
	}
	if pw == "" {
		return "", usagef("--auth needs root's password: set $%s or give --root-password-file FILE (%s is empty)", rootPasswordEnv, from)
	}
	return pw, nil
}

// serve runs etcd until a signal.
func serve(sc *serveConfig, stdout, stderr io.Writer) int {
	if err := os.MkdirAll(sc.dataDir, 0o700); err != nil {
		fmt.Fprintf(stderr, "dlock serve: data directory: %v\n", err)
		return exitBackend
	}
	cfg := embed.NewConfig()
	cfg.Name = "dlock"
	cfg.Dir = sc.dataDir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{sc.client}, []url.URL{sc.client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{sc.peer}, []url.URL{sc.peer}
	cfg.InitialCluster = cfg.Name + "=" + sc.peer.String()
	if sc.cert != "" {
		info := transport.TLSInfo{CertFile: sc.cert, KeyFile: sc.key, TrustedCAFile: sc.ca, ClientCertAuth: sc.ca != ""}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = info, info
	}
	cfg.LogLevel = "warn"
	logPath := filepath.Join(sc.dataDir, "etcd.log")
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
	authOn, err := setUpAuth(e, sc)
	if err != nil {
		fmt.Fprintf(stderr, "dlock serve: %v\n", err)
		var ue *usageError
		if errors.As(err, &ue) {
			return exitUsage
		}
		return exitBackend
	}
	fmt.Fprintf(stdout, "%s: etcd %s on %s (data in %s, log in %s)\n", serveReady, etcdversion.Version, sc.client.String(), sc.dataDir, logPath)
	fmt.Fprintf(stdout, "use: --url %s   or   export DLOCK_URL=%s\n", sc.clientURL(authOn), sc.clientURL(authOn))
	select {
	case sig := <-sigc:
		fmt.Fprintf(stdout, "dlock serve: %v: stopping\n", sig)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(stderr, "dlock serve: %v\n", err)
		return exitBackend
	}
}

// clientURL is the URL clients use, with placeholders for the password
// and the client certificate.
func (sc *serveConfig) clientURL(authOn bool) string {
	u := "etcd://"
	if sc.tls {
		u = "etcds://"
	}
	if authOn {
		u += "root:PASSWORD@"
	}
	u += sc.client.Host
	if sc.tls {
		q := "?ca=CA.pem"
		if sc.ca != "" {
			q += "&cert=CLIENT.pem&key=CLIENT-KEY.pem"
		}
		u += q
	}
	return u
}

// authTimeout bounds setting up authentication on the local server.
const authTimeout = 30 * time.Second

// setUpAuth turns authentication on with --auth (user root, role root),
// or with authentication already on in the data directory checks the
// password. It reports whether authentication is on.
func setUpAuth(e *embed.Etcd, sc *serveConfig) (bool, error) {
	c := v3client.New(e.Server)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), authTimeout)
	defer cancel()
	// AuthStatus reads the local auth store, which after a restart may
	// not have applied the log yet: a linearizable read first waits until
	// it has (without a user, it fails when authentication is on, which
	// says the same).
	_, err := c.Get(ctx, "dlock-serve-sync")
	enabled := errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrPermissionDenied)
	if !enabled {
		st, err := c.AuthStatus(ctx)
		if err != nil {
			return false, fmt.Errorf("auth status: %w", err)
		}
		enabled = st.Enabled
	}
	if enabled {
		if sc.auth {
			if _, err := c.Authenticate(ctx, "root", sc.rootPassword); err != nil {
				if errors.Is(err, rpctypes.ErrAuthFailed) {
					return true, usagef("authentication is on in %s and root's password is not the one given", sc.dataDir)
				}
				return true, fmt.Errorf("checking root's password: %w", err)
			}
		}
		return true, nil
	}
	if !sc.auth {
		return false, nil
	}
	if _, err := c.RoleAdd(ctx, "root"); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return false, fmt.Errorf("auth: adding role root: %w", err)
	}
	if _, err := c.UserAdd(ctx, "root", sc.rootPassword); err != nil {
		if !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			return false, fmt.Errorf("auth: adding user root: %w", err)
		}
		if _, err := c.UserChangePassword(ctx, "root", sc.rootPassword); err != nil {
			return false, fmt.Errorf("auth: setting root's password: %w", err)
		}
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		return false, fmt.Errorf("auth: granting role root: %w", err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		return false, fmt.Errorf("auth: enabling: %w", err)
	}
	return true, nil
}
