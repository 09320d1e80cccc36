package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
)

// The environment that makes a process a child: its role and its JSON
// configuration. A test binary re-executed as a child runs no test.
const (
	roleEnv   = "DLOCK_EXAMPLE_ROLE"
	configEnv = "DLOCK_EXAMPLE_CONFIG"
)

// RunChild returns at once in a process that StartChild did not start.
// In a child it runs the function registered for the child's role with
// its configuration, and exits: 0 if the function returned nil, 1 after
// printing its error. Call it first in main and in TestMain.
func RunChild(roles map[string]func(config []byte) error) {
	role, ok := os.LookupEnv(roleEnv)
	if !ok {
		return
	}
	fn := roles[role]
	if fn == nil {
		fmt.Fprintf(os.Stderr, "child: unknown role %q\n", role)
		os.Exit(2)
	}
	if err := fn([]byte(os.Getenv(configEnv))); err != nil {
		fmt.Fprintf(os.Stderr, "child %s (pid %d): %v\n", role, os.Getpid(), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Say writes one line to the parent (the child's stdout).
func Say(format string, args ...any) {
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

// StopSelf stops this process with SIGSTOP, every thread of it, as a long
// GC pause or a stalled VM would; it returns once the parent continues it.
// It is testserver.StopSelf: thread-directed, so nothing after it runs
// before the process is continued.
func StopSelf() { testserver.StopSelf() }

// Child is a child process: this program's binary re-executed in a role.
type Child struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
	err   error // cmd.Wait's, once done is closed
}

// StartChild starts this program's binary as a child in role, with config
// (encoded as JSON). Its stdout lines are read with Expect; its stderr is
// this process's. The kernel kills it if this process dies.
func StartChild(role string, config any) (*Child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(config)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"="+role, configEnv+"="+string(cfg))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{cmd: cmd, lines: make(chan string, 64), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Expect returns the child's next line, which must start with prefix
// (followed by a space or nothing), without the prefix.
func (c *Child) Expect(ctx context.Context, prefix string) (string, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			<-c.done
			return "", fmt.Errorf("child %d exited (%v) before saying %q", c.Pid(), c.err, prefix)
		}
		if rest, ok := strings.CutPrefix(line, prefix); ok && (rest == "" || rest[0] == ' ') {
			return strings.TrimPrefix(rest, " "), nil
		}
		return "", fmt.Errorf("child %d said %q, expected %q", c.Pid(), line, prefix)
	case <-ctx.Done():
		return "", fmt.Errorf("child %d: waiting for %q: %w", c.Pid(), prefix, ctx.Err())
	}
}

// WaitStopped waits until the child is stopped, every thread of it (state
// T in /proc), as it is after StopSelf.
func (c *Child) WaitStopped(ctx context.Context) error {
	for {
		stopped, err := allStopped(c.Pid())
		if err != nil {
			return fmt.Errorf("child %d: %w", c.Pid(), err)
		}
		if stopped {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("child %d exited (%v) instead of stopping", c.Pid(), c.err)
		case <-ctx.Done():
			return fmt.Errorf("child %d did not stop: %w", c.Pid(), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// allStopped reports whether every thread of process pid is stopped
// (Linux /proc).
func allStopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, err
	}
	for _, t := range tasks {
		st, err := procState(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // a thread that exited
		}
		if err != nil {
			return false, err
		}
		if st != 'T' {
			return false, nil
		}
	}
	return len(tasks) > 0, nil
}

// procState is the state letter in a /proc stat file.
func procState(path string) (byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, fmt.Errorf("unexpected %s: %q", path, s)
	}
	return s[i+2], nil
}

// Continue resumes a stopped child (SIGCONT).
func (c *Child) Continue() error { return c.cmd.Process.Signal(syscall.SIGCONT) }

// Kill kills the child (SIGKILL): a crash, nothing runs after it.
func (c *Child) Kill() error { return c.cmd.Process.Signal(syscall.SIGKILL) }

// Wait waits for the child to exit and returns its status as an error (nil
// for exit status 0), or ctx's error. Lines it said and nobody read are
// dropped.
func (c *Child) Wait(ctx context.Context) error {
	go func() {
		for range c.lines {
		}
	}()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close kills the child if it still runs and waits for it (a cleanup).
func (c *Child) Close() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.Kill()
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.Wait(context.Background())
}
