package dlock

import (
	"fmt"
	"os"
	"strconv"
	"time"
	"unicode/utf8"
)

// Defaults. The zero value of every setting means its default.
const (
	// DefaultTTL is the lease length when WithTTL is not given.
	DefaultTTL = 30 * time.Second
	// MinTTL is the shortest lease any backend accepts. Backends may
	// document a larger minimum of their own; none documents one above 500ms.
	MinTTL = 100 * time.Millisecond
	// MaxTTL is the longest lease any backend accepts: a week. A lease is
	// how long a crashed holder keeps everyone else out, so it stays short
	// and the watchdog renews it; the bound keeps every backend's
	// arithmetic (milliseconds, whole seconds, nanoseconds since 1970) far
	// from overflow.
	MaxTTL = 7 * 24 * time.Hour
	// MaxDriftFactor bounds WithDrift's factor (exclusive).
	MaxDriftFactor = 0.5
	// MaxKeyLen is the longest key, in bytes, every backend accepts.
	MaxKeyLen = 1024
	// MaxMetadataLen bounds the encoded size of a lock's metadata, in bytes.
	MaxMetadataLen = 4096
	// DefaultDriftFactor is the fraction of the TTL subtracted from a lease
	// for clock drift between client and server when computing the local
	// deadline (see Lock.Deadline). DefaultDriftMin is added to it.
	DefaultDriftFactor = 0.01
	// DefaultDriftMin is the fixed part of the drift allowance. Besides
	// clock drift it covers the local lateness of the timer that closes
	// Lost() on a loaded machine (measured: a few ms with thousands of
	// locks due at once on 2 busy cores).
	DefaultDriftMin = 10 * time.Millisecond
	// DefaultReleaseTimeout bounds Release when the caller's context is
	// already done, and the background release of a lost lock.
	DefaultReleaseTimeout = 5 * time.Second
)

// Metadata keys that dlock fills in automatically (unless
// WithoutDefaultMetadata).
const (
	MetaHost = "host"
	MetaPID  = "pid"
	// MetaAcquired is when the attempt that won the key was sent, in Unix
	// milliseconds by the holder's clock. Listings derive Holder.HeldFor
	// from it where the service keeps no acquisition time of its own.
	MetaAcquired = "acquired"
)

// Option configures one acquisition.
type Option func(*config)

// config is the resolved set of options for one acquisition.
type config struct {
	// TTL is the lease length. Zero means DefaultTTL.
	TTL time.Duration
	// Wait bounds how long Acquire waits, on top of its context. Zero means
	// wait until the context ends.
	Wait time.Duration
	// Backoff is the polling fallback between attempts while waiting. Nil
	// means DefaultBackoff. Backends that are notified of releases still
	// poll on this schedule so that a missed message never strands a waiter.
	Backoff Backoff
	// backoffDefault: Backoff is DefaultBackoff, filled in (not the
	// caller's).
	backoffDefault bool
	// Metadata is stored with the lock and shown to other clients (dlock ls,
	// NotAcquiredError). Host and pid are filled in unless NoDefaultMetadata.
	Metadata map[string]string
	// NoDefaultMetadata suppresses the automatic host, pid and acquired
	// metadata.
	NoDefaultMetadata bool
	// stampAcquired is set when Metadata[MetaAcquired] is dlock's own
	// stamp (not the caller's, nor suppressed): each attempt renews it.
	stampAcquired bool
	// NoAutoRefresh turns the watchdog off: the lock is then lost at its
	// local deadline unless the holder calls Refresh. Default: auto-refresh on.
	NoAutoRefresh bool
	// MaxHold caps the total time the lock is held, renewals included. Zero
	// means no cap.
	MaxHold time.Duration
	// DriftFactor and DriftMin form the clock-drift allowance subtracted
	// from every lease for the local deadline: TTL*DriftFactor + DriftMin.
	// Zero means DefaultDriftFactor and DefaultDriftMin.
	DriftFactor float64
	DriftMin    time.Duration

	ttlSet bool
	// releaseNotBefore: a lost lock's server-side lease is released no
	// sooner (RunOnce: atLeastFor); nil means at once.
	releaseNotBefore *time.Time

	// mode and limit: from WithShared (shared) and WithLimit (limited,
	// limit; modeErr: a bad limit), resolved by resolveMode.
	mode            Mode
	limit           int
	shared, limited bool
	modeErr         error
	// attempts counts the attempts of the acquisition (for Events).
	attempts int
	// callObs is the call's Observer (WithCallObserver), nil if none.
	callObs Observer
	// key is the key being acquired.
	key string
}

// WithTTL sets the lease length (default DefaultTTL; at least the
// backend's minimum, at most MaxTTL). With auto-refresh on, the lease is
// renewed every TTL/3, so the TTL is how long a crashed holder keeps others
// out.
func WithTTL(d time.Duration) Option { return func(c *config) { c.TTL = d; c.ttlSet = true } }

// WithWait bounds how long Acquire waits for a held key (default: until the
// context ends). TryAcquire ignores it.
func WithWait(d time.Duration) Option { return func(c *config) { c.Wait = d } }

// WithBackoff sets the polling fallback used between attempts while waiting.
func WithBackoff(b Backoff) Option { return func(c *config) { c.Backoff = b } }

// WithMetadata adds key=value metadata stored with the lock (merged with the
// automatic host, pid and acquired; a key given here wins, MetaAcquired
// included, and is stored as given on every attempt).
func WithMetadata(key, value string) Option {
	return func(c *config) {
		if c.Metadata == nil {
			c.Metadata = map[string]string{}
		}
		c.Metadata[key] = value
	}
}

// WithoutDefaultMetadata stops dlock from recording host, pid and acquired
// (listings then report HeldFor only where the service records it).
func WithoutDefaultMetadata() Option { return func(c *config) { c.NoDefaultMetadata = true } }

// WithAutoRefresh turns the watchdog on (the default) or off.
func WithAutoRefresh(on bool) Option { return func(c *config) { c.NoAutoRefresh = !on } }

// WithMaxHold caps the total hold time: once it is reached the lock is no
// longer renewed, Lost closes with an error wrapping ErrHoldCapReached and
// the lock is released.
func WithMaxHold(d time.Duration) Option { return func(c *config) { c.MaxHold = d } }

// WithDrift sets the clock-drift allowance: the local deadline of a lease
// is its start + TTL - (TTL*factor + min). factor must be in
// [0, MaxDriftFactor) and the allowance below half the TTL.
func WithDrift(factor float64, min time.Duration) Option {
	return func(c *config) { c.DriftFactor, c.DriftMin = factor, min }
}

// pid is MetaPID's value: the process's id, read once.
var pid = strconv.Itoa(os.Getpid())

var hostname = func() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}()

// newConfig applies opts, fills in defaults and validates the result and the
// key against minTTL (pass 0 for MinTTL); errors wrap ErrInvalidKey,
// ErrInvalidTTL or ErrInvalidOption.
func newConfig(key string, minTTL time.Duration, opts ...Option) (*config, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	c := &config{key: key}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	if minTTL <= 0 {
		minTTL = MinTTL
	}
	switch {
	case c.ttlSet && c.TTL <= 0:
		return nil, fmt.Errorf("%w: %v must be positive", ErrInvalidTTL, c.TTL)
	case c.TTL == 0:
		c.TTL = DefaultTTL
	case c.TTL < minTTL:
		return nil, fmt.Errorf("%w: %v is below the minimum %v", ErrInvalidTTL, c.TTL, minTTL)
	case c.TTL > MaxTTL:
		return nil, fmt.Errorf("%w: %v is above the maximum %v", ErrInvalidTTL, c.TTL, MaxTTL)
	}
	if c.TTL%time.Millisecond != 0 {
		c.TTL = c.TTL.Truncate(time.Millisecond)
	}
	if err := c.resolveMode(); err != nil {
		return nil, err
	}
	if c.Wait < 0 {
		return nil, fmt.Errorf("%w: wait %v is negative", ErrInvalidOption, c.Wait)
	}
	if c.MaxHold < 0 {
		return nil, fmt.Errorf("%w: max hold %v is negative", ErrInvalidOption, c.MaxHold)
	}
	// Written so that NaN fails too.
	if !(c.DriftFactor >= 0 && c.DriftFactor < MaxDriftFactor) || c.DriftMin < 0 || c.DriftMin >= c.TTL {
		return nil, fmt.Errorf("%w: drift factor %v must be in [0, %v) and drift min %v in [0, ttl %v)", ErrInvalidOption, c.DriftFactor, MaxDriftFactor, c.DriftMin, c.TTL)
	}
	if c.DriftFactor == 0 {
		c.DriftFactor = DefaultDriftFactor
	}
	if c.DriftMin == 0 {
		c.DriftMin = DefaultDriftMin
	}
	if c.MaxHold > 0 && c.MaxHold <= c.Drift() {
		return nil, fmt.Errorf("%w: max hold %v is not above the drift allowance %v", ErrInvalidOption, c.MaxHold, c.Drift())
	}
	if c.Drift() >= c.TTL/2 {
		return nil, fmt.Errorf("%w: drift allowance %v leaves too little of ttl %v", ErrInvalidOption, c.Drift(), c.TTL)
	}
	if c.Backoff == nil {
		c.Backoff, c.backoffDefault = DefaultBackoff, true
	}
	md := make(map[string]string, len(c.Metadata)+3)
	if !c.NoDefaultMetadata {
		md[MetaHost] = hostname
		md[MetaPID] = pid
		md[MetaAcquired] = acquiredNow()
	}
	_, userAcquired := c.Metadata[MetaAcquired]
	c.stampAcquired = !c.NoDefaultMetadata && !userAcquired
	size := 0
	for k, v := range c.Metadata {
		md[k] = v
	}
	for k, v := range md {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, fmt.Errorf("%w: metadata %q is not valid UTF-8", ErrInvalidOption, k)
		}
		size += len(k) + len(v)
	}
	if size > MaxMetadataLen {
		dflt := ""
		if !c.NoDefaultMetadata {
			dflt = " (host, pid and acquired included: WithoutDefaultMetadata leaves them out)"
		}
		return nil, fmt.Errorf("%w: metadata is %d bytes%s, more than %d", ErrInvalidOption, size, dflt, MaxMetadataLen)
	}
	c.Metadata = md
	return c, nil
}

// acquiredNow is MetaAcquired's value for an attempt sent now.
func acquiredNow() string { return strconv.FormatInt(time.Now().UnixMilli(), 10) }

// Drift is the clock-drift allowance for this config's TTL.
func (c *config) Drift() time.Duration {
	return time.Duration(float64(c.TTL)*c.DriftFactor) + c.DriftMin
}

// ValidateKey checks a key: 1 to MaxKeyLen bytes of valid UTF-8 without NUL.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key is %d bytes, more than the maximum %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key is not valid UTF-8", ErrInvalidKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] == 0 {
			return fmt.Errorf("%w: key contains a NUL byte", ErrInvalidKey)
		}
	}
	return nil
}
