package fencelock

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fencelock/fencelock/internal/store"
)

// Options configures a Locker: a zero field means its default, a nil *Options
// all defaults; New rejects the values it cannot honour with ErrInvalid.
type Options struct {
	// KeyPrefix begins every key: a lock is at KeyPrefix+"{"+name+"}". No '{' or '}'; default "lock:".
	KeyPrefix string
	// Owner names this Locker in its locks, for Inspect and BusyError: at most 200
	// bytes of printable UTF-8. Default: hostname and pid, "pod-2 (pid 7)".
	Owner string
	// TTL is how long Redis keeps a lock not extended, 10ms to 365 days. Default 30s.
	TTL time.Duration
	// MinRetryBackoff is a waiting Acquire's first pause, at least 1ms. Default 8ms.
	MinRetryBackoff time.Duration
	// MaxRetryBackoff caps the pause, at least MinRetryBackoff. Default max(256ms, MinRetryBackoff).
	MaxRetryBackoff time.Duration
	// ReleaseTimeout bounds Release and the clean-up after a failed Acquire, and is
	// how long a released token is remembered, at most 365 days. Default 5s.
	ReleaseTimeout time.Duration
	// FenceRetention is how long a fence counter outlives its last acquisition. Default 1h.
	FenceRetention time.Duration
	// RenewInterval is how often the watchdog extends a lease, shorter than the
	// TTL minus its drift allowance. Default: TTL/3.
	RenewInterval time.Duration
	// MaxHold caps how long the watchdog renews one lease. Default 0: no cap.
	MaxHold time.Duration
	// Replicas is how many replicas must acknowledge (WAIT) each acquisition and
	// extension ("Replicas and failover"). Default 0: do not wait.
	Replicas int
	// ReplicaTimeout bounds each WAIT, below a third of the TTL. Default 100ms with Replicas.
	ReplicaTimeout time.Duration
	// ReplicaFsync waits with WAITAOF instead (Redis 7.2+, appendonly yes; an
	// older server fails acquisitions with ErrMisconfigured). Default false.
	ReplicaFsync bool
	// AttemptTimeout bounds an Acquire attempt's wait for a reply, at least 1ms. Default 1s.
	AttemptTimeout time.Duration
	// FailOpen makes RunWithLock run its work degraded when Redis is unavailable
	// at acquisition (Degraded runs). Default false: fail closed, ErrUnavailable.
	FailOpen bool
	// Logger gets acquired, not obtained and released at Debug, a failed renewal
	// at Warn, a lost lease and a fail-open run at Error. Default: discard.
	Logger *slog.Logger
	// Observer, if set, is told of every call, renewal and loss.
	Observer Observer
	// OnLost, if set, is called once per lease lost (also found not held as RunWithLock's
	// work returned), with a cause matching ErrLost, after its context was cancelled, on
	// the watchdog's, RunWithLock's or its release's goroutine: it must not block long nor
	// call Release.
	OnLost func(lease *Lease, cause error)
	// Clock is the library's local time, for tests (not a ctx's deadline, nor the idle timer
	// that ends a spare worker goroutine). Default: the system's.
	Clock Clock
}

// Clock is a source of local time. Now must never go back, and a timer from
// NewTimer(d), or reset to d, must not fire before d has passed: every loop
// of the library then waits at each turn, however Now runs.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) *time.Timer
}

type systemClock struct{} // the default Clock

func (systemClock) Now() time.Time                       { return time.Now() }
func (systemClock) NewTimer(d time.Duration) *time.Timer { return time.NewTimer(d) }

// Defaults.
const (
	defaultKeyPrefix       = "lock:"
	defaultTTL             = 30 * time.Second
	defaultMinRetryBackoff = 8 * time.Millisecond
	defaultMaxRetryBackoff = 256 * time.Millisecond
	defaultReleaseTimeout  = 5 * time.Second
	defaultFenceRetention  = time.Hour
	defaultReplicaTimeout  = 100 * time.Millisecond
	defaultAttemptTimeout  = time.Second

	minTTL = 10 * time.Millisecond
	maxTTL = 365 * 24 * time.Hour
)

// withDefaults returns a copy of o with every zero field set to its default,
// or an error wrapping ErrInvalid.
func (o *Options) withDefaults() (Options, error) {
	var out Options
	if o != nil {
		out = *o
	}
	orDefault(&out.KeyPrefix, defaultKeyPrefix)
	if strings.ContainsAny(out.KeyPrefix, "{}") {
		return out, invalidf("KeyPrefix %q contains '{' or '}'", out.KeyPrefix)
	}
	if out.Owner == "" {
		out.Owner = defaultOwner()
	} else if err := checkOwner("Options.Owner", out.Owner); err != nil {
		return out, err
	}
	orDefault(&out.TTL, defaultTTL)
	if err := checkDuration("Options.TTL", out.TTL, minTTL, maxTTL); err != nil {
		return out, err
	}
	orDefault(&out.MinRetryBackoff, defaultMinRetryBackoff)
	if out.MaxRetryBackoff == 0 {
		out.MaxRetryBackoff = max(defaultMaxRetryBackoff, out.MinRetryBackoff)
	}
	if out.MinRetryBackoff < time.Millisecond {
		return out, invalidf("MinRetryBackoff %v is less than 1ms", out.MinRetryBackoff)
	}
	if out.MaxRetryBackoff < out.MinRetryBackoff {
		return out, invalidf("MaxRetryBackoff %v is less than MinRetryBackoff %v", out.MaxRetryBackoff, out.MinRetryBackoff)
	}
	orDefault(&out.ReleaseTimeout, defaultReleaseTimeout)
	if out.ReleaseTimeout < 0 {
		return out, invalidf("ReleaseTimeout %v is negative", out.ReleaseTimeout)
	}
	if out.ReleaseTimeout > maxTTL { // a released token's marker PX, and Close's wait
		return out, invalidf("ReleaseTimeout %v is longer than the maximum %v", out.ReleaseTimeout, maxTTL)
	}
	orDefault(&out.AttemptTimeout, defaultAttemptTimeout)
	if err := checkDuration("AttemptTimeout", out.AttemptTimeout, time.Millisecond, maxTTL); err != nil {
		return out, err
	}
	orDefault(&out.FenceRetention, defaultFenceRetention)
	if err := checkDuration("FenceRetention", out.FenceRetention, time.Millisecond, maxTTL); err != nil {
		return out, err
	}
	if out.Replicas < 0 {
		return out, invalidf("Replicas %d is negative", out.Replicas)
	}
	if out.ReplicaTimeout < 0 {
		return out, invalidf("ReplicaTimeout %v is negative", out.ReplicaTimeout)
	}
	if out.Replicas > 0 {
		orDefault(&out.ReplicaTimeout, defaultReplicaTimeout)
		if out.ReplicaTimeout < time.Millisecond {
			return out, invalidf("ReplicaTimeout %v is less than 1ms (WAIT's unit; 0 would wait for ever)", out.ReplicaTimeout)
		}
		if err := checkReplicaTimeout(out.ReplicaTimeout, out.TTL, "Options.TTL"); err != nil {
			return out, err
		}
	}
	if out.ReplicaFsync && out.Replicas == 0 {
		return out, invalidf("ReplicaFsync without Replicas")
	}
	if out.RenewInterval < 0 {
		return out, invalidf("RenewInterval %v is negative", out.RenewInterval)
	}
	if err := checkRenewInterval(out.RenewInterval, out.TTL); err != nil {
		return out, err
	}
	if out.MaxHold < 0 {
		return out, invalidf("MaxHold %v is negative", out.MaxHold)
	}
	orDefault[Clock](&out.Clock, systemClock{})
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

// Option changes one Acquire call.
type Option func(callOptions) callOptions

// callOptions holds what one call's Options set, by value: nothing escapes.
type callOptions struct {
	ttl      time.Duration
	ttlSet   bool
	wait     time.Duration
	owner    string
	ownerSet bool
	fair     bool
	open     bool // WithFailOpen's value
	openSet  bool
	kind     kind // what is acquired; nil: the lock of the name (see withKind)
}

// withKind makes a call acquire a lease of k instead of the name's lock.
func withKind(k kind) Option {
	return func(c callOptions) callOptions { c.kind = k; return c }
}

// WithOwner sets who holds the lock for this call, overriding Options.Owner.
func WithOwner(owner string) Option {
	return func(c callOptions) callOptions { c.owner, c.ownerSet = owner, true; return c }
}

// WithFailOpen overrides Options.FailOpen for this call, Acquire's too: with
// open true, an Acquire on an outage returns a degraded Lease and a nil error.
// Without it, Acquire fails closed.
func WithFailOpen(open bool) Option {
	return func(c callOptions) callOptions { c.open, c.openSet = open, true; return c }
}

// opens reports whether the call fails open, given Options.FailOpen.
func (c callOptions) opens(failOpen bool) bool {
	if c.openSet {
		return c.open
	}
	return failOpen
}

func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown host"
	}
	owner := host + " (pid " + strconv.Itoa(os.Getpid()) + ")"
	if checkOwner("", owner) != nil {
		return "pid " + strconv.Itoa(os.Getpid())
	}
	return owner
}

const maxOwner = 200 // the longest owner stored with a lock, in bytes

func checkOwner(what, owner string) error {
	switch {
	case owner == "":
		return invalidf("%s is empty", what)
	case len(owner) > maxOwner:
		return invalidf("%s is longer than %d bytes", what, maxOwner)
	case !utf8.ValidString(owner):
		return invalidf("%s %q is not valid UTF-8", what, owner)
	}
	for _, r := range owner {
		if !unicode.IsPrint(r) {
			return invalidf("%s %q contains a character that is not printable", what, owner)
		}
	}
	return nil
}

// WithTTL sets the lock's time to live for this call, overriding Options.TTL:
// Acquire rejects with ErrInvalid a ttl that Options.TTL could not be.
func WithTTL(ttl time.Duration) Option {
	return func(c callOptions) callOptions { c.ttl, c.ttlSet = ttl, true; return c }
}

// WithWait makes Acquire wait up to d for a busy lock ("Waiting"); an attempt
// in flight when d runs out is waited for, bounded by ctx, and its lease
// returned if it got the lock. Zero means try once; a negative d is ErrInvalid.
func WithWait(d time.Duration) Option {
	return func(c callOptions) callOptions { c.wait = d; return c }
}

// WithFair makes a waiting Acquire (WithWait) wait in line for a release to
// hand it the lock ("How fair waiting works"); without WithWait it changes
// nothing. A NewRedlock Locker rejects it with ErrInvalid.
func WithFair() Option {
	return func(c callOptions) callOptions { c.fair = true; return c }
}

func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// drift is the clock drift and network allowance a lease's deadline subtracts.
func drift(ttl time.Duration) time.Duration { return store.Drift(ttl) }

func checkDuration(what string, d, lo, hi time.Duration) error {
	switch {
	case d <= 0:
		return invalidf("%s %v must be positive", what, d)
	case d < lo:
		return invalidf("%s %v is shorter than the minimum %v", what, d, lo)
	case d > hi:
		return invalidf("%s %v is longer than the maximum %v", what, d, hi)
	}
	return nil
}

func checkReplicaTimeout(timeout, ttl time.Duration, what string) error {
	if timeout >= ttl/3 {
		return invalidf("ReplicaTimeout %v is not shorter than a third of %s %v", timeout, what, ttl)
	}
	return nil
}

func (o *Options) renewInterval(ttl time.Duration) time.Duration {
	if o.RenewInterval != 0 {
		return o.RenewInterval
	}
	return ttl / 3
}

func checkRenewInterval(interval, ttl time.Duration) error {
	if interval != 0 && interval >= ttl-drift(ttl) {
		return invalidf("RenewInterval %v is not shorter than TTL %v minus its drift allowance", interval, ttl)
	}
	return nil
}

// checkCallTTL checks a ttl given to one call (WithTTL, Extend) against o.
func (o *Options) checkCallTTL(what string, ttl time.Duration) error {
	if err := checkDuration(what, ttl, minTTL, maxTTL); err != nil {
		return err
	}
	if err := checkRenewInterval(o.RenewInterval, ttl); err != nil {
		return err
	}
	if o.Replicas > 0 {
		return checkReplicaTimeout(o.ReplicaTimeout, ttl, what)
	}
	return nil
}

// ttlMillis is the TTL sent to Redis, rounded up to whole milliseconds.
func ttlMillis(ttl time.Duration) int64 { return store.Millis(ttl) }

func checkName(name string) error {
	if name == "" {
		return invalidf("empty lock name")
	}
	if strings.ContainsAny(name, "{}") {
		return invalidf("lock name %q contains '{' or '}'", name)
	}
	return nil
}

// callOptions checks a call for name and applies opts: ErrInvalid, ErrClosed.
func (l *Locker) callOptions(name string, opts []Option) (callOptions, error) {
	if err := l.usable(); err != nil {
		return callOptions{}, err
	}
	co := callOptions{ttl: l.opts.TTL, kind: l.lock}
	if err := checkName(name); err != nil {
		return co, err
	}
	for _, opt := range opts {
		if opt == nil {
			return co, invalidf("nil Option")
		}
		co = opt(co)
	}
	if co.ttlSet {
		if err := l.opts.checkCallTTL("WithTTL", co.ttl); err != nil {
			return co, err
		}
	}
	if co.wait < 0 {
		return co, invalidf("WithWait %v is negative", co.wait)
	}
	if co.ownerSet {
		if err := checkOwner("WithOwner", co.owner); err != nil {
			return co, err
		}
	}
	if co.fair && co.kind.queued == nil {
		return co, invalidf("WithFair on a NewRedlock Locker: a queue kept on a quorum of nodes would need consensus")
	}
	if l.isClosed() {
		return co, closedError(name, nil)
	}
	return co, nil
}

// outage reports whether a fail-open call runs degraded after err.
func outage(ctx context.Context, err error) bool {
	return errors.Is(err, ErrUnavailable) && ctx.Err() == nil
}

// degraded returns and logs the fail-open stand-in for a lease of name.
func (l *Locker) degraded(ctx context.Context, name string, co callOptions, err error) *Lease {
	l.opts.Logger.LogAttrs(ctx, slog.LevelError, "fencelock: redis unavailable, running without the lock (fail-open)",
		slog.String("lock", name), slog.Any("error", err))
	spec := l.spec(name, co)
	lease := l.leaseOf(spec, co.kind.lease(spec))
	lease.degraded = true
	return lease
}

// openEnd is when a fail-open call stops waiting for an outage: half-way to ctx's deadline.
func (l *Locker) openEnd(ctx context.Context, open bool, start time.Time) time.Time {
	if dl, ok := ctx.Deadline(); ok && open {
		return start.Add(time.Until(dl) / 2) // real time, as ctx's deadline
	}
	return start.Add(forever)
}

// forever is further off than any lock's TTL or any call's wait.
const forever = 10 * maxTTL
