// Package history is the safety harness's record of what happened: every
// operation a worker performed or a register accepted, one JSON object per
// line, with times from the host's monotonic clock (CLOCK_MONOTONIC), which
// every process on the host shares, so that operations of different
// processes can be ordered in real time.
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

// Op is what an Event records.
type Op string

const (
	// OpAcquire: a worker's attempt to take the lock. T0 is when it was
	// called, T1 when it returned; Result OK carries the lock's Token.
	OpAcquire Op = "acquire"
	// OpRead: a worker's read of a register (Register names which), at
	// its lock's Token; Value is what it read.
	OpRead Op = "read"
	// OpWrite: a worker's write of Value to a register at its Token.
	OpWrite Op = "write"
	// OpRelease: a worker's release of its lock; T0 is the end of its
	// critical section as the worker saw it.
	OpRelease Op = "release"
	// OpLost: the worker noticed (Lost() closed, or an operation failed
	// with ErrLockLost) that it lost its lock at T1.
	OpLost Op = "lost"
	// OpAccept: a register applied a write (Register names which; Worker
	// is the writer): the register's own log, in the order it applied
	// them. Reads are logged by the workers only.
	OpAccept Op = "accept"
)

// Result is an operation's outcome.
type Result string

const (
	OK       Result = "ok"       // done, and the worker knows it
	Rejected Result = "rejected" // refused by the fencing check (stale token)
	Failed   Result = "failed"   // definitely not done (for acquire: not acquired)
	Unknown  Result = "unknown"  // the worker cannot tell (a timeout, a lost reply, a crash)
)

// Registers: every worker iteration updates both.
const (
	// Fenced is the register behind a guard: it admits an operation only
	// with a token not older than the highest it accepted.
	Fenced = "fenced"
	// Unfenced is the negative control: the same register with no token
	// check, as a resource behind a plain lock is.
	Unfenced = "unfenced"
)

// Event is one line of a history.
type Event struct {
	Worker   int    `json:"w"`
	Key      string `json:"k,omitempty"`
	Op       Op     `json:"op"`
	Register string `json:"reg,omitempty"`
	Token    uint64 `json:"tok,omitempty"`
	Value    int64  `json:"val,omitempty"`
	Result   Result `json:"res,omitempty"`
	T0       int64  `json:"t0"`           // monotonic ns: the call
	T1       int64  `json:"t1,omitempty"` // monotonic ns: the return (0: none, e.g. a crash)
	Err      string `json:"err,omitempty"`
	// Shared marks an acquisition of a Shared or Limited lock and a read
	// at its fence (a shared fence: admitted at or above the highest
	// exclusive fence, never recorded). Limit is a Limited lock's permit
	// count (on its acquisitions); 0 for the other modes.
	Shared bool `json:"sh,omitempty"`
	Limit  int  `json:"lim,omitempty"`
}

// Writer appends events to a file, one JSON object per line. It is safe
// for concurrent use. Each Write is flushed, so that a process killed
// with SIGKILL loses at most the event it was writing.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	enc *json.Encoder
}

// Create opens path for appending (creating it).
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Writer{f: f, enc: json.NewEncoder(f)}, nil
}

// Write appends e.
func (w *Writer) Write(e Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.enc.Encode(e)
}

// Close closes the file.
func (w *Writer) Close() error { return w.f.Close() }

// Read parses a history; a torn last line (a process killed mid-write)
// is skipped.
func Read(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	line := 0
	var torn error
	for sc.Scan() {
		line++
		if torn != nil {
			return nil, torn // a bad line that was not the last one
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			torn = fmt.Errorf("history line %d: %w", line, err)
			continue
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// ReadFiles reads and concatenates the histories in paths.
func ReadFiles(paths ...string) ([]Event, error) {
	var all []Event
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		ev, err := Read(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		all = append(all, ev...)
	}
	return all, nil
}
