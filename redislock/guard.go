package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Guard fences writes (and reads) to data kept in Redis: each operation is
// one Lua script that checks the caller's fence against the highest fence
// the resource accepted, records it, and applies the operation, atomically.
// A holder that paused past its lease comes back with an older token and
// its write is refused with a *dlock.StaleTokenError.
//
// The fence of resource R is kept at "<prefix>:guard:{R}". Data keys passed
// to Eval must hash to the same Cluster slot: build them with Key.
//
// Every method returns by its context's deadline, even with a go-redis
// client that does not honour contexts on a stalled link (no
// ContextTimeoutEnabled): a call that got no answer in time returns an
// error wrapping dlock.ErrUnavailable and the context's error
// (context.DeadlineExceeded or context.Canceled). Its outcome is then
// unknown: a write abandoned this way may still take effect once the
// request reaches the server. It stays fenced: the fence check runs on the
// server, in the same script as the write, so it is refused there if a
// newer fence was accepted meanwhile.
type Guard struct {
	client redis.UniversalClient
	prefix string
}

// NewGuard returns a Guard on client (key prefix DefaultPrefix unless
// WithPrefix is given).
func NewGuard(client redis.UniversalClient, opts ...Option) *Guard {
	o := options{prefix: DefaultPrefix}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if redisproto.IsNil(client) {
		client = nil
	}
	return &Guard{client: client, prefix: o.prefix}
}

// FenceKey is the key holding resource's highest accepted fence. The
// resource is the hash tag, encoded like lock keys so that it is never
// empty (a resource starting with '}' gets a NUL byte in front).
func (g *Guard) FenceKey(resource string) string {
	return g.prefix + ":guard:{" + redisproto.HashTag(resource) + "}"
}

// Key returns a data key for resource that lives in the fence key's slot.
func (g *Guard) Key(resource, name string) string {
	return g.prefix + ":data:{" + redisproto.HashTag(resource) + "}:" + name
}

// fencePrelude checks and records the fence. KEYS[1] is the fence key,
// ARGV[1] the token (decimal, no leading zeros), ARGV[2] the owner. Tokens
// are compared as decimal strings (length, then bytes), so every uint64
// compares exactly. The caller's body follows as a function of its own
// KEYS and ARGV (the rest of the arrays).
const fencePrelude = `
local hi = redis.call('GET', KEYS[1])
if hi then
  local sep = string.find(hi, '|', 1, true)
  local ht, ho = string.sub(hi, 1, sep - 1), string.sub(hi, sep + 1)
  local t = ARGV[1]
  local newer = #t > #ht or (#t == #ht and t > ht)
  if not (newer or (t == ht and ARGV[2] == ho and ho ~= '')) then
    return redis.error_reply('DLOCKSTALE ' .. ht)
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. ARGV[2])
local k, a = {}, {}
for i = 2, #KEYS do k[i - 1] = KEYS[i] end
for i = 3, #ARGV do a[i - 2] = ARGV[i] end
local function body(KEYS, ARGV)
`

// Eval runs a Lua script body fenced by f: the body sees its own KEYS and
// ARGV (keys and args as passed here) and its return value is returned. It
// runs only if f is admissible; the fence is recorded even if the body then
// raises an error. Pass data keys built with Key.
//
// Eval returns by ctx's deadline; a script abandoned there (error wrapping
// dlock.ErrUnavailable and ctx's error) may still run on the server later,
// fenced by f as usual.
func (g *Guard) Eval(ctx context.Context, resource string, f dlock.Fence, body string, keys []string, args ...any) (any, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	if g.client == nil {
		return nil, fmt.Errorf("%w: redislock.NewGuard was given a nil redis client", dlock.ErrNilClient)
	}
	if err := dlock.ValidateKey(resource); err != nil {
		return nil, err
	}
	if f.Token == 0 {
		return nil, &dlock.StaleTokenError{Resource: resource, Token: 0, Owner: f.Owner}
	}
	script := g.script(body)
	allKeys := append([]string{g.FenceKey(resource)}, keys...)
	allArgs := append([]any{strconv.FormatUint(f.Token, 10), f.Owner}, args...)
	v, err, abandoned := redisproto.Await(ctx, func(ctx context.Context) (any, error) {
		return script.Run(ctx, g.client, allKeys, allArgs...).Result()
	})
	if abandoned {
		return nil, g.abandoned(resource, err)
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		if msg := err.Error(); strings.HasPrefix(msg, "DLOCKSTALE ") {
			hi, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(msg, "DLOCKSTALE ")), 10, 64)
			return nil, &dlock.StaleTokenError{Resource: resource, Token: f.Token, Owner: f.Owner, Highest: hi}
		}
		return nil, fmt.Errorf("dlock: redis guard %q: %w", resource, err)
	}
	return v, nil
}

// abandoned is the error of a call given up at the end of its context
// (cause is the context's cause).
func (g *Guard) abandoned(resource string, cause error) error {
	return fmt.Errorf("%w: redis guard %q: no answer before the context ended (the operation may still take effect, fenced): %w", dlock.ErrUnavailable, resource, cause)
}

func (g *Guard) script(body string) *redis.Script {
	return redis.NewScript(fencePrelude + body + "\nend\nreturn body(k, a)\n")
}

// Set sets data key name of resource to value, fenced by f. It returns by
// ctx's deadline; a write abandoned there may still take effect (fenced).
func (g *Guard) Set(ctx context.Context, resource string, f dlock.Fence, name, value string) error {
	_, err := g.Eval(ctx, resource, f, `return redis.call('SET', KEYS[1], ARGV[1])`, []string{g.Key(resource, name)}, value)
	return err
}

// Get reads data key name of resource, fenced by f (a fenced read: once it
// succeeds, older fences can no longer write). A missing key reads as "".
// It returns by ctx's deadline; an abandoned read may still record f.
func (g *Guard) Get(ctx context.Context, resource string, f dlock.Fence, name string) (string, error) {
	v, err := g.Eval(ctx, resource, f, `return redis.call('GET', KEYS[1])`, []string{g.Key(resource, name)})
	if err != nil || v == nil {
		return "", err
	}
	return fmt.Sprint(v), nil
}

// IncrBy adds n to data key name of resource, fenced by f, and returns the
// new value. It returns by ctx's deadline; an increment abandoned there may
// still take effect (fenced), so do not simply repeat it.
func (g *Guard) IncrBy(ctx context.Context, resource string, f dlock.Fence, name string, n int64) (int64, error) {
	v, err := g.Eval(ctx, resource, f, `return redis.call('INCRBY', KEYS[1], ARGV[1])`, []string{g.Key(resource, name)}, n)
	if err != nil {
		return 0, err
	}
	i, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("dlock: redis guard %q: INCRBY returned %T", resource, v)
	}
	return i, nil
}

// Highest returns the highest fence resource has accepted (zero if none).
// It returns by ctx's deadline.
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Fence, error) {
	if ctx == nil {
		return dlock.Fence{}, errNilContext
	}
	if g.client == nil {
		return dlock.Fence{}, dlock.ErrNilClient
	}
	v, err, abandoned := redisproto.Await(ctx, func(ctx context.Context) (string, error) {
		return g.client.Get(ctx, g.FenceKey(resource)).Result()
	})
	if abandoned {
		return dlock.Fence{}, g.abandoned(resource, err)
	}
	if errors.Is(err, redis.Nil) {
		return dlock.Fence{}, nil
	}
	if err != nil {
		return dlock.Fence{}, fmt.Errorf("dlock: redis guard %q: %w", resource, err)
	}
	tok, owner, _ := strings.Cut(v, "|")
	t, _ := strconv.ParseUint(tok, 10, 64)
	return dlock.Fence{Token: t, Owner: owner}, nil
}
