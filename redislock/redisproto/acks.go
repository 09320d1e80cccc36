package redisproto

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replica acknowledgement. A Node whose Acks is above 0 follows each
// acquisition and renewal script with WAIT Acks AckTimeout on the same
// connection: WAIT counts the replicas that have the writes of the
// connection that issued it, and go-redis pools connections, so the script
// and the WAIT go in one pipeline (one connection, one round trip). With
// Acks 0 (redlock, and redislock by default) the scripts run exactly as
// without this file: no pipeline, no WAIT.

// AckError reports a script the server ran (its writes applied on the
// primary) that fewer than Want replicas acknowledged within Timeout: WAIT
// answered Got, or failed with Err.
type AckError struct {
	Want, Got int
	Timeout   time.Duration
	Err       error // WAIT's own failure; nil when it answered Got
}

func (e *AckError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("WAIT %d %d failed: %v", e.Want, AckMs(e.Timeout), e.Err)
	}
	return fmt.Sprintf("%d of %d replicas acknowledged within %v", e.Got, e.Want, e.Timeout)
}

// AckMs is the WAIT timeout argument for d: whole milliseconds, rounded
// up and at least 1, because WAIT n 0 waits forever (also for a d near
// math.MaxInt64, where adding before dividing would overflow).
func AckMs(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return max(ms, 1)
}

// waitCmd queues WAIT acks timeout on p.
func waitCmd(ctx context.Context, p redis.Pipeliner, acks int, timeout time.Duration) *redis.Cmd {
	return p.Do(ctx, "wait", acks, AckMs(timeout))
}

// ackResult judges a WAIT: nil when at least acks replicas acknowledged,
// else an *AckError. A nil wait (acknowledgement off) is nil.
func ackResult(wait *redis.Cmd, acks int, timeout time.Duration) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Int64()
	switch {
	case err != nil:
		return &AckError{Want: acks, Timeout: timeout, Err: err}
	case n < int64(acks):
		return &AckError{Want: acks, Got: int(n), Timeout: timeout}
	}
	return nil
}

// EvalAcked runs s on c as EVALSHA followed by WAIT acks timeout in one
// pipeline, and once more as EVAL (which caches the script again) when the
// server lacked it (NOSCRIPT). It returns the script's command and, when
// the script ran (a reply that is not an error; a nil reply counts as
// run), nil if at least acks replicas acknowledged it or an *AckError. A
// failed script is returned with a nil error: its command carries the
// failure. acks must be at least 1.
//
// The WAIT's reply arrives up to timeout after the script's: c's
// ReadTimeout must leave room for it.
func EvalAcked(ctx context.Context, c redis.Cmdable, s *redis.Script, keys []string, acks int, timeout time.Duration, args ...any) (*redis.Cmd, error) {
	run := func(eval bool) (cmd, wait *redis.Cmd) {
		_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
			if eval {
				cmd = s.Eval(ctx, p, keys, args...)
			} else {
				cmd = s.EvalSha(ctx, p, keys, args...)
			}
			wait = waitCmd(ctx, p, acks, timeout)
			return nil
		})
		return cmd, wait
	}
	cmd, wait := run(false)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd, wait = run(true)
	}
	if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return cmd, nil
	}
	return cmd, ackResult(wait, acks, timeout)
}

// evalAcked runs s with n's acknowledgement settings (Acks >= 1).
func (n *Node) evalAcked(ctx context.Context, s *redis.Script, keys []string, args ...any) (*redis.Cmd, error) {
	return EvalAcked(ctx, n.Client, s, keys, n.Acks, n.AckTimeout, args...)
}

// acquireAcked is Acquire and AcquireGroup with acknowledgement: the
// outcome, and for a grant fewer than Acks replicas acknowledged, the
// *AckError along with it (the lease is then held on the primary: the
// caller rolls it back). A refused attempt wrote nothing worth waiting
// for; its WAIT is ignored.
func (n *Node) acquireAcked(ctx context.Context, s *redis.Script, keys []string, args ...any) (Outcome, error) {
	cmd, ack := n.evalAcked(ctx, s, keys, args...)
	o, err := parseOutcome(cmd.Slice())
	if err != nil || !o.Granted {
		return o, err
	}
	return o, ack
}

// refreshAcked is Refresh and RefreshGroup with acknowledgement: a renewal
// that took effect but that fewer than Acks replicas acknowledged is
// reported held, with the *AckError.
func (n *Node) refreshAcked(ctx context.Context, s *redis.Script, keys []string, args ...any) (bool, error) {
	cmd, ack := n.evalAcked(ctx, s, keys, args...)
	v, err := cmd.Int64()
	return v == 1, acked(v == 1, err, ack)
}

// acked is a renewal's error: its own, or, when it took effect, the
// acknowledgement's (nil when acknowledged or not asked for).
func acked(held bool, err, ack error) error {
	if err == nil && held {
		return ack
	}
	return err
}

// ConnectedReplicas is the number of replicas connected to the primary c
// writes to (INFO replication's connected_slaves).
func ConnectedReplicas(ctx context.Context, c redis.UniversalClient) (int, error) {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO replication has no connected_slaves")
}
