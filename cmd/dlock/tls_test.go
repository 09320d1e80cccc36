package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
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

	"github.com/dlock-go/dlock/internal/testserver"
)

// pki is a test CA with a server certificate for 127.0.0.1 and a client
// certificate, all in PEM files.
type pki struct {
	CA                    string // the CA certificate
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// newPKI makes a CA, a server certificate for 127.0.0.1 (which also
// serves as an etcd peer's client certificate) and a client certificate,
// written to a temporary directory.
func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dlock test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := pki{CA: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.CA, "CERTIFICATE", caDER)
	issue := func(serial int64, name string, usage []x509.ExtKeyUsage, ip bool) (certFile, keyFile string) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  usage,
		}
		if ip {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
			tmpl.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", kder)
		return certFile, keyFile
	}
	p.ServerCert, p.ServerKey = issue(2, "server", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, true)
	p.ClientCert, p.ClientKey = issue(3, "client", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startMTLSRedis starts a redis-server whose TLS port requires a client
// certificate signed by p's CA, and returns that port's address. (Its
// plaintext port is for testserver's readiness check only.)
func startMTLSRedis(t *testing.T, p pki) string {
	t.Helper()
	port := testserver.FreePort(t)
	testserver.StartRedis(t, testserver.WithArgs("--tls-port", strconv.Itoa(port),
		"--tls-cert-file", p.ServerCert, "--tls-key-file", p.ServerKey,
		"--tls-ca-cert-file", p.CA, "--tls-auth-clients", "yes"))
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// tlsQuery is ?ca=&cert=&key= for p's client.
func (p pki) tlsQuery() string {
	return "ca=" + p.CA + "&cert=" + p.ClientCert + "&key=" + p.ClientKey
}

// Client-certificate TLS to Redis: the right files work; a missing client
// certificate or a wrong CA is a backend error (exit 3) that says what is
// wrong; bad files are usage errors (exit 2) that never print a key.
func TestRedisClientCertificate(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	other := newPKI(t) // another CA, whose certificates the server refuses
	addr := startMTLSRedis(t, p)
	url := "rediss://" + addr + "?" + p.tlsQuery()

	r := runDlock(t, url, "run", "-n", "tls/job", "--", "sh", "-c", `echo "token=$DLOCK_TOKEN"`)
	if r.code != 0 || !strings.Contains(r.stdout, "token=") {
		t.Fatalf("rediss:// with a client certificate: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	holder, _, _ := background(t, url, "run", "tls/held", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, url, "ls"); r.code != 0 || !strings.Contains(r.stdout, "tls/held") || !strings.Contains(r.stdout, strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("ls over TLS: exit %d %q %q", r.code, r.stdout, r.stderr)
	}

	// A secret marker in a file that is not PEM: never printed.
	const marker = "PRIVATEKEYMATERIAL42"
	junk := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(junk, []byte(marker+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.pem")
	base := "rediss://" + addr + "?ca=" + p.CA
	cases := []struct {
		name, url string
		code      int
		want      []string
	}{
		{"no client certificate", base, exitBackend, []string{"client certificate", "?cert=FILE&key=FILE"}},
		{"client certificate of another CA", base + "&cert=" + other.ClientCert + "&key=" + other.ClientKey, exitBackend, []string{"client certificate"}},
		{"server signed by another CA", "rediss://" + addr + "?" + other.tlsQuery(), exitBackend, []string{"not signed by the CA in ?ca=" + other.CA}},
		{"no CA (system roots)", "rediss://" + addr + "?cert=" + p.ClientCert + "&key=" + p.ClientKey, exitBackend, []string{"?ca=FILE"}},
		{"cert without key", base + "&cert=" + p.ClientCert, exitUsage, []string{"?cert= without ?key="}},
		{"missing cert file", base + "&cert=" + missing + "&key=" + p.ClientKey, exitUsage, []string{"cert file", missing, "no such file"}},
		{"missing key file", base + "&cert=" + p.ClientCert + "&key=" + missing, exitUsage, []string{"key file", missing}},
		{"missing CA file", "rediss://" + addr + "?ca=" + missing, exitUsage, []string{"ca file", missing}},
		{"CA file not PEM", "rediss://" + addr + "?ca=" + junk, exitUsage, []string{"no PEM certificate"}},
		{"key file not PEM", base + "&cert=" + p.ClientCert + "&key=" + junk, exitUsage, []string{"key file", "PEM"}},
		{"cert file not PEM", base + "&cert=" + junk + "&key=" + p.ClientKey, exitUsage, []string{"cert file", "PEM"}},
		{"key of another certificate", base + "&cert=" + p.ClientCert + "&key=" + p.ServerKey, exitUsage, []string{"does not match"}},
		{"cert and key swapped", base + "&cert=" + p.ClientKey + "&key=" + p.ClientCert, exitUsage, []string{"cert file"}},
		{"TLS files on redis://", "redis://" + addr + "?" + p.tlsQuery(), exitUsage, []string{"needs rediss://"}},
	}
	for _, c := range cases {
		r := runDlock(t, c.url, "run", "-n", "--connect-timeout", "6s", "tls/job", "--", "echo", "ran")
		t.Logf("%s: %d %s", c.name, r.code, r.stderr)
		ok := r.code == c.code && r.stdout == ""
		for _, w := range c.want {
			ok = ok && strings.Contains(r.stderr, w)
		}
		if !ok {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", c.name, r.code, r.stdout, r.stderr, c.code, c.want)
		}
		if strings.Contains(r.stderr, marker) || strings.Contains(r.stderr, "PRIVATE KEY") {
			t.Errorf("%s: stderr shows a key file's contents: %q", c.name, r.stderr)
		}
		if strings.Count(strings.TrimSpace(r.stderr), "\n") > 2 {
			t.Errorf("%s: a long message: %q", c.name, r.stderr)
		}
	}
}

// redlocks:// speaks TLS, with a client certificate, to every node.
func TestRedlocksClientCertificate(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	addrs := []string{startMTLSRedis(t, p), startMTLSRedis(t, p), startMTLSRedis(t, p)}
	url := "redlocks://" + strings.Join(addrs, ",") + "?" + p.tlsQuery()
	if r := runDlock(t, url, "run", "-n", "rl/job", "--", "sh", "-c", `echo "token=$DLOCK_TOKEN"`); r.code != 0 || !strings.Contains(r.stdout, "token=") {
		t.Fatalf("redlocks://: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	noCert := "redlocks://" + strings.Join(addrs, ",") + "?ca=" + p.CA
	if r := runDlock(t, noCert, "run", "-n", "--connect-timeout", "6s", "rl/job", "--", "echo", "ran"); r.code != exitBackend || r.stdout != "" || !strings.Contains(r.stderr, "client certificate") {
		t.Fatalf("redlocks:// without a client certificate: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	plain := "redlock://" + strings.Join(addrs, ",")
	if r := runDlock(t, plain, "run", "-n", "--connect-timeout", "6s", "rl/job", "--", "echo", "ran"); r.code != exitBackend || !strings.Contains(r.stderr, "use redlocks://") {
		t.Fatalf("redlock:// to TLS nodes: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// startMTLSSentinel starts a Sentinel that serves TLS only (requiring
// client certificates of p's CA) and monitors, over TLS, the master at
// masterAddr as "m". It returns the Sentinel's address.
func startMTLSSentinel(t *testing.T, p pki, masterAddr string) string {
	t.Helper()
	bin := testserver.Binary(t, "redis-server")
	host, port, _ := net.SplitHostPort(masterAddr)
	for attempt := 0; attempt < 5; attempt++ {
		dir := t.TempDir()
		tlsPort := testserver.FreePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		lines := []string{
			"port 0", "bind 127.0.0.1", "tls-port " + strconv.Itoa(tlsPort),
			"tls-cert-file " + p.ServerCert, "tls-key-file " + p.ServerKey, "tls-ca-cert-file " + p.CA,
			"tls-auth-clients yes", "tls-replication yes",
			"dir " + dir, "logfile " + filepath.Join(dir, "sentinel.log"),
			"sentinel monitor m " + host + " " + port + " 1",
		}
		if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, conf, "--sentinel")
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
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
		cfg := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // readiness check only
		pair, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		for deadline := time.Now().Add(hang); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			select {
			case <-exited:
				deadline = time.Time{} // port taken: next attempt
				continue
			default:
			}
			if c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, cfg); err == nil {
				ours := servedBy(c, cmd.Process.Pid)
				c.Close()
				if ours {
					return addr
				}
			}
		}
		cmd.Process.Kill()
	}
	t.Fatal("TLS sentinel did not start")
	return ""
}

// rediss+sentinel:// speaks TLS, with the client certificate, to the
// Sentinel and to the master it names.
func TestRedissSentinelClientCertificate(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	master := startMTLSRedis(t, p)
	sentinel := startMTLSSentinel(t, p, master)
	url := "rediss+sentinel://" + sentinel + "/m?" + p.tlsQuery()
	if r := runDlock(t, url, "run", "-n", "tls/sentinel", "--", "sh", "-c", `echo "token=$DLOCK_TOKEN"`); r.code != 0 || !strings.Contains(r.stdout, "token=") {
		t.Fatalf("rediss+sentinel://: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	noCert := "rediss+sentinel://" + sentinel + "/m?ca=" + p.CA
	if r := runDlock(t, noCert, "run", "-n", "--connect-timeout", "6s", "tls/sentinel", "--", "echo", "ran"); r.code != exitBackend || r.stdout != "" || !strings.Contains(r.stderr, "client certificate") {
		t.Fatalf("rediss+sentinel:// without a client certificate: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}
