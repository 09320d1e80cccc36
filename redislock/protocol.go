package redislock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Protocol is how a Locker speaks to Redis: Lua scripts, or the Lua-free
// protocol on Tair's CAS and CAD commands (see docs/redislock.md, "The
// Lua-free protocol").
type Protocol int

const (
	// ProtocolAuto, the zero value and the default: scripts, until the
	// server refuses this client's user a script (an ACL NOPERM) and
	// offers CAS and CAD (COMMAND INFO); from then on, for every Locker
	// on the same client, the Lua-free protocol, and no script is sent
	// again. A server that refuses scripts and lacks CAS/CAD fails every
	// call with an error that says what the user needs, and is not sent
	// a script again either.
	ProtocolAuto Protocol = iota
	// ProtocolScripts runs scripts only: every mode, and a refused script
	// is an error that says what the user needs.
	ProtocolScripts
	// ProtocolTair runs Tair's CAS and CAD only, never a script:
	// exclusive locks. Shared and limited locks, and WithReplicaAcks, are
	// refused with an error wrapping dlock.ErrUnsupported.
	ProtocolTair
)

// String is the name ParseProtocol reads: "auto", "scripts" or "tair".
func (p Protocol) String() string {
	switch p {
	case ProtocolAuto:
		return "auto"
	case ProtocolScripts:
		return "scripts"
	case ProtocolTair:
		return "tair"
	}
	return fmt.Sprintf("Protocol(%d)", int(p))
}

// ParseProtocol reads a Protocol's name (String): "auto", "scripts" or
// "tair"; anything else is an error wrapping dlock.ErrInvalidOption.
func ParseProtocol(s string) (Protocol, error) {
	for _, p := range []Protocol{ProtocolAuto, ProtocolScripts, ProtocolTair} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: redis protocol %q: want auto, scripts or tair", dlock.ErrInvalidOption, s)
}

// WithProtocol makes a Locker use p (default ProtocolAuto).
func WithProtocol(p Protocol) Option {
	return driver.Setting(func(c *config) { c.protocol = p })
}

// learned is what a client's server was found to offer, shared by every
// Locker on the client (see learnedFor).
type learned struct {
	mu sync.Mutex
	// refusal: the first script the server refused this client's user
	// (an ACL NOPERM), nil while none was. Once set, no script is sent.
	refusal error
	// offers: whether the server has CAS and CAD: 0 unknown, 1 yes, -1
	// no.
	offers int8
	// asking: closed when the question in flight (offer) is answered;
	// nil when none is.
	asking chan struct{}
}

func (l *learned) state() (refusal error, offers int8) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refusal, l.offers
}

// refuse records err, a refused script, unless one is recorded already.
func (l *learned) refuse(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refusal == nil {
		l.refusal = err
	}
}

// offer reports whether the server offers CAS and CAD, asking it when
// nobody knows yet: one question per client at a time, which the other
// callers wait for until their own ctx ends. A question that failed
// leaves the answer unknown, for the next caller to ask again.
func (l *learned) offer(ctx context.Context, node *redisproto.Node) (bool, error) {
	for {
		l.mu.Lock()
		switch {
		case l.offers != 0:
			ok := l.offers > 0
			l.mu.Unlock()
			return ok, nil
		case l.asking != nil:
			ch := l.asking
			l.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return false, fmt.Errorf("asking whether the server offers CAS and CAD: %w", context.Cause(ctx))
			}
		}
		ch := make(chan struct{})
		l.asking = ch
		l.mu.Unlock()
		if hook := offerHook.Load(); hook != nil {
			(*hook)()
		}
		ok, err := node.TairOffers(ctx)
		l.mu.Lock()
		switch {
		case err != nil:
		case ok:
			l.offers = 1
		default:
			l.offers = -1
		}
		l.asking = nil
		close(ch)
		l.mu.Unlock()
		if err != nil {
			return false, fmt.Errorf("asking whether the server offers CAS and CAD: %w", err)
		}
		return ok, nil
	}
}

// offerHook, when set (tests), runs before each question learned.offer
// sends.
var offerHook atomic.Pointer[func()]

// learnedByClient holds each go-redis client's learned, keyed by a weak
// pointer to the client: an entry goes when its client is collected.
var learnedByClient sync.Map // weak.Pointer[T] -> *learned

// learnedFor is c's learned: shared by the Lockers on one *redis.Client,
// *redis.ClusterClient or *redis.Ring; a Locker's own for any other
// UniversalClient.
func learnedFor(c redis.UniversalClient) *learned {
	switch p := c.(type) {
	case *redis.Client:
		return learnedOf(p)
	case *redis.ClusterClient:
		return learnedOf(p)
	case *redis.Ring:
		return learnedOf(p)
	}
	return &learned{}
}

func learnedOf[T any](p *T) *learned {
	k := weak.Make(p)
	if v, ok := learnedByClient.Load(k); ok {
		return v.(*learned)
	}
	v, loaded := learnedByClient.LoadOrStore(k, &learned{})
	if !loaded {
		runtime.AddCleanup(p, func(k weak.Pointer[T]) { learnedByClient.Delete(k) }, k)
	}
	return v.(*learned)
}

// protocol is a Locker's choice between the two protocols.
type protocol struct {
	forced  Protocol
	learned *learned
	node    *redisproto.Node
}

// mode reports whether requests go the Lua-free way, asking the server
// whether it offers CAS and CAD when that decides it (see learned.offer),
// or the error that refuses the request: scripts refused and no CAS/CAD,
// ProtocolTair on a server without them, or the question failing.
func (p *protocol) mode(ctx context.Context) (bool, error) {
	refusal, _ := p.learned.state()
	switch {
	case p.forced == ProtocolScripts, p.forced == ProtocolAuto && refusal == nil:
		return false, nil
	}
	ok, err := p.learned.offer(ctx, p.node)
	switch {
	case err != nil && refusal != nil:
		return false, fmt.Errorf("%w (and %w)", refusal, err)
	case err != nil:
		return false, err
	case ok:
		return true, nil
	case refusal != nil:
		return false, fmt.Errorf("%w (and the server offers no CAS and CAD, Tair's commands, for redislock's Lua-free protocol)", refusal)
	}
	return false, fmt.Errorf("%w: WithProtocol(ProtocolTair) on a server without CAS and CAD (Tair's commands: Alibaba Cloud Tair, or the TairString module)", dlock.ErrUnsupported)
}

// known is mode without a question to the server: tair when requests go
// the Lua-free way, none when no request can have run (scripts refused,
// and the Lua-free way not open). For the calls that must not wait:
// undoing an attempt, leaving, listening.
func (p *protocol) known() (tair, none bool) {
	switch p.forced {
	case ProtocolTair:
		return true, false
	case ProtocolScripts:
		return false, false
	}
	refusal, offers := p.learned.state()
	switch {
	case refusal == nil:
		return false, false
	case offers > 0:
		return true, false
	}
	return false, true
}

// fallBack reports whether a request whose script failed with err is to
// be made again the Lua-free way: err is the server refusing the script
// (nothing ran), recorded, and mode says so. Otherwise it returns the
// error to report: err, or what mode returned.
func (p *protocol) fallBack(ctx context.Context, err error) (bool, error) {
	var re redis.Error
	if p.forced != ProtocolAuto || !redisproto.ScriptsDenied(err) || !errors.As(err, &re) {
		return false, err
	}
	p.learned.refuse(re)
	return p.mode(ctx)
}

// Protocol reports the protocol the Locker's requests take now,
// ProtocolScripts or ProtocolTair, and why, in words. Under ProtocolAuto,
// unless a refused script already told, it asks the server: one script
// that touches no key (EVAL "return 1" 0); a refusal is learned as a
// request's would be. A server that refuses scripts and lacks CAS and CAD
// is an error that says so.
func (l *Locker) Protocol(ctx context.Context) (Protocol, string, error) {
	if l == nil || l.b == nil {
		return 0, "", fmt.Errorf("%w: redislock.Locker.Protocol on a Locker without a client", dlock.ErrNilClient)
	}
	p := &l.b.proto
	tair, err := p.mode(ctx)
	if err == nil && !tair && p.forced == ProtocolAuto {
		if refusal, _ := p.learned.state(); refusal == nil {
			err = l.b.node.Client.Eval(ctx, "return 1", nil).Err()
			if err == nil {
				return ProtocolScripts, "the server runs this client's scripts", nil
			}
			if tair, err = p.fallBack(ctx, err); err != nil && !tair && !redisproto.ScriptsDenied(err) {
				err = fmt.Errorf("a script that touches no key: %w", err)
			}
		}
	}
	switch {
	case err != nil:
		return 0, "", requestError("protocol probe", "", err)
	case p.forced == ProtocolTair:
		return ProtocolTair, "forced by WithProtocol(ProtocolTair); the server offers CAS and CAD", nil
	case p.forced == ProtocolScripts:
		return ProtocolScripts, "forced by WithProtocol(ProtocolScripts)", nil
	case tair:
		return ProtocolTair, "the server refuses this client's user scripts and offers CAS and CAD (Lua-free: exclusive locks only)", nil
	}
	return ProtocolScripts, "the server runs this client's scripts", nil
}
