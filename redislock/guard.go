package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/guard"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Guard is a guard.Guard whose fences and values live in Redis: each
// operation is one Lua script that checks the caller's fence against the
// highest fence the resource accepted, records it, and applies the
// operation, atomically. The script applies the rule of package guard
// (dlock.FenceRecord.Admit): token 0 is never admitted; an exclusive fence
// is admitted above every token admitted (in any mode), or equal to the
// last exclusive fence from the same non-empty owner with nothing admitted
// above it, and recorded; a shared fence (Fence.Shared) is admitted at or
// above the last exclusive fence's token and raises the highest token
// admitted. A holder that paused past its lease comes back with an older
// token and its operation is refused with a *dlock.StaleTokenError
// (reported as a dlock.EventRejected to the Observer given with
// dlock.WithObserver).
//
// FenceKey(R) holds resource R's last exclusive fence, with no expiry, and
// Key(R, name) the value Put under name, in the fence key's Cluster slot.
// Data keys passed to Eval must be in that slot too: build them with Key.
// The layout is in docs/redislock.md (Guard).
//
// Every method returns by its context's deadline, even with a go-redis
// client that does not honour contexts on a stalled link (no
// ContextTimeoutEnabled): no answer in time is an error wrapping
// dlock.ErrUnavailable and the context's error. The outcome is then
// unknown, and a write that takes effect later stays fenced: the check
// runs on the server, in the same script as the write.
type Guard struct {
	client redis.UniversalClient // nil when err is set
	prefix string
	// acks and ackTimeout: WithReplicaAcks (acks 0: off).
	acks       int
	ackTimeout time.Duration
	chk        guard.Checker
	err        error // NewGuard's failure: every call returns it
	// node asks the server once whether it may evict keys (see
	// EvictionError); unsafeEviction: WithUnsafeEviction.
	node           *redisproto.Node
	unsafeEviction bool
}

var _ guard.Guard = (*Guard)(nil)

// NewGuard returns a Guard on client, configured by opts: WithPrefix (key
// prefix, default DefaultPrefix), WithReplicaAcks (Put, IncrBy and Eval
// then fail with a *ReplicationError when applied on the primary but not
// acknowledged by enough replicas; Get and Highest wait for nobody) and
// dlock.WithObserver (refusals are reported with Backend "redis"). A nil
// client gives a Guard whose every call with valid arguments fails with
// an error wrapping dlock.ErrNilClient, as does the zero Guard, and
// invalid options one whose every such call fails with an error wrapping
// dlock.ErrInvalidOption.
func NewGuard(client redis.UniversalClient, opts ...Option) *Guard {
	cfg := newConfig(opts)
	g := &Guard{client: client, prefix: cfg.prefix, chk: guard.NewChecker("redis", opts), acks: cfg.acks, ackTimeout: cfg.ackTimeout}
	if redisproto.IsNil(client) {
		g.client = nil
		g.err = fmt.Errorf("%w: redislock.NewGuard was given a nil redis client", dlock.ErrNilClient)
	} else if err := cfg.validate(client, "redislock.NewGuard"); err != nil {
		g.client = nil
		g.err = err
	} else {
		g.node, g.unsafeEviction = redisproto.NewNode(client, cfg.prefix), cfg.unsafeEviction
	}
	return g
}

// FenceKey is the key holding resource's highest accepted fence. The
// resource is the hash tag, encoded like lock keys so that it is never
// empty (a resource starting with '}' gets a NUL byte in front).
func (g *Guard) FenceKey(resource string) string {
	return g.prefix + ":guard:{" + redisproto.HashTag(resource) + "}"
}

// seenKey is the key holding the highest token resource admitted in any
// mode, when a shared fence's is above the fence key's: the fence key, a
// NUL byte and nothing (Key's names are never empty).
func (g *Guard) seenKey(resource string) string {
	return g.FenceKey(resource) + "\x00"
}

// Key returns the data key of name in resource: FenceKey(resource), a NUL
// byte, and name. It lives in the fence key's Cluster slot. name must not
// be empty: Key(resource, "") is the key of the guard's own record, which
// Eval refuses.
func (g *Guard) Key(resource, name string) string {
	return g.FenceKey(resource) + "\x00" + name
}

// fencePrelude applies the admission rule (dlock.FenceRecord.Admit) and
// records the fence. KEYS[1] is the fence key, KEYS[2] the seen key;
// ARGV[1] the token (decimal, no leading zeros), ARGV[2] the owner,
// ARGV[3] "1" for a shared fence. Tokens are compared as decimal strings
// (length, then bytes), so every uint64 compares exactly; a fence or seen
// key whose token is not one (not canonical decimal, 0, above the uint64
// range) is the error reply "DLOCKCORRUPT ...", as Highest reports it,
// and is left as it is. A seen key below the fence key's token counts as
// the fence key's token.
// A refusal is the error reply "DLOCKSTALE <bar>", bar being the token
// the fence had to reach. The caller's body follows as a function of its
// own KEYS and ARGV (the rest of the arrays).
const fencePrelude = `
local t, o, shared = ARGV[1], ARGV[2], ARGV[3] == '1'
local function tok(s)
  return string.match(s, '^[1-9]%d*$') and (#s < 20 or (#s == 20 and s <= '18446744073709551615'))
end
local function above(a, b) return #a > #b or (#a == #b and a > b) end
local hi = redis.call('GET', KEYS[1])
local ht, ho = '0', ''
if hi then
  local sep = string.find(hi, '|', 1, true)
  if not sep then
    return redis.error_reply('DLOCKCORRUPT ' .. KEYS[1] .. ' does not hold <token>|<owner>')
  end
  ht, ho = string.sub(hi, 1, sep - 1), string.sub(hi, sep + 1)
  if not tok(ht) then
    return redis.error_reply('DLOCKCORRUPT ' .. KEYS[1] .. ' does not hold <token>|<owner>')
  end
end
local seen = redis.call('GET', KEYS[2])
if seen then
  if not tok(seen) then
    return redis.error_reply('DLOCKCORRUPT ' .. KEYS[2] .. ' does not hold a token')
  end
  if above(ht, seen) then seen = ht end
else
  seen = ht
end
local ok, bar
if shared then
  ok, bar = t ~= '0' and not above(ht, t), ht
else
  ok, bar = t ~= '0' and (above(t, seen) or (hi and t == ht and o == ho and ho ~= '' and t == seen)), seen
end
if not ok then
  return redis.error_reply('DLOCKSTALE ' .. bar)
end
if shared then
  if above(t, seen) then redis.call('SET', KEYS[2], t) end
elseif above(t, ht) then
  redis.call('SET', KEYS[1], t .. '|' .. o)
  redis.call('DEL', KEYS[2])
end
local k, a = {}, {}
for i = 3, #KEYS do k[i - 2] = KEYS[i] end
for i = 4, #ARGV do a[i - 3] = ARGV[i] end
local function body(KEYS, ARGV)
`

// fenceEpilogue closes the caller's body and returns its result. An
// error reply the body returns that reads like the prelude's refusal
// ("DLOCKSTALE ...") gets the prefix "ERR script body: ", so that only the
// prelude's refusal is taken for one.
const fenceEpilogue = `
end
local r = body(k, a)
if type(r) == 'table' and type(r.err) == 'string' and string.sub(r.err, 1, 11) == 'DLOCKSTALE ' then
  return redis.error_reply('ERR script body: ' .. r.err)
end
return r
`

// Eval runs a Lua script body fenced by f: the body sees its own KEYS and
// ARGV (keys and args as passed here) and its return value is returned. It
// runs only if f is admitted; the fence is recorded (when exclusive) even
// if the body then raises an error. Pass data keys built with Key.
//
// Eval returns by ctx's deadline; a script abandoned there (error wrapping
// dlock.ErrUnavailable and ctx's error) may still run on the server later,
// fenced by f as usual.
func (g *Guard) Eval(ctx context.Context, resource string, f dlock.Fence, body string, keys []string, args ...any) (any, error) {
	if err := g.check(ctx, resource); err != nil {
		return nil, err
	}
	for _, k := range keys {
		if k == g.FenceKey(resource) || k == g.seenKey(resource) {
			return nil, fmt.Errorf("%w: redis guard %q: Eval's key %q is the guard's own record of fences: a body must not touch it", dlock.ErrInvalidOption, resource, k)
		}
	}
	return g.eval(ctx, "guard eval", resource, f, body, keys, args...)
}

// errZeroGuard is the error of every call of a Guard not made by
// NewGuard.
var errZeroGuard = fmt.Errorf("%w: zero redislock.Guard (use NewGuard)", dlock.ErrNilClient)

// check validates a call's arguments, then reports NewGuard's failure,
// or the zero Guard's (it has no client to call).
func (g *Guard) check(ctx context.Context, resource string, names ...string) error {
	if err := g.chk.Validate(ctx, resource, names...); err != nil {
		return err
	}
	if g.err == nil && g.client == nil {
		return errZeroGuard
	}
	if g.err != nil {
		return g.err
	}
	return checkEviction(ctx, g.node, g.unsafeEviction)
}

// eval runs body fenced by f. op names a write ("guard put", "guard
// incrby", "guard eval"), which WithReplicaAcks makes wait for the
// replicas; "" is a read, which waits for nobody.
func (g *Guard) eval(ctx context.Context, op, resource string, f dlock.Fence, body string, keys []string, args ...any) (any, error) {
	if err := g.chk.ValidateFence(f); err != nil {
		return nil, err
	}
	script := redis.NewScript(fencePrelude + body + fenceEpilogue)
	shared := "0"
	if f.Shared {
		shared = "1"
	}
	allKeys := append([]string{g.FenceKey(resource), g.seenKey(resource)}, keys...)
	allArgs := append([]any{strconv.FormatUint(f.Token, 10), f.Owner, shared}, args...)
	var ack error
	v, err, abandoned := redisproto.Await(ctx, func(ctx context.Context) (any, error) {
		if g.acks == 0 || op == "" {
			return script.Run(ctx, g.client, allKeys, allArgs...).Result()
		}
		cmd, aerr := redisproto.EvalAcked(ctx, g.client, script, allKeys, g.acks, g.ackTimeout, allArgs...)
		ack = aerr // read only once Await returned f's result
		return cmd.Result()
	})
	var ae *redisproto.AckError
	if !abandoned && errors.As(ack, &ae) {
		return nil, replicationError(resource, op, ae)
	}
	switch {
	case abandoned || clientGaveUp(ctx, err):
		return nil, fmt.Errorf("%w: redis guard %q: no answer before the context ended (the operation may still take effect, fenced): %w", dlock.ErrUnavailable, resource, withCause(ctx, err))
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		if hi, ok := strings.CutPrefix(err.Error(), "DLOCKSTALE "); ok {
			highest, perr := strconv.ParseUint(strings.TrimSpace(hi), 10, 64)
			if perr == nil {
				return nil, g.chk.Refuse(resource, f, highest)
			}
		}
		return nil, fmt.Errorf("dlock: redis guard %q: %w", resource, err)
	}
	return v, nil
}

// Put implements guard.Guard: it sets name of resource to value, fenced
// by f. It returns by ctx's deadline; a write abandoned there may still
// take effect (fenced).
func (g *Guard) Put(ctx context.Context, resource string, f dlock.Fence, name, value string) error {
	if err := g.check(ctx, resource, name); err != nil {
		return err
	}
	_, err := g.eval(ctx, "guard put", resource, f, `return redis.call('SET', KEYS[1], ARGV[1])`, []string{g.Key(resource, name)}, value)
	return err
}

// Get implements guard.Guard: it reads name of resource, fenced by f (a
// fenced read: once an exclusive fence is admitted, older fences can no
// longer write). ok is false when name was never Put. It returns by ctx's
// deadline; an abandoned read may still record f.
func (g *Guard) Get(ctx context.Context, resource string, f dlock.Fence, name string) (value string, ok bool, err error) {
	if err := g.check(ctx, resource, name); err != nil {
		return "", false, err
	}
	v, err := g.eval(ctx, "", resource, f, `return redis.call('GET', KEYS[1])`, []string{g.Key(resource, name)})
	switch v := v.(type) {
	case nil:
		return "", false, err
	case string:
		return v, true, nil
	default:
		return "", false, fmt.Errorf("dlock: redis guard %q: GET returned %T", resource, v)
	}
}

// IncrBy adds n to the integer kept under name in resource, fenced by f,
// and returns the new value (a missing name counts as 0). It returns by
// ctx's deadline; an increment abandoned there may still take effect
// (fenced), so do not simply repeat it.
func (g *Guard) IncrBy(ctx context.Context, resource string, f dlock.Fence, name string, n int64) (int64, error) {
	if err := g.check(ctx, resource, name); err != nil {
		return 0, err
	}
	v, err := g.eval(ctx, "guard incrby", resource, f, `return redis.call('INCRBY', KEYS[1], ARGV[1])`, []string{g.Key(resource, name)}, n)
	if err != nil {
		return 0, err
	}
	i, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("dlock: redis guard %q: INCRBY returned %T", resource, v)
	}
	return i, nil
}

// Highest implements guard.Guard: the highest exclusive fence resource
// has accepted (the zero Fence if none). It returns by ctx's deadline.
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Fence, error) {
	if err := g.check(ctx, resource); err != nil {
		return dlock.Fence{}, err
	}
	v, err, abandoned := redisproto.Await(ctx, func(ctx context.Context) (string, error) {
		return g.client.Get(ctx, g.FenceKey(resource)).Result()
	})
	return fenceReply(ctx, resource, g.FenceKey(resource), v, err, abandoned)
}

// fenceReply is Highest's answer to a GET of the fence key: the client's
// own give-up at ctx's end counts as no answer, as Await's abandonment does.
func fenceReply(ctx context.Context, resource, key, v string, err error, abandoned bool) (dlock.Fence, error) {
	switch {
	case abandoned || clientGaveUp(ctx, err):
		return dlock.Fence{}, fmt.Errorf("%w: redis guard %q: no answer before the context ended: %w", dlock.ErrUnavailable, resource, withCause(ctx, err))
	case errors.Is(err, redis.Nil):
		return dlock.Fence{}, nil
	case err != nil:
		return dlock.Fence{}, fmt.Errorf("dlock: redis guard %q: %w", resource, err)
	}
	f, ok := parseFence(v)
	if !ok {
		return dlock.Fence{}, fmt.Errorf("dlock: redis guard %q: %s holds %q, not <token>|<owner>", resource, key, v)
	}
	return f, nil
}

// parseFence parses a fence key's value as the script does: a token in
// canonical decimal (what strconv.FormatUint writes), above 0, a '|' and
// the owner. Anything else is not a fence the guard wrote.
func parseFence(v string) (dlock.Fence, bool) {
	tok, owner, found := strings.Cut(v, "|")
	t, err := strconv.ParseUint(tok, 10, 64)
	if !found || err != nil || t == 0 || strconv.FormatUint(t, 10) != tok {
		return dlock.Fence{}, false
	}
	return dlock.Fence{Token: t, Owner: owner}, true
}
