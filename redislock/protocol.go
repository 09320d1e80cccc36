package redislock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
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
	// tair: the server refused a script and offers CAS and CAD. denied:
	// it refused a script and lacks them (the refusal kept, to be
	// returned without sending another script).
	tair   bool
	denied error
}

func (l *learned) get() (tair bool, denied error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tair, l.denied
}

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

// tair reports whether requests go the Lua-free way, or the error that
// refuses every request (scripts refused, and no CAS/CAD).
func (p *protocol) tair() (bool, error) {
	switch p.forced {
	case ProtocolTair:
		return true, nil
	case ProtocolScripts:
		return false, nil
	}
	return p.learned.get()
}

// fallBack reports whether a request whose script failed with err is to
// be made again the Lua-free way: err is the server refusing the script
// (nothing ran) and refused says so. Otherwise it returns the error to
// report: err, or what refused returned.
func (p *protocol) fallBack(ctx context.Context, err error) (bool, error) {
	var re redis.Error
	if !redisproto.ScriptsDenied(err) || !errors.As(err, &re) {
		return false, err
	}
	tair, rerr := p.refused(ctx, re)
	if tair {
		return true, nil
	}
	if rerr == re {
		return false, err
	}
	return false, rerr
}

// refused handles a script the server refused (err, an ACL NOPERM):
// under ProtocolAuto it asks the server (once per client) whether it
// offers CAS and CAD, and reports true when requests are to go the
// Lua-free way from now on; otherwise it returns the error to report.
func (p *protocol) refused(ctx context.Context, err error) (bool, error) {
	if p.forced != ProtocolAuto {
		return false, err
	}
	l := p.learned
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.tair:
		return true, nil
	case l.denied != nil:
		return false, l.denied
	}
	ok, cerr := p.node.TairOffers(ctx)
	switch {
	case cerr != nil:
		// Unknown: the next refused script asks again.
		return false, fmt.Errorf("%w (and asking whether the server offers CAS and CAD failed: %w)", err, cerr)
	case ok:
		l.tair = true
		return true, nil
	}
	l.denied = fmt.Errorf("%w (and the server offers no CAS and CAD, Tair's commands, for redislock's Lua-free protocol)", err)
	return false, l.denied
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
	switch p.forced {
	case ProtocolTair:
		return ProtocolTair, "forced by WithProtocol(ProtocolTair)", nil
	case ProtocolScripts:
		return ProtocolScripts, "forced by WithProtocol(ProtocolScripts)", nil
	}
	tair, err := p.tair()
	if err == nil && !tair {
		err = l.b.node.Client.Eval(ctx, "return 1", nil).Err()
		if err == nil {
			return ProtocolScripts, "the server runs this client's scripts", nil
		}
		if tair, err = p.fallBack(ctx, err); err != nil {
			return 0, "", requestError("probe", "", err)
		}
	}
	switch {
	case err != nil:
		return 0, "", requestError("probe", "", err)
	case tair:
		return ProtocolTair, "the server refuses this client's user scripts and offers CAS and CAD (Lua-free: exclusive locks only)", nil
	}
	return ProtocolScripts, "the server runs this client's scripts", nil
}
