package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// slowSentinelDelay is how much a proxy delays each chunk of a Sentinel
// that answers later than the first: with the client's handshake, its
// PING's reply comes about half a second late, twice the old
// quarter-second grace and half sentinelGrace.
const slowSentinelDelay = 60 * time.Millisecond

// prompt bounds commands that must give up quickly (a --connect-timeout of
// 1s plus a -w of 1s, with room for a slow machine). The old behaviour
// measured 30s and more.
const prompt = 15 * time.Second

// timedRun runs dlock and also returns how long it took.
//
// The time this test process was stalled meanwhile (dlocktest.StallMeter:
// starved of CPU on a loaded machine, when the dlock it started is starved
// too) is not counted: a bound checked on the result is dlock's, not the
// machine's.
func timedRun(t *testing.T, url string, args ...string) (result, time.Duration) {
	t.Helper()
	start := time.Now()
	m := dlocktest.StartStallMeter(start)
	defer m.Stop() // also when runDlock fails the test
	r := runDlock(t, url, args...)
	end := time.Now()
	took := end.Sub(start)
	if stalled := m.StopAt(end); stalled > 0 {
		t.Logf("dlock %v: %v, of which this process was stalled %v", args, took.Round(time.Millisecond), stalled.Round(time.Millisecond))
		took -= stalled
	}
	return r, took
}

// silentServer accepts connections and reads them forever without a word:
// a server that is up but does not answer. It returns host:port.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		close(done)
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// deadAddr is a loopback address where nothing listens, until the end of
// the test: a socket bound to the port, not listening, keeps it (no
// server another test starts can take it), and connections to it are
// refused. (A port that was merely free a moment ago may be a server's
// by the time it is dialled, tests running in parallel.)
func deadAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)
}

// An outage is a backend error (3), never "held" (1), whatever -w says.
func TestOutageIsBackendErrorNotConflict(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, addr string }{
		{"dead server", deadAddr(t)},
		{"silent server", silentServer(t)},
	} {
		for i, args := range [][]string{
			{"run", "-w", "1s", "k", "--", "true"},
			{"run", "-w", "1", "--connect-timeout", "1s", "k", "--", "true"},
			{"run", "-n", "--connect-timeout", "1s", "k", "--", "true"},
			{"run", "-n", "-E", "75", "--connect-timeout", "1s", "k", "--", "true"},
		} {
			t.Run(fmt.Sprintf("%s/%d", strings.ReplaceAll(c.name, " ", "_"), i), func(t *testing.T) {
				t.Parallel()
				r, took := timedRun(t, "redis://"+c.addr, args...)
				if r.code != exitBackend || strings.Contains(r.stderr, "is held") {
					t.Errorf("%s, %v: exit %d %q, want %d", c.name, args, r.code, r.stderr, exitBackend)
				}
				if took > prompt {
					t.Errorf("%s, %v: took %v", c.name, args, took)
				}
			})
		}
	}
}

// -n and opening a backend are bounded by --connect-timeout, whatever the
// service does.
func TestConnectTimeoutBoundsOpening(t *testing.T) {
	t.Parallel()
	silent := silentServer(t)
	urls := []string{
		"redis+sentinel://" + deadAddr(t) + "/mymaster",
		"redis+sentinel://" + silent + "/mymaster",
		"redis://" + silent,
		"redlock://" + silent + "," + deadAddr(t) + "," + deadAddr(t),
		"etcd://" + silent,
		"zk://" + silent,
		"zk://" + deadAddr(t) + "," + silent,
	}
	for i, u := range urls {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"run", "-n", "--connect-timeout", "1s", "k", "--", "true"},
				{"ls", "--connect-timeout", "1s"},
			} {
				r, took := timedRun(t, u, args...)
				if r.code != exitBackend || took > prompt {
					t.Errorf("%s %v: exit %d after %v: %q", u, args, r.code, took, r.stderr)
				}
			}
		})
	}
	if r := runDlock(t, fileURL(t), "run", "--connect-timeout", "0s", "k", "--", "true"); r.code != exitUsage {
		t.Errorf("--connect-timeout 0s: %d %q", r.code, r.stderr)
	}
}

// Redlock needs a majority of its nodes to answer, not all of them.
func TestRedlockProbeNeedsMajority(t *testing.T) {
	t.Parallel()
	a, b := testserver.StartRedis(t).Addr(), testserver.StartRedis(t).Addr()
	if r := runDlock(t, "redlock://"+a+","+b+","+deadAddr(t), "run", "--connect-timeout", "10s", "k", "--", "true"); r.code != 0 {
		t.Errorf("2 of 3 nodes up: %d %q", r.code, r.stderr)
	}
	r := runDlock(t, "redlock://"+a+","+deadAddr(t)+","+deadAddr(t), "run", "--connect-timeout", "10s", "k", "--", "true")
	if r.code != exitBackend || !strings.Contains(r.stderr, "majority") {
		t.Errorf("1 of 3 nodes up: %d %q", r.code, r.stderr)
	}
}

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 and its
// key, and returns their paths.
func writeSelfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dlock test"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// startTLSRedis starts a redis-server that speaks TLS only, and returns its
// address. testserver.StartRedis pings a plaintext port, so this one is
// started here.
func startTLSRedis(t *testing.T) string {
	t.Helper()
	bin := testserver.Binary(t, "redis-server")
	certFile, keyFile := writeSelfSigned(t)
	for attempt := 0; attempt < 5; attempt++ {
		port := testserver.FreePort(t)
		dir := t.TempDir()
		cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", certFile,
			"--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", dir,
			"--logfile", filepath.Join(dir, "redis.log"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-exited:
				deadline = time.Time{} // port taken or no TLS support: next attempt
				continue
			default:
			}
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
			if err == nil {
				ours := servedBy(c, cmd.Process.Pid)
				c.Close()
				if ours {
					return addr
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		cmd.Process.Kill()
		<-exited
		b, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		if strings.Contains(string(b), "not built with TLS") || strings.Contains(string(b), "Bad directive") {
			t.Skipf("redis-server has no TLS support: %s", b)
		}
	}
	t.Fatal("TLS redis-server did not start")
	return ""
}

// servedBy reports whether the Redis (or Sentinel) at the other end of c
// is the process pid (INFO server's process_id). A port free a moment ago
// may have been taken meanwhile by a server of another test, which then
// answers in place of ours (ours fails to bind it and exits).
func servedBy(c net.Conn, pid int) bool {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return false
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "$") {
		return false
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 0 {
		return false
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(br, buf); err != nil {
		return false
	}
	return strings.Contains(string(buf), "process_id:"+strconv.Itoa(pid)+"\r\n")
}

// A TLS mismatch says so, and which scheme to use, promptly.
func TestTLSMismatchIsExplained(t *testing.T) {
	t.Parallel()
	tlsAddr := startTLSRedis(t)
	plain := testserver.StartRedis(t).Addr()
	cases := []struct{ url, want string }{
		{"redis://" + tlsAddr, "rediss://"},
		{"rediss://" + plain, "redis://"},
	}
	for _, c := range cases {
		r, took := timedRun(t, c.url, "run", "-n", "--connect-timeout", "4s", "k", "--", "true")
		if r.code != exitBackend || !strings.Contains(r.stderr, "TLS") || !strings.Contains(r.stderr, "use "+c.want) {
			t.Errorf("%s: exit %d %q; want %d, TLS and use %s", c.url, r.code, r.stderr, exitBackend, c.want)
		}
		if took > prompt {
			t.Errorf("%s: took %v", c.url, took)
		}
	}
	// The right scheme works (the test's certificate is self-signed).
	if r := runDlock(t, "rediss://"+tlsAddr+"?skip_verify=true", "run", "-n", "k", "--", "true"); r.code != 0 {
		t.Errorf("rediss:// to the TLS server: %d %q", r.code, r.stderr)
	}
}

// Secrets in URLs never reach stdout or stderr: not the password of the
// userinfo, nor ?sentinel_password= or ?password=, whatever goes wrong.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	srv := testserver.StartRedis(t, testserver.WithPassword("rightPw99"))
	dead := deadAddr(t)
	const pw, sentinelPw, queryPw = "hunter2pw", "sentinelS3cret", "queryS3cret"
	urls := []string{
		// bad URLs
		"redis://:" + pw + "@127.0.0.1:notaport",
		"redis://:" + pw + "@127.0.0.1:6379/?password=" + queryPw,
		"redis+sentinel://u:" + pw + "@127.0.0.1:1/m/x?sentinel_password=" + sentinelPw,
		"redis+sentinel://u:" + pw + "@127.0.0.1:1/m?sentinel_password=" + sentinelPw + "&password=" + queryPw,
		"redis://u:" + pw + "/x@127.0.0.1:6379",
		"redis:u:" + pw + "@h",
		"redlock://u:" + pw + "@127.0.0.1:1,127.0.0.1:1",
		"etcd://u:" + pw + "@127.0.0.1:1/?password=" + queryPw,
		"ftp://u:" + pw + "@h/?token=" + queryPw,
		"zk://u:" + pw + "@127.0.0.1:1/a//b",
		"zk://u:" + pw + "@127.0.0.1:1,,127.0.0.2:1",
		"zk://u:" + pw + "@127.0.0.1:1/?session_timeout=x&password=" + queryPw,
		"zk://" + pw + "@127.0.0.1:1/app",
		"zk://u:" + pw + "/x@127.0.0.1:1",
		// unreachable
		"redis://u:" + pw + "@" + dead,
		"redis+sentinel://u:" + pw + "@" + dead + "/m?sentinel_password=" + sentinelPw,
		"redlock://u:" + pw + "@" + dead + "," + deadAddr(t),
		"etcd://u:" + pw + "@" + dead,
		"zk://u:" + pw + "@" + dead + "/app",
		// wrong password
		"redis://:" + pw + "@" + srv.Addr(),
		"redis://default:" + pw + "@" + srv.Addr() + "/0",
	}
	for i, u := range urls {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"run", "-n", "--connect-timeout", "1s", "k", "--", "true"},
				{"run", "--verbose", "-w", "1s", "--connect-timeout", "1s", "k", "--", "true"},
				{"ls", "--connect-timeout", "1s"},
				{"ls", "--verbose", "--connect-timeout", "1s", "--url", u},
			} {
				r := runDlock(t, u, args...)
				if r.code != exitUsage && r.code != exitBackend {
					t.Errorf("%s %v: exit %d %q", u, args, r.code, r.stderr)
				}
				for _, s := range []string{pw, sentinelPw, queryPw} {
					if strings.Contains(r.stdout+r.stderr, s) {
						t.Errorf("%s %v printed the secret %q:\n%s%s", u, args, s, r.stdout, r.stderr)
					}
				}
			}
		})
	}
}

// The client libraries' own logs stay quiet unless --verbose.
func TestClientLogsOnlyWithVerbose(t *testing.T) {
	t.Parallel()
	u := "redis://" + deadAddr(t)
	r := runDlock(t, u, "run", "-n", "--connect-timeout", "1s", "k", "--", "true")
	if r.code != exitBackend || strings.Contains(r.stderr, "redis: 2") || strings.Contains(r.stderr, "pool.go") || strings.Count(r.stderr, "\n") > 2 {
		t.Errorf("without --verbose: %d %q", r.code, r.stderr)
	}
	r = runDlock(t, u, "run", "--verbose", "-n", "--connect-timeout", "3s", "k", "--", "true")
	if r.code != exitBackend || !strings.Contains(r.stderr, "redis: ") || !strings.Contains(r.stderr, "connection pool") {
		t.Errorf("with --verbose: %d %q", r.code, r.stderr)
	}
	r = runDlock(t, "etcd://"+deadAddr(t), "ls", "--connect-timeout", "1s")
	if r.code != exitBackend || strings.Contains(r.stderr, `"level"`) || strings.Count(r.stderr, "\n") > 2 {
		t.Errorf("etcd without --verbose: %d %q", r.code, r.stderr)
	}
	const pw = "zkS3cretPw"
	u = "zk://u:" + pw + "@" + deadAddr(t)
	r = runDlock(t, u, "ls", "--connect-timeout", "1s")
	if r.code != exitBackend || strings.Contains(r.stderr, "zookeeper: failed") || strings.Count(r.stderr, "\n") > 1 {
		t.Errorf("zookeeper without --verbose: %d %q", r.code, r.stderr)
	}
	r = runDlock(t, u, "ls", "--verbose", "--connect-timeout", "3s")
	if r.code != exitBackend || !strings.Contains(r.stderr, "zookeeper: failed to connect") || strings.Contains(r.stderr, pw) {
		t.Errorf("zookeeper with --verbose: %d %q", r.code, r.stderr)
	}
}

// Symptom: opening a backend against a silent server took up to twice --connect-timeout.
// Opening a backend, probe, TLS-mismatch look and closing included, ends
// within --connect-timeout against a server that accepts connections and
// never answers: no second probe after the first timed out, no Close
// waiting on a Sentinel.
func TestOpeningBoundedBySilentServer(t *testing.T) {
	t.Parallel()
	silent := silentServer(t)
	// The bound is the contract, --connect-timeout + dlocktest.OverrunBound
	// (process start and exit included); the timeouts are long enough that
	// a second probe after the first timed out (twice the timeout) exceeds
	// it.
	cases := []struct {
		url     string
		timeout time.Duration // Sentinel's extra time was up to 6s from the start
		args    []string
	}{
		{"rediss://" + silent, 3 * time.Second, []string{"run", "-n", "k", "--", "true"}},
		{"rediss://" + silent, 3 * time.Second, []string{"run", "-w", "1s", "k", "--", "true"}},
		{"etcd://" + silent, 3 * time.Second, []string{"run", "-n", "k", "--", "true"}},
		{"etcds://" + silent, 3 * time.Second, []string{"ls"}},
		{"zk://" + silent, 3 * time.Second, []string{"run", "-n", "k", "--", "true"}},
		{"zk://" + silent + "/app", 3 * time.Second, []string{"ls"}},
		{"redis+sentinel://" + silent + "/mymaster", 4 * time.Second, []string{"run", "-n", "k", "--", "true"}},
	}
	for i, c := range cases {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			args := append([]string{c.args[0], "--connect-timeout", c.timeout.String()}, c.args[1:]...)
			r, took := timedRun(t, c.url, args...)
			if r.code != exitBackend || !strings.Contains(r.stderr, "no answer") {
				t.Errorf("%s %v: exit %d %q, want %d and no answer", c.url, args, r.code, r.stderr, exitBackend)
			}
			withinBound(t, fmt.Sprintf("%s %v", c.url, args), took, c.timeout)
		})
	}
}

// withinBound checks the contract of a command bounded by timeout
// (--connect-timeout, --timeout): it ended within timeout +
// dlocktest.OverrunBound, starting and ending the process included.
func withinBound(t *testing.T, what string, took, timeout time.Duration) {
	t.Helper()
	if took > timeout+dlocktest.OverrunBound {
		t.Errorf("%s: took %v, more than its bound %v + %v", what, took, timeout, dlocktest.OverrunBound)
	}
}

// etcd's gRPC client retries a TLS mismatch until its deadline: the hint
// is still given, within --connect-timeout.
func TestEtcdTLSMismatchHintWithinTimeout(t *testing.T) {
	t.Parallel()
	tlsAddr := startTLSRedis(t) // any TLS server will do
	// The hint is looked for from half the timeout on: long enough for a
	// loaded machine.
	r, took := timedRun(t, "etcd://"+tlsAddr, "run", "-n", "--connect-timeout", "6s", "k", "--", "true")
	if r.code != exitBackend || !strings.Contains(r.stderr, "use etcds://") {
		t.Errorf("etcd:// to a TLS server: exit %d %q, want %d and a hint to use etcds://", r.code, r.stderr, exitBackend)
	}
	withinBound(t, "etcd:// to a TLS server", took, 6*time.Second)
}

// A Sentinel that answers later than the first, but well within
// sentinelGrace (a loaded host; here a proxy delays it), is kept, not left
// out as hung and warned about; one that never answers is left out.
func TestAnsweringSentinelsKeepsOneThatAnswersLater(t *testing.T) {
	t.Parallel()
	fast := testserver.StartRedis(t).Addr()
	p := testserver.StartProxy(t, testserver.StartRedis(t).Addr())
	p.Delay(slowSentinelDelay)
	hung := silentServer(t)
	opt := &redis.FailoverOptions{SentinelAddrs: []string{fast, p.Addr(), hung},
		DialTimeout: hang, ReadTimeout: clientIOTimeout, WriteTimeout: clientIOTimeout}
	start := time.Now()
	keep, silent := answeringSentinels(opt, start.Add(hang))
	t.Logf("kept %v, left out %v, after %v", keep, silent, time.Since(start).Round(time.Millisecond))
	if strings.Join(keep, " ") != fast+" "+p.Addr() || len(silent) != 1 || silent[0].addr != hung {
		t.Fatalf("kept %v, left out %v; want %s and %s kept, %s left out", keep, silent, fast, p.Addr(), hung)
	}
}

// A probe that fails at once on a TLS scheme with an error that says
// nothing of TLS (the server reset the connection before the client read
// its alert: a matter of timing) is still explained: dlock reads the
// server's alert itself.
func TestProbeResetExplainedByTLSAlert(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	pair, err := tls.LoadX509KeyPair(p.ServerCert, p.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(p.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c.(*tls.Conn).Handshake() // refuses: no client certificate
				c.Close()
			}()
		}
	}()
	tg, err := parseURL("rediss://" + ln.Addr().String() + "?ca=" + p.CA)
	if err != nil {
		t.Fatal(err)
	}
	reset := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
	b := &backend{close: func() {}, probe: func(context.Context) error { return reset }}
	err = tg.probeService(b, openOptions{connectTimeout: hang, start: time.Now()})
	if err == nil || !strings.Contains(err.Error(), "the server requires a client certificate") {
		t.Fatalf("probe reset by a server that wants a client certificate: %v", err)
	}
}
