package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// serveWith runs `dlock serve` with args on free loopback ports (client
// and, with peer, an explicit --peer-listen) and environment env, and
// waits until it is ready. A port free a moment ago may be taken by the
// time dlock serve binds it (as the local end of another test's
// connection): then it tries other ports. It returns the client address and the server.
func serveWith(t *testing.T, dataDir string, peer bool, env []string, args ...string) (string, *served) {
	t.Helper()
	lastErr := ""
	for attempt := 0; attempt < 20; attempt++ {
		listen := fmt.Sprintf("127.0.0.1:%d", testserver.FreePort(t))
		full := append([]string{"serve", "--data-dir", dataDir, "--listen", listen}, args...)
		if peer {
			full = append(full, "--peer-listen", fmt.Sprintf("127.0.0.1:%d", testserver.FreePort(t)))
		}
		cmd := exec.Command(bin, full...)
		cmd.Env = append(os.Environ(), env...)
		out, errb := &syncBuffer{}, &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, errb
		cmd.WaitDelay = 5 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s := &served{cmd: cmd, exited: make(chan error, 1)}
		go func() { s.exited <- cmd.Wait() }()
		deadline := time.After(hang)
	wait:
		for {
			select {
			case <-s.exited:
				if strings.Contains(errb.String(), "address already in use") {
					lastErr = errb.String()
					break wait // try other ports
				}
				t.Fatalf("dlock serve %v exited: %s %s", args, out.String(), errb.String())
			case <-deadline:
				cmd.Process.Kill()
				t.Fatalf("hang: dlock serve not ready: %s %s", out.String(), errb.String())
			case <-time.After(20 * time.Millisecond):
				if serveAnnounced(out.String()) {
					t.Cleanup(func() {
						cmd.Process.Signal(syscall.SIGTERM)
						select {
						case <-s.exited:
						case <-time.After(hang):
							cmd.Process.Kill()
						}
					})
					s.url = out.String()
					return listen, s
				}
			}
		}
	}
	t.Fatalf("dlock serve did not start on any free port: %s", lastErr)
	return "", nil
}

// stopServe stops a server with SIGTERM and waits for its clean exit.
func stopServe(t *testing.T, s *served) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.exited:
		if err != nil {
			t.Fatalf("dlock serve exit: %v", err)
		}
		s.exited <- nil // for the cleanup
	case <-time.After(hang):
		t.Fatal("hang: dlock serve ignored SIGTERM")
	}
}

// dlock serve with TLS and client certificates: etcds:// with the client
// certificate runs and lists locks; without it, or in plaintext, it is a
// backend error (exit 3) that says what to change.
func TestServeClientCertificates(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	other := newPKI(t)
	addr, srv := serveWith(t, t.TempDir(), true, nil, "--cert", p.ServerCert, "--key", p.ServerKey, "--ca", p.CA)
	if !strings.Contains(srv.url, "etcds://"+addr+"?ca=") || !strings.Contains(srv.url, "cert=") {
		t.Errorf("serve does not show the etcds:// URL to use: %q", srv.url)
	}
	url := "etcds://" + addr + "?" + p.tlsQuery()
	r := runDlock(t, url, "run", "-n", "tls/etcd", "--", "sh", "-c", `echo "token=$DLOCK_TOKEN"`)
	if r.code != 0 || !strings.Contains(r.stdout, "token=") {
		t.Fatalf("etcds:// with a client certificate: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	holder, _, _ := background(t, url, "run", "tls/held", "--", "sh", "-c", "echo started; exec sleep 60")
	if r := runDlock(t, url, "ls"); r.code != 0 || !strings.Contains(r.stdout, "tls/held") || !strings.Contains(r.stdout, strconv.Itoa(holder.Process.Pid)) {
		t.Fatalf("ls over etcds://: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	cases := []struct {
		name, url string
		code      int
		want      string
	}{
		{"no client certificate", "etcds://" + addr + "?ca=" + p.CA, exitBackend, "client certificate"},
		{"client certificate of another CA", "etcds://" + addr + "?ca=" + p.CA + "&cert=" + other.ClientCert + "&key=" + other.ClientKey, exitBackend, "client certificate"},
		{"server signed by another CA", "etcds://" + addr + "?" + other.tlsQuery(), exitBackend, "not signed by the CA"},
		{"plaintext", "etcd://" + addr, exitBackend, "use etcds://"},
		{"cert without key", "etcds://" + addr + "?ca=" + p.CA + "&cert=" + p.ClientCert, exitUsage, "without ?key="},
		{"key not PEM", "etcds://" + addr + "?ca=" + p.CA + "&cert=" + p.ClientCert + "&key=" + p.CA, exitUsage, "key file"},
	}
	// The cases at once (each waits for its --connect-timeout), within
	// this test.
	results := make([]result, len(cases))
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() {
			results[i], errs[i] = runDlockErr(c.url, "run", "-n", "--connect-timeout", "6s", "tls/etcd", "--", "echo", "ran")
		})
	}
	wg.Wait()
	for i, c := range cases {
		r := results[i]
		if errs[i] != nil {
			t.Fatalf("%s: %v", c.name, errs[i])
		}
		t.Logf("%s: %d %s", c.name, r.code, r.stderr)
		if r.code != c.code || r.stdout != "" || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", c.name, r.code, r.stdout, r.stderr, c.code, c.want)
		}
	}
	stopServe(t, srv)
}

// dlock serve --auth: root's password from the environment or a file;
// clients need it; it stays on in the data directory, where a wrong
// password is refused. Passwords are never printed.
func TestServeAuth(t *testing.T) {
	t.Parallel()
	const pw = "s3cretRootPw"
	dir := t.TempDir()
	addr, srv := serveWith(t, dir, false, []string{rootPasswordEnv + "=" + pw}, "--auth")
	if strings.Contains(srv.url, pw) || !strings.Contains(srv.url, "etcd://root:PASSWORD@"+addr) {
		t.Errorf("serve --auth output: %q", srv.url)
	}
	url := "etcd://root:" + pw + "@" + addr
	if r := runDlock(t, url, "run", "-n", "auth/job", "--", "echo", "ran"); r.code != 0 || r.stdout != "ran\n" {
		t.Fatalf("etcd:// as root: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	for u, want := range map[string]string{"etcd://" + addr: "requires authentication", "etcd://root:wrongPw99@" + addr: "authentication failed"} {
		r := runDlock(t, u, "run", "-n", "--connect-timeout", "3s", "auth/job", "--", "echo", "ran")
		t.Logf("%s: %d %s", u, r.code, r.stderr)
		if r.code != exitBackend || r.stdout != "" || !strings.Contains(r.stderr, want) || strings.Contains(r.stderr, "wrongPw99") || strings.Contains(r.stderr, pw) {
			t.Errorf("%s: exit %d %q %q; want %d with %q, without the password", u, r.code, r.stdout, r.stderr, exitBackend, want)
		}
	}
	stopServe(t, srv)

	// Authentication stays on; the password is checked against the data
	// directory's.
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("notTheRootPw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Both ports free ones: the default peer port (port+1) may be taken
	// by another test's server.
	r := runDlock(t, "", "serve", "--data-dir", dir, "--listen", fmt.Sprintf("127.0.0.1:%d", testserver.FreePort(t)),
		"--peer-listen", fmt.Sprintf("127.0.0.1:%d", testserver.FreePort(t)), "--auth", "--root-password-file", pwFile)
	if r.code != exitUsage || !strings.Contains(r.stderr, "not the one given") || strings.Contains(r.stderr+r.stdout, "notTheRootPw") {
		t.Fatalf("serve --auth with another password: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	addr, srv = serveWith(t, dir, false, nil)
	if !strings.Contains(srv.url, "root:PASSWORD@") {
		t.Errorf("serve on a data directory with auth on: %q", srv.url)
	}
	if r := runDlock(t, "etcd://"+addr, "run", "-n", "--connect-timeout", "3s", "auth/job", "--", "echo", "ran"); r.code != exitBackend {
		t.Errorf("auth off after a restart: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runDlock(t, "etcd://root:"+pw+"@"+addr, "run", "-n", "auth/job", "--", "echo", "ran"); r.code != 0 {
		t.Errorf("root after a restart: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	stopServe(t, srv)
}

// Bad serve flags are one-line usage errors (exit 2), before anything
// starts; no password or key is printed.
func TestServeUsageErrors(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, []byte("KEYMATERIAL77\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"--cert", p.ServerCert, "--key", p.ServerKey}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "nonsense"}, "--listen"},
		{[]string{"--listen", "127.0.0.1:0"}, "1-65535"},
		{[]string{"--listen", "127.0.0.1:65535"}, "--peer-listen"},
		{[]string{"--peer-listen", "127.0.0.1:x"}, "--peer-listen"},
		{[]string{"--listen", "127.0.0.1:3000", "--peer-listen", "127.0.0.1:3000"}, "another port"},
		{[]string{"--listen", "0.0.0.0:3000"}, "--insecure-listen"},
		{append([]string{"--listen", "0.0.0.0:3000"}, tlsFlags...), "client authentication"},
		{[]string{"--peer-listen", "192.0.2.1:3001"}, "--insecure-listen"},
		{[]string{"--cert", p.ServerCert}, "--cert without --key"},
		{[]string{"--key", p.ServerKey}, "--key without --cert"},
		{[]string{"--ca", p.CA}, "--ca needs --cert"},
		{[]string{"--cert", p.ServerCert, "--key", junk}, "--cert"},
		{[]string{"--cert", junk, "--key", p.ServerKey}, "--cert"},
		{[]string{"--cert", p.ServerCert, "--key", p.ClientKey}, "does not match"},
		{append([]string{"--ca", junk}, tlsFlags...), "no PEM certificate"},
		{append([]string{"--ca", junk + ".missing"}, tlsFlags...), "no such file"},
		{[]string{"--auth"}, rootPasswordEnv},
		{[]string{"--auth", "--root-password-file", empty}, "empty"},
		{[]string{"--auth", "--root-password-file", junk + ".missing"}, "no such file"},
		{[]string{"--root-password-file", junk}, "without --auth"},
		{[]string{"extra"}, "unexpected argument"},
	}
	for _, c := range cases {
		args := append([]string{"serve", "--data-dir", t.TempDir()}, c.args...)
		r := runDlock(t, "", args...)
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.code != exitUsage || len(lines) != 2 || !strings.HasPrefix(lines[0], "dlock serve: ") || !strings.Contains(lines[0], c.want) ||
			lines[1] != "Try 'dlock serve --help' for more information." || strings.Contains(r.stderr, "KEYMATERIAL77") {
			t.Errorf("serve %v: exit %d %q %q; want %d, a line with %q and the pointer to --help", c.args, r.code, r.stdout, r.stderr, exitUsage, c.want)
		}
	}
}
