package testserver

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// PostgresUser is the database superuser of the servers StartPostgres
// starts (no password: its loopback connections are trusted; other roles
// authenticate with scram-sha-256).
const PostgresUser = "dlock"

// Postgres is a PostgreSQL server (postgres, from Debian's postgresql
// package) owned by a test: its own data directory (a copy of an initdb
// template, see pgTemplate), a free loopback port, fsync off. PostgreSQL
// refuses to run as root, so when
// the test runs as root the server runs as the "postgres" system user
// the package creates.
type Postgres struct {
	t      TB
	bin    string // directory of postgres, initdb
	dir    string // the data directory's parent (owned by the server's user)
	port   int
	cred   *syscall.Credential
	cmd    *exec.Cmd
	exited chan struct{}
}

// postgresBin returns the bin directory of the newest PostgreSQL installed
// under /usr/lib/postgresql (Debian's layout), or fails (CI) / skips.
func postgresBin(t TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var ok []string
	for _, d := range dirs {
		if isExec(filepath.Join(d, "postgres")) && isExec(filepath.Join(d, "initdb")) {
			ok = append(ok, d)
		}
	}
	if len(ok) == 0 {
		missing(t, "PostgreSQL (/usr/lib/postgresql/*/bin/postgres)", "postgresql")
	}
	sort.Slice(ok, func(i, j int) bool { return pgVersion(ok[i]) < pgVersion(ok[j]) })
	return ok[len(ok)-1]
}

func pgVersion(bin string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return v
}

// serverUser returns the credential to run a server that refuses root
// as, and its uid/gid for chown: nil when the test is not root.
func serverUser(t TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("running as root and there is no postgres user to run the server as (make deps installs it): %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// ownedDir makes a fresh directory under os.TempDir owned by cred's user
// (removed when the test ends): t.TempDir's parents are private to root.
func ownedDir(t TB, prefix string, cred *syscall.Credential) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// pgTemplate is the data directory every server starts from a copy of
// (initdb costs seconds of CPU, a copy a few milliseconds): made once per
// machine, PostgreSQL build, server user and initdb command, beside the
// port claims, and kept there like a build cache. Where it cannot be made
// or copied, a server runs initdb itself.
var pgTemplate struct {
	once sync.Once
	data string
	err  error
}

// initdbArgs are initdb's arguments after -D DIR.
var initdbArgs = []string{"-U", PostgresUser, "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"}

// pgTemplateDone marks a finished template (written last).
const pgTemplateDone = "dlock-template-done"

// postgresTemplate returns the template data directory, made on first use
// on the machine. Processes that make it at once each run initdb into a
// directory of their own and rename it into place; the first rename wins
// and the others use it.
func postgresTemplate(bin string, cred *syscall.Credential) (string, error) {
	pgTemplate.once.Do(func() {
		pgTemplate.data, pgTemplate.err = makePostgresTemplate(bin, cred)
	})
	return pgTemplate.data, pgTemplate.err
}

func makePostgresTemplate(bin string, cred *syscall.Credential) (string, error) {
	fi, err := os.Stat(filepath.Join(bin, "postgres"))
	if err != nil {
		return "", err
	}
	uid := os.Getuid()
	if cred != nil {
		uid = int(cred.Uid)
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "v1|%s|%d|%d|%d|%q", bin, fi.Size(), fi.ModTime().UnixNano(), uid, initdbArgs))
	final := filepath.Join(portDir, fmt.Sprintf("pg-template-%x", sum[:6]))
	data := filepath.Join(final, "data")
	if _, err := os.Stat(filepath.Join(final, pgTemplateDone)); err == nil {
		return data, nil
	}
	if err := os.MkdirAll(portDir, 0o777); err != nil {
		return "", err
	}
	// Leftovers of makers killed midway, and templates of other builds or
	// settings, an hour old (a copy from one may be under way).
	old, _ := filepath.Glob(filepath.Join(portDir, "pg-template-*"))
	for _, d := range old {
		if fi, err := os.Stat(d); err == nil && d != final && time.Since(fi.ModTime()) > time.Hour {
			os.RemoveAll(d)
		}
	}
	tmp, err := os.MkdirTemp(portDir, "pg-template-new-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp) // gone once renamed
	if err := initdb(bin, cred, tmp); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, pgTemplateDone), nil, 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, pgTemplateDone)); serr == nil {
			return data, nil // another process's template is in place
		}
		// A damaged one (no mark): replace it.
		if err := os.RemoveAll(final); err != nil {
			return "", err
		}
		if err := os.Rename(tmp, final); err != nil {
			return "", fmt.Errorf("placing the initdb template: %w", err)
		}
	}
	return data, nil
}

// initdb makes a data directory "data" in dir, owned by cred.
func initdb(bin string, cred *syscall.Credential, dir string) error {
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	cmd := exec.Command(filepath.Join(bin, "initdb"), append([]string{"-D", filepath.Join(dir, "data")}, initdbArgs...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v: %s", err, out)
	}
	return nil
}

// StartPostgres starts postgres on a copy of the process's initdb
// template (see postgresTemplate), in a fresh directory, on a free
// loopback port; it is stopped when the test ends.
func StartPostgres(t TB) *Postgres {
	t.Helper()
	bin := postgresBin(t)
	cred := serverUser(t)
	p := &Postgres{t: t, bin: bin, cred: cred, port: FreePort(t)}
	p.dir = ownedDir(t, "dlock-pg-", cred)
	// A copy of the template (cp -a keeps the owner and the 0700 mode
	// postgres requires); initdb of its own where there is none.
	tmpl, err := postgresTemplate(bin, cred)
	if err == nil {
		var out []byte
		if out, err = exec.Command("cp", "-a", tmpl, p.dataDir()).CombinedOutput(); err != nil {
			err = fmt.Errorf("%v: %s", err, out)
			os.RemoveAll(p.dataDir())
		}
	}
	if err != nil {
		// No template here (say, another user's port directory): slower,
		// not wrong.
		if err := initdb(bin, cred, p.dir); err != nil {
			t.Fatal(err)
		}
	}
	// The superuser is trusted on loopback; every other role needs its
	// password (so tests can try a wrong one).
	hba := "local all all trust\n" +
		"host all " + PostgresUser + " 127.0.0.1/32 trust\n" +
		"host all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(p.dataDir(), "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		_ = os.Chown(filepath.Join(p.dataDir(), "pg_hba.conf"), int(cred.Uid), int(cred.Gid))
	}
	if err := p.start(); err != nil {
		t.Fatalf("postgres: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }

// LogPath is the server's log file.
func (p *Postgres) LogPath() string { return filepath.Join(p.dir, "postgres.log") }

func (p *Postgres) start() error {
	out, err := os.OpenFile(p.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if p.cred != nil {
		_ = out.Chown(int(p.cred.Uid), int(p.cred.Gid))
	}
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), "-D", p.dataDir(),
		"-p", strconv.Itoa(p.port), "-h", "127.0.0.1", "-k", p.dir,
		// fsync off: a killed server loses nothing (the kernel has every
		// write), only a host crash would. synchronous_commit stays on, so
		// an acknowledged commit is in the kernel before the client hears
		// of it and survives Restart.
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB")
	cmd.Stdout, cmd.Stderr = out, out
	attr := serverProcAttr()
	attr.Credential = p.cred
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		out.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); out.Close(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("exited at start: %s", p.logTail())
		default:
		}
		if err := p.ready(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.kill()
	return fmt.Errorf("not ready after %v: %s", startTimeout, p.logTail())
}

// ready asks pg_isready whether the server accepts connections.
func (p *Postgres) ready() error {
	cmd := exec.Command(filepath.Join(p.bin, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", PostgresUser, "-d", "postgres", "-t", "1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// Addr is host:port of the server.
func (p *Postgres) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// Port is the server's TCP port.
func (p *Postgres) Port() int { return p.port }

// DSN is a connection URL for database db ("postgres" if empty) as the
// superuser PostgresUser.
func (p *Postgres) DSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", PostgresUser, p.Addr(), db)
}

// Exec runs SQL through psql as the superuser on database db ("postgres"
// if empty) and returns psql's unaligned, tuples-only output.
func (p *Postgres) Exec(db, sql string) (string, error) {
	if db == "" {
		db = "postgres"
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		psql = filepath.Join(p.bin, "psql")
	}
	cmd := exec.Command(psql, "-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", PostgresUser,
		"-d", db, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("psql: %v: %s", err, bytes.TrimSpace(errb.Bytes()))
	}
	return strings.TrimSpace(out.String()), nil
}

func (p *Postgres) logTail() string {
	b, _ := os.ReadFile(p.LogPath())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// group signals the postmaster and every process it forked (backends
// and workers). Each backend calls setsid(), so the process group is not
// enough: the children are found by their parent pid in /proc. The
// postmaster is stopped before the search and signalled after its
// children: a running one could fork a backend the search misses, and a
// killed one's children are reparented (and so not found) before the
// search reaches them; they would outlive the crash. It returns the
// children it signalled.
func (p *Postgres) group(sig syscall.Signal) []int {
	if p.cmd == nil || p.cmd.Process == nil {
		return nil
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	// A signal takes effect when its target next runs: until then a
	// postmaster may still finish a fork the search below would miss.
	_ = waitStopped(pid, 30*time.Second)
	children := childPIDs(pid)
	for _, c := range children {
		_ = syscall.Kill(c, sig)
	}
	if sig == syscall.SIGSTOP {
		// Paused means paused on return: a backend not yet stopped could
		// still answer the next statement (seen on a loaded host: a
		// renewal sent after Pause succeeded).
		for _, c := range children {
			_ = waitStopped(c, 30*time.Second)
		}
	}
	_ = syscall.Kill(pid, sig)
	return children
}

// exitedPID reports whether process pid has exited (gone, or a zombie
// waiting for its new parent to reap it).
func exitedPID(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || len(b) < i+3 || b[i+2] == 'Z' || b[i+2] == 'X'
}

// childPIDs lists the processes whose parent is pid (Linux /proc).
func childPIDs(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; cut after ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 {
			if pp, _ := strconv.Atoi(f[1]); pp == pid {
				out = append(out, c)
			}
		}
	}
	return out
}

// Pause stops the server and all its backends (SIGSTOP): connections stay
// open and queries hang.
func (p *Postgres) Pause() { p.group(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (p *Postgres) Resume() { p.group(syscall.SIGCONT) }

func (p *Postgres) kill() {
	if p.cmd == nil {
		return
	}
	p.group(syscall.SIGCONT)
	children := p.group(syscall.SIGKILL)
	end := time.Now().Add(10 * time.Second)
	select {
	case <-p.exited:
	case <-time.After(time.Until(end)):
		p.t.Errorf("postgres pid %d did not exit after SIGKILL", p.cmd.Process.Pid)
	}
	// The backends too, so that the crash is over when kill returns (and
	// a restart does not find the old server's shared memory in use).
	for _, c := range children {
		for !exitedPID(c) && time.Now().Before(end) {
			time.Sleep(time.Millisecond)
		}
		if !exitedPID(c) {
			p.t.Errorf("postgres backend pid %d did not exit after SIGKILL", c)
		}
	}
	p.cmd = nil
}

// Stop kills the server (and its backends) and waits for it to exit. It
// is idempotent. The data directory stays, so Restart brings it back.
func (p *Postgres) Stop() { p.kill() }

// Restart kills the server (a crash: committed data survives, since
// every commit reaches the OS before it is acknowledged) and starts it
// again on the same port and data.
func (p *Postgres) Restart() {
	p.t.Helper()
	p.kill()
	var err error
	for attempt := 0; attempt < 50; attempt++ { // the port may linger briefly
		if err = p.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.t.Fatalf("postgres restart on port %d: %v", p.port, err)
}

// PgBouncer is a pgbouncer process (Debian's pgbouncer package) in front
// of a Postgres, pooling in transaction mode: consecutive transactions of
// one client connection may run on different server connections, so
// session state (advisory locks, LISTEN, prepared statements) does not
// survive between them.
type PgBouncer struct {
	t      TB
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartPgBouncer starts pgbouncer in transaction pooling mode in front of
// pg on a free loopback port; it is stopped when the test ends.
func StartPgBouncer(t TB, pg *Postgres) *PgBouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if b := "/usr/sbin/pgbouncer"; isExec(b) {
			bin = b
		} else {
			missing(t, "pgbouncer", "pgbouncer")
		}
	}
	cred := serverUser(t)
	b := &PgBouncer{t: t, port: FreePort(t)}
	b.dir = ownedDir(t, "dlock-pgbouncer-", cred)
	ini := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("* = host=127.0.0.1 port=%d", pg.Port()),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		fmt.Sprintf("listen_port = %d", b.port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(b.dir, "users.txt"),
		"pool_mode = transaction",
		"max_client_conn = 500",
		"default_pool_size = 20",
		"ignore_startup_parameters = extra_float_digits,search_path",
		"logfile = " + filepath.Join(b.dir, "pgbouncer.log"),
		"pidfile = " + filepath.Join(b.dir, "pgbouncer.pid"),
	}, "\n") + "\n"
	files := map[string]string{
		"pgbouncer.ini": ini,
		"users.txt":     fmt.Sprintf("%q \"\"\n", PostgresUser),
	}
	for name, content := range files {
		path := filepath.Join(b.dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			_ = os.Chown(path, int(cred.Uid), int(cred.Gid))
		}
	}
	cmd := exec.Command(bin, filepath.Join(b.dir, "pgbouncer.ini"))
	attr := serverProcAttr()
	attr.Credential = cred
	cmd.SysProcAttr = attr
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	b.cmd, b.exited = cmd, exited
	t.Cleanup(b.Stop)
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
			t.Fatalf("pgbouncer exited at start: %s %s", out.String(), log)
		default:
		}
		if c, err := net.DialTimeout("tcp", b.Addr(), time.Second); err == nil {
			c.Close()
			return b
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("pgbouncer not listening after %v", startTimeout)
	return nil
}

// LogPath is pgbouncer's log file.
func (b *PgBouncer) LogPath() string { return filepath.Join(b.dir, "pgbouncer.log") }

// Addr is host:port of pgbouncer.
func (b *PgBouncer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// DSN is a connection URL for database db ("postgres" if empty) through
// pgbouncer. Clients must not rely on session state, and pgx must not use
// its statement cache (default_query_exec_mode=exec).
func (b *PgBouncer) DSN(db string) string {
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&default_query_exec_mode=exec", PostgresUser, b.Addr(), db)
}

// Stop kills pgbouncer and waits for it to exit. It is idempotent.
func (b *PgBouncer) Stop() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		b.t.Errorf("pgbouncer pid %d did not exit after SIGKILL", b.cmd.Process.Pid)
	}
	b.cmd = nil
}
