package clock

import (
	"crypto/sha256"
	_ "embed" // the shim's C source
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EnvVar is the environment variable through which the shim finds the
// offset file.
const EnvVar = "DLOCK_CLOCK_OFFSET_FILE"

// offsetSize is the offset file's size: one native-endian int64 of
// nanoseconds. The shim maps these bytes; the file must never shrink.
const offsetSize = 8

//go:embed shim/shim.c
var shimSource []byte

// Build compiles the shim into dir with the system C compiler ($CC, else cc,
// else gcc) and returns the shared object's path. The file name carries a
// hash of the source, so a second Build into the same dir reuses the first
// one's result; the object is written under a temporary name and renamed,
// so a concurrent Build or a crash never leaves a half-written .so behind.
//
// Without a compiler the error is ErrNoCompiler (it names `apt-get install
// gcc`).
func Build(dir string) (soPath string, err error) {
	cc, err := compiler()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(shimSource)
	soPath = filepath.Join(dir, "dlock-clock-"+hex.EncodeToString(sum[:6])+".so")
	if st, err := os.Stat(soPath); err == nil && st.Mode().IsRegular() && st.Size() > 0 {
		return soPath, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("clock: build dir: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "dlock-clock-build-")
	if err != nil {
		return "", fmt.Errorf("clock: build dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "shim.c")
	if err := os.WriteFile(src, shimSource, 0o644); err != nil {
		return "", fmt.Errorf("clock: write shim source: %w", err)
	}
	obj := filepath.Join(tmp, "shim.so")
	cmd := exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra",
		"-fvisibility=hidden", "-o", obj, src, "-ldl")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("clock: compile shim with %s: %w\n%s", cc, err, out)
	}
	if err := os.Rename(obj, soPath); err != nil {
		return "", fmt.Errorf("clock: install shim: %w", err)
	}
	return soPath, nil
}

// compiler finds the C compiler: $CC if set, else cc, else gcc; none is
// ErrNoCompiler.
func compiler() (string, error) {
	if cc := os.Getenv("CC"); cc != "" {
		p, err := exec.LookPath(cc)
		if err != nil {
			return "", fmt.Errorf("clock: $CC=%q not found: %w", cc, err)
		}
		return p, nil
	}
	for _, name := range []string{"cc", "gcc"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNoCompiler
}

// ErrNoCompiler is Build's error when neither $CC nor cc nor gcc is found.
var ErrNoCompiler = errors.New("clock: no C compiler (cc or gcc) in PATH to build the clock shim: run `apt-get install gcc`")

// Env is the environment that makes a process load the shim (soPath, from
// Build) and follow the offset file (offsetPath, from NewOffset):
// LD_PRELOAD and EnvVar. Append it to the process's environment, e.g.
// cmd.Env = append(os.Environ(), clock.Env(so, off)...); os/exec keeps the
// last value of a repeated variable, so these win over an inherited
// LD_PRELOAD (which they replace, not extend). Both paths should be
// absolute: the process may run in another directory.
func Env(soPath, offsetPath string) []string {
	return []string{"LD_PRELOAD=" + soPath, EnvVar + "=" + offsetPath}
}

// Offset is the writer's side of an offset file: the clock shift, in
// nanoseconds, that every process running the shim with this file adds to
// its wall clock. It maps the file shared and stores the offset with one
// atomic 8-byte store, so a Set is seen by the very next clock read of
// every such process, torn values are impossible, and processes started
// later (or restarted) begin with the current offset. Its methods are safe
// for concurrent use.
type Offset struct {
	path string

	mu  sync.RWMutex // Close (W) against Set/Get (R)
	f   *os.File
	mem []byte // the shared mapping of the file's first 8 bytes; nil once closed
}

// NewOffset opens the offset file at path, creating it with offset 0 if it
// does not exist (an existing file keeps its offset; one shorter than 8
// bytes is extended with zeros). Create it before starting the processes
// that use it: the shim maps the file once at start-up and a process that
// found no file runs unshifted for good.
//
// Do not replace the file (a rename over it leaves the processes on the
// old one) or truncate it (a process reading a mapping past the end of
// the file dies with SIGBUS).
func NewOffset(path string) (*Offset, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("clock: offset file: %w", err)
	}
	st, err := f.Stat()
	if err == nil && st.Size() < offsetSize {
		err = f.Truncate(offsetSize)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("clock: offset file %s: %w", path, err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, offsetSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("clock: mmap offset file %s: %w", path, err)
	}
	return &Offset{path: path, f: f, mem: mem}, nil
}

// word is the offset in the mapping: page-aligned, so 8-byte aligned.
func (o *Offset) word() *int64 { return (*int64)(unsafe.Pointer(&o.mem[0])) }

// errClosed is returned by Set after Close.
var errClosed = errors.New("clock: offset closed")

// Set shifts the clocks of the processes following this file to real time
// plus d (negative d: behind), from their next clock read on. It replaces
// the previous offset; Set(0) restores real time.
func (o *Offset) Set(d time.Duration) error {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.mem == nil {
		return errClosed
	}
	atomic.StoreInt64(o.word(), int64(d))
	return nil
}

// Get is the current offset (0 after Close).
func (o *Offset) Get() time.Duration {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.mem == nil {
		return 0
	}
	return time.Duration(atomic.LoadInt64(o.word()))
}

// Path is the offset file's path, for Env.
func (o *Offset) Path() string { return o.path }

// Close unmaps and closes the file. The file and its last offset stay: the
// processes that mapped it keep following it. Close is idempotent.
func (o *Offset) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mem == nil {
		return nil
	}
	err := unix.Munmap(o.mem)
	o.mem = nil
	if cerr := o.f.Close(); err == nil {
		err = cerr
	}
	return err
}
