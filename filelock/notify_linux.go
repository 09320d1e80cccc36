package filelock

import (
	"encoding/binary"
	"os"
	"syscall"
)

// dirNotifier reads inotify events of one directory from one goroutine.
// The inotify descriptor is non-blocking, so os.NewFile puts it in the
// runtime's poller: Close makes the pending Read return and the goroutine
// exit, and close waits for that.
type dirNotifier struct {
	f    *os.File
	done chan struct{}
}

// notifyMask: every record write is a rename into place (IN_MOVED_TO); an
// operator deleting a record is IN_DELETE.
const notifyMask = syscall.IN_MOVED_TO | syscall.IN_DELETE | syscall.IN_ONLYDIR

// startNotifier watches dir. onName gets the name of each file renamed into
// or deleted from dir; onOverflow is called when the kernel dropped events.
func startNotifier(dir string, onName func(name string), onOverflow func()) (*dirNotifier, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	if _, err := syscall.InotifyAddWatch(fd, dir, notifyMask); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("inotify_add_watch", err)
	}
	n := &dirNotifier{f: os.NewFile(uintptr(fd), "inotify:"+dir), done: make(chan struct{})}
	go n.read(onName, onOverflow)
	return n, nil
}

func (n *dirNotifier) read(onName func(string), onOverflow func()) {
	defer close(n.done)
	buf := make([]byte, 64<<10)
	for {
		k, err := n.f.Read(buf)
		if err != nil {
			// Closed, or a failure: waiters fall back to their poll timers.
			return
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= k; {
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + syscall.SizeofInotifyEvent
			end := min(start+nameLen, k)
			off = end
			if mask&syscall.IN_Q_OVERFLOW != 0 {
				onOverflow()
				continue
			}
			name := buf[start:end]
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			if len(name) > 0 {
				onName(string(name))
			}
		}
	}
}

// close stops the reader and waits for its goroutine to exit.
func (n *dirNotifier) close() {
	n.f.Close()
	<-n.done
}
