package filelock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock"
)

// File name suffixes in a lock directory.
const (
	leaseSuffix      = ".lease"       // lease record (JSON), replaced by rename
	leaseFlockSuffix = ".flock"       // flock target serializing a lease record's updates
	fenceSuffix      = ".fence"       // guard fence record (JSON), replaced by rename
	fenceFlockSuffix = ".fence.flock" // flock target serializing a fence's checks
	writersSuffix    = ".writers"     // waiting writers' registrations (JSON), replaced by rename
	tmpSuffix        = ".tmp"         // appended to a record name while it is written
)

// access(2) mode bits (package syscall does not name them).
const (
	accessX = 0x1
	accessW = 0x2
)

// fileID is the file name stem for a key or resource: the first 32 hex
// digits (128 bits) of its SHA-256. Keys may hold any bytes but NUL, so
// they cannot be used as file names directly.
func fileID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:16])
}

// prepareDir validates dir, creates it (0700) when missing and returns its
// canonical absolute path (symlinks resolved), so that every Locker on the
// same directory in a process shares in-process wake-ups.
func prepareDir(dir string) (string, error) {
	if dir == "" {
		return "", fmt.Errorf("%w: filelock: directory is empty", dlock.ErrInvalidOption)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("%w: filelock: directory %q: %v", dlock.ErrInvalidOption, dir, err)
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(abs, 0o700); err != nil {
			return "", fmt.Errorf("%w: filelock: creating directory: %v", dlock.ErrInvalidOption, err)
		}
	case err != nil:
		return "", fmt.Errorf("%w: filelock: directory %q: %v", dlock.ErrInvalidOption, dir, err)
	case !fi.IsDir():
		return "", fmt.Errorf("%w: filelock: %q exists and is not a directory", dlock.ErrInvalidOption, dir)
	}
	// access(2) asks the kernel with the caller's real ids; it also reports
	// EROFS for a read-only mount.
	if err := syscall.Access(abs, accessW|accessX); err != nil {
		return "", fmt.Errorf("%w: filelock: directory %q is not writable: %v", dlock.ErrInvalidOption, dir, err)
	}
	canon, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("%w: filelock: directory %q: %v", dlock.ErrInvalidOption, dir, err)
	}
	return canon, nil
}

// record is a lease record file. It outlives its lease: after a release or
// an expiry it keeps Key and Counter so fencing tokens keep increasing.
//
// The top-level lease fields (Owner, Token, Expires, Metadata) are the
// format every version reads. An exclusive holder is stored in them alone,
// readable by versions without shared locks. Shared and limited holders are
// stored in Holders, with Mode and Limit, and the top-level fields then
// cover them all: they repeat the holder whose lease ends last, so a
// process that knows only the top-level fields sees the key held for as
// long as anyone holds it (see keyState and docs/filelock.md, Storage).
type record struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner,omitempty"`
	Token    uint64            `json:"token,omitempty"`
	Expires  int64             `json:"expires_unix_nano,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Counter is the highest token ever issued for Key.
	Counter uint64 `json:"counter"`
	// Mode is "shared" or "limited" while Holders holds the key; absent
	// for an exclusive holder or a free key.
	Mode string `json:"mode,omitempty"`
	// Limit is the permit count of a limited key.
	Limit int `json:"limit,omitempty"`
	// Holders are the shared or limited holders.
	Holders []holderRec `json:"holders,omitempty"`
}

// holderRec is one shared or limited holder in a record.
type holderRec struct {
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	Expires  int64             `json:"expires_unix_nano"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// writerRec is one waiting writer's registration: the Request.Waiter of a
// blocking exclusive Acquire and when the registration lapses (at most one
// TTL after that Acquire's last attempt began).
type writerRec struct {
	Waiter  string `json:"waiter"`
	Expires int64  `json:"expires_unix_nano"`
}

// writersFile is a key's waiting writers (driver: Writer preference), kept
// apart from the lease record: registrations come and go with every
// contended exclusive Acquire, and only a file that holds no counter can
// be replaced without an fsync. Like the record, it is only modified under
// the key's flock.
type writersFile struct {
	Key     string      `json:"key"`
	Writers []writerRec `json:"writers"`
}

// readWriters returns key's registered writers. Registrations are
// advisory and short-lived, so a missing file, or one that cannot be read
// or decoded (torn by a power loss: it is written without fsync), means
// none.
func readWriters(path, key string) []writerRec {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var w writersFile
	if json.Unmarshal(b, &w) != nil || w.Key != key {
		return nil
	}
	return w.Writers
}

// writeWriters replaces key's registrations (the caller holds the key's
// flock): rename of a new file, without fsync; no registration left
// removes the file.
func writeWriters(path, key string, ws []writerRec) error {
	if len(ws) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	data, err := json.Marshal(&writersFile{Key: key, Writers: ws})
	if err != nil {
		return err
	}
	return writeRename(path, data, false)
}

// Mode names in records.
const (
	modeShared  = "shared"
	modeLimited = "limited"
)

// cover is the top-level lease as a holder.
func (r *record) cover() holderRec {
	return holderRec{Owner: r.Owner, Token: r.Token, Expires: r.Expires, Metadata: r.Metadata}
}

// errCorrupt marks a record or fence file that cannot be decoded. Such a
// key is refused rather than reset, since a reset would reuse tokens.
var errCorrupt = errors.New("filelock: corrupt record")

// readJSON decodes the file at path into v. A missing file leaves v as is
// and returns ok=false.
func readJSON(path string, v any) (ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("%w %s (%v): remove it to reset (its tokens restart from 1)", errCorrupt, path, err)
	}
	return true, nil
}

// readRecord reads key's lease record. A missing record is a free key that
// was never locked (Key set, Counter 0).
func readRecord(path, key string) (record, error) {
	var r record
	ok, err := readJSON(path, &r)
	if err != nil {
		return record{}, err
	}
	if !ok {
		return record{Key: key}, nil
	}
	if r.Key != key {
		return record{}, fmt.Errorf("%w %s: it belongs to key %q, not %q", errCorrupt, path, r.Key, key)
	}
	return r, nil
}

// writeAtomic replaces path with data so that readers and crashes see the
// old or the new content, never a mix: it writes path+".tmp", fsyncs it and
// renames it over path. Callers hold the file's flock, so one temp name per
// file suffices. With syncDir the directory is fsynced too, making the
// rename itself durable (used when a counter grows).
func writeAtomic(path string, data []byte, syncDir bool) error {
	if err := writeRename(path, data, true); err != nil {
		return err
	}
	if syncDir {
		return fsyncDir(filepath.Dir(path))
	}
	return nil
}

// writeRename writes data to path+".tmp", fsyncs it when sync is set and
// renames it over path.
func writeRename(path string, data []byte, sync bool) (err error) {
	tmp := path + tmpSuffix
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func fsyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// flock is an exclusive flock(2) held on one file. Close releases it.
type flock struct {
	fd  int
	sem *semaphore
	key string
}

// Polling bounds for a contended flock. The wait is LOCK_NB attempts with
// jittered sleeps doubling between these bounds, so it always honours the
// context; critical sections are a read, a small write and an fsync.
const (
	flockMinSleep = 50 * time.Microsecond
	flockMaxSleep = 5 * time.Millisecond
)

// lockFile takes an exclusive flock on path (created 0600 if missing),
// waiting no longer than ctx allows. Callers of one process first queue on
// an in-process semaphore for the same path, so at most one goroutine per
// process polls the flock.
func lockFile(ctx context.Context, path string) (*flock, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sem, err := semaphores.acquire(ctx, path)
	if err != nil {
		return nil, err
	}
	fl, err := lockFileSlow(ctx, path)
	if err != nil {
		semaphores.release(path, sem)
		return nil, err
	}
	fl.sem, fl.key = sem, path
	return fl, nil
}

func lockFileSlow(ctx context.Context, path string) (*flock, error) {
	var fd int
	var err error
	for {
		fd, err = syscall.Open(path, syscall.O_RDWR|syscall.O_CREAT|syscall.O_CLOEXEC, 0o600)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	sleep := flockMinSleep
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		switch err {
		case nil:
			return &flock{fd: fd}, nil
		case syscall.EINTR:
			continue
		case syscall.EWOULDBLOCK:
		default:
			syscall.Close(fd)
			return nil, &os.PathError{Op: "flock", Path: path, Err: err}
		}
		d := sleep/2 + rand.N(sleep/2+1)
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			syscall.Close(fd)
			return nil, ctx.Err()
		}
		if sleep *= 2; sleep > flockMaxSleep {
			sleep = flockMaxSleep
		}
	}
}

// Close releases the flock (closing the descriptor drops it).
func (f *flock) Close() {
	syscall.Close(f.fd)
	if f.sem != nil {
		semaphores.release(f.key, f.sem)
		f.sem = nil
	}
}

// semaphore serializes the goroutines of this process that want one flock.
type semaphore struct {
	ch   chan struct{}
	refs int // guarded by semTable.mu
}

type semTable struct {
	mu sync.Mutex
	m  map[string]*semaphore
}

var semaphores = &semTable{m: map[string]*semaphore{}}

func (s *semTable) acquire(ctx context.Context, path string) (*semaphore, error) {
	s.mu.Lock()
	sem := s.m[path]
	if sem == nil {
		sem = &semaphore{ch: make(chan struct{}, 1)}
		s.m[path] = sem
	}
	sem.refs++
	s.mu.Unlock()
	select {
	case sem.ch <- struct{}{}:
		return sem, nil
	case <-ctx.Done():
		s.unref(path, sem)
		return nil, ctx.Err()
	}
}

func (s *semTable) release(path string, sem *semaphore) {
	<-sem.ch
	s.unref(path, sem)
}

func (s *semTable) unref(path string, sem *semaphore) {
	s.mu.Lock()
	if sem.refs--; sem.refs == 0 {
		delete(s.m, path)
	}
	s.mu.Unlock()
}

func (b *backend) recordPath(id string) string { return filepath.Join(b.dir, id+leaseSuffix) }

func (b *backend) writersPath(id string) string { return filepath.Join(b.dir, id+writersSuffix) }

// update runs fn on key's record under the record's flock and writes the
// record back (atomically) when fn says so. fn gets the wall-clock time,
// taken after the flock was acquired; it may also rewrite the key's
// writers file, which the same flock guards.
func (b *backend) update(ctx context.Context, key string, fn func(r *record, now int64) (write, syncDir bool, err error)) error {
	id := fileID(key)
	fl, err := lockFile(ctx, filepath.Join(b.dir, id+leaseFlockSuffix))
	if err != nil {
		return err
	}
	defer fl.Close()
	path := b.recordPath(id)
	r, err := readRecord(path, key)
	if err != nil {
		return err
	}
	write, syncDir, err := fn(&r, time.Now().UnixNano())
	if err != nil || !write {
		return err
	}
	data, err := json.Marshal(&r)
	if err != nil {
		return err
	}
	return writeAtomic(path, data, syncDir)
}
