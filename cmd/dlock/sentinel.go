package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// sentinelGrace is how much longer than the first Sentinel the others
// have to answer answeringSentinels. It is what a hung Sentinel costs
// each command; it must be well above the lag between two healthy
// Sentinels on a loaded host (a quarter of a second is not: a Sentinel
// that answered would be left out, and said not to answer).
const sentinelGrace = time.Second

// silentSentinel is a Sentinel answeringSentinels left out: err is why
// (nil: no reply by the time it stopped waiting, after waited).
type silentSentinel struct {
	addr   string
	err    error
	waited time.Duration
}

// dialFailed reports that s could not even be connected to (refused, no
// route): ls's endpointWarnings names those already.
func (s silentSentinel) dialFailed() bool {
	var op *net.OpError
	return errors.As(s.err, &op) && op.Op == "dial"
}

// sentinelWarnings is a line for each Sentinel left out, naming its
// address (never a password: Sentinel addresses hold none, and the
// caller's writer scrubs the URL's secrets) and why; up of all Sentinels
// are used. skipDialFailed leaves out those that refused connections.
func sentinelWarnings(silent []silentSentinel, up, all int, skipDialFailed bool) []string {
	var out []string
	for _, s := range silent {
		if skipDialFailed && s.dialFailed() {
			continue
		}
		why := fmt.Sprintf("no reply to PING within %v", s.waited.Round(10*time.Millisecond))
		if s.err != nil {
			why = oneLine(s.err.Error())
		}
		out = append(out, fmt.Sprintf("warning: sentinel %s does not answer (%s); going on with %d/%d sentinels", s.addr, why, up, all))
	}
	return out
}

// answeringSentinels is opt.SentinelAddrs without the Sentinels that do
// not answer, and those left out. go-redis asks every Sentinel of its
// list for the master at once and waits for the last of them, so a single
// hung Sentinel (its port accepts, it never answers: a stopped process, a
// black-holed host) would cost every command its whole --connect-timeout
// and fail it, although the others, a quorum, answer. Each Sentinel is
// sent a PING, all at once, until deadline; once the first answers, the
// others have as long again plus sentinelGrace. Any reply counts as an
// answer (an error reply too: go-redis then reports it, a wrong
// sentinel_password say). When none answers, the list is returned whole,
// for go-redis to report on, and none is said to be left out.
func answeringSentinels(opt *redis.FailoverOptions, deadline time.Time) (keep []string, silent []silentSentinel) {
	addrs := opt.SentinelAddrs
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	type answer struct {
		i   int
		err error // nil or a reply: answered
		ok  bool
	}
	answers := make(chan answer, len(addrs)) // buffered: late senders do not block
	start := time.Now()
	for i, a := range addrs {
		go func() {
			c := redis.NewSentinelClient(&redis.Options{
				Addr: a, Dialer: opt.Dialer, TLSConfig: opt.TLSConfig,
				Username: opt.SentinelUsername, Password: opt.SentinelPassword,
				DialTimeout: opt.DialTimeout, ReadTimeout: opt.ReadTimeout, WriteTimeout: opt.WriteTimeout,
				ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1,
				// One dial: a refusal is an answer of sorts (that
				// Sentinel is left out at once, and named as refusing);
				// go-redis would dial again for half a second.
				DialerRetries: 1,
			})
			defer c.Close()
			err := c.Ping(ctx).Err()
			var rerr redis.Error
			answers <- answer{i, err, err == nil || errors.As(err, &rerr)}
		}()
	}
	ok := make([]bool, len(addrs))
	errs := make([]error, len(addrs)) // why each that failed did
	n := 0
	var grace <-chan time.Time
wait:
	for range addrs {
		select {
		case a := <-answers:
			if a.ok {
				ok[a.i] = true
				if n++; n == 1 {
					tm := time.NewTimer(time.Since(start) + sentinelGrace)
					defer tm.Stop()
					grace = tm.C
				}
			} else {
				errs[a.i] = a.err
			}
		case <-grace:
			break wait
		case <-ctx.Done():
			break wait
		}
	}
	if n == 0 {
		return addrs, nil
	}
	waited := time.Since(start)
	keep = make([]string, 0, n)
	for i, a := range addrs {
		if ok[i] {
			keep = append(keep, a)
			continue
		}
		err := errs[i]
		var te interface{ Timeout() bool }
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout() && !(silentSentinel{err: err}).dialFailed() {
			err = nil // no reply in time, as for those still waiting
		}
		silent = append(silent, silentSentinel{addr: a, err: err, waited: waited})
	}
	return keep, silent
}
