package main

import (
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"
)

// Progress line of a long wait on a terminal: from progressAfter on, once
// every progressEvery, "\rdlock run: waiting 5s for "k" (held by ...)",
// rewritten in place; cleared once the wait is over.
const (
	progressAfter = 2 * time.Second
	progressEvery = time.Second
)

// progressWriter is stderr while a progress line may be drawn on it:
// anything else written to it (a message, a log line of --verbose) first
// erases the progress line, which the next tick draws again.
type progressWriter struct {
	mu    sync.Mutex
	w     io.Writer
	drawn bool
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eraseLocked()
	return p.w.Write(b)
}

// draw replaces the progress line with line.
func (p *progressWriter) draw(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// \x1b[K erases the rest of the line: a shorter line leaves nothing
	// of the last one behind.
	writeControl(p.w, "\r"+line+"\x1b[K")
	p.drawn = true
}

// erase erases the progress line, if drawn.
func (p *progressWriter) erase() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eraseLocked()
}

func (p *progressWriter) eraseLocked() {
	if p.drawn {
		writeControl(p.w, "\r\x1b[K")
		p.drawn = false
	}
}

// showProgress draws the progress line on p until the returned stop is
// called; stop erases it, if it is drawn, before it returns.
func showProgress(p *progressWriter, name, key, held string, start time.Time) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if waited := time.Since(start); waited >= progressAfter {
					p.draw(fmt.Sprintf("%s: waiting %s for %q%s", name, waited.Round(time.Second), key, held))
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
		p.erase()
	}
}

// writeControl writes s, whose control characters are dlock's own (any
// text from elsewhere in it escaped already), to w; through a scrubWriter
// it is scrubbed of secrets but not escaped.
func writeControl(w io.Writer, s string) {
	if sw, ok := w.(*scrubWriter); ok {
		sw.mu.Lock()
		defer sw.mu.Unlock()
		io.WriteString(sw.w, scrub(s, sw.secrets))
		return
	}
	io.WriteString(w, s)
}

// stderrIsForegroundTerminal reports whether fd 2 is a terminal whose
// foreground is dlock's process group: there a progress line can be drawn
// and erased (from the background, with "stty tostop", writing would stop
// dlock). Outside Linux it says no.
func stderrIsForegroundTerminal() bool {
	pg, err := tcgetpgrp(2)
	return err == nil && pg == syscall.Getpgrp()
}
