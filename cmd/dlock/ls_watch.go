package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// watchFlag is ls's --watch: off (0), or the interval between listings.
// Its value is optional, which the flag package does not know:
// joinWatchArg turns "--watch DUR" into "--watch=DUR", and a bare
// --watch into "--watch=true" (the default interval), beforehand.
type watchFlag struct{ every time.Duration }

func (w *watchFlag) String() string {
	if w == nil || w.every == 0 {
		return ""
	}
	return w.every.String()
}

func (w *watchFlag) Set(s string) error {
	switch s {
	case "true":
		w.every = lsDefaultInterval
		return nil
	case "false":
		w.every = 0
		return nil
	}
	d, ok := parseInterval(s)
	if !ok {
		if looksLikeInterval(s) {
			return fmt.Errorf("want a positive duration (500ms, 2s) or number of seconds, at most %d", maxWatchSeconds)
		}
		return fmt.Errorf("want a duration (500ms, 2s) or a number of seconds, got %q", s)
	}
	if d < lsMinInterval {
		return fmt.Errorf("%v is below the shortest interval, %v", d, lsMinInterval)
	}
	w.every = d
	return nil
}

// parseInterval parses a Go duration ("1.5s") or a number of seconds
// ("2", "0.5").
func parseInterval(s string) (time.Duration, bool) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, d > 0
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f > 0) || f > maxWatchSeconds {
		return 0, false
	}
	return time.Duration(f * float64(time.Second)), true
}

// maxWatchSeconds bounds --watch given in bare seconds (a day).
const maxWatchSeconds = 24 * 3600

// looksLikeInterval reports whether s is meant as --watch's interval,
// valid or not: a number or a duration ("0", "-1", "1e9", "3x" is not),
// so that "--watch 1e9" is reported as a bad interval rather than taken
// for the PREFIX. A PREFIX that starts with a digit but is no number
// ("2024/") is still a PREFIX.
func looksLikeInterval(s string) bool {
	if s == "" || !strings.ContainsRune("0123456789.+-", rune(s[0])) {
		return false
	}
	if _, err := time.ParseDuration(s); err == nil {
		return true
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil || errors.Is(err, strconv.ErrRange)
}

// joinWatchArg rewrites "--watch DUR" as "--watch=DUR" when the argument
// after --watch parses as an interval, else a bare "--watch" as
// "--watch=true". Arguments after "--" or after the first one that is not
// a flag are left alone, as the flag package stops there; so are the
// values of the flags that take one.
func joinWatchArg(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		switch {
		case name == "watch":
			if i+1 < len(args) {
				if _, ok := parseInterval(args[i+1]); ok || looksLikeInterval(args[i+1]) {
					out = append(out, a+"="+args[i+1])
					i++
					continue
				}
			}
			out = append(out, a+"=true")
			continue
		case lsValueFlags[name] && i+1 < len(args): // "--url URL": URL is no flag
			out = append(out, a, args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// countFlag is ls's --count: an int, and whether it was given (an
// explicit --count 0 is an error, not "no bound").
type countFlag struct {
	n   *int
	set *bool
}

func (c countFlag) String() string {
	if c.n == nil {
		return "0"
	}
	return strconv.Itoa(*c.n)
}

func (c countFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want a whole number of listings")
	}
	*c.n, *c.set = n, true
	return nil
}

// lsValueFlags are ls's flags that take a value as the next argument.
var lsValueFlags = map[string]bool{"url": true, "url-file": true, "count": true, "connect-timeout": true}

// watch lists every `every` until ctx ends (an interrupt) or count
// listings (0: no bound) have been shown, and returns the last one's
// exit status.
func (l *lister) watch(ctx context.Context, out lsOutput, every time.Duration, count int) int {
	tty := isTerminal(out.stdout)
	code := 0
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 0; count == 0 || n < count; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return code
			case <-tick.C:
			}
		}
		v := l.list(ctx)
		if ctx.Err() != nil {
			return code // interrupted mid-listing: its error is no news
		}
		now := time.Now().Format("2006-01-02 15:04:05.000 MST")
		switch {
		case tty:
			// Home, clear the screen, then a header like watch(1)'s.
			fmt.Fprintf(out.stdout, "\x1b[H\x1b[2J\x1b[3JEvery %v: dlock ls %s    %s\n\n", every, l.where, now)
		case !out.json:
			fmt.Fprintf(out.stdout, "--- %s ---\n", now)
		}
		code = out.show(v, l.where)
	}
	return code
}

// isTerminal reports whether w is a terminal (a character device: a
// redraw sent to /dev/null does no harm).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
