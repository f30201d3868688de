package fencelock

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Options configures a Locker. The zero value of every field means its
// default; New applies the defaults in one place and rejects values it cannot
// honour with ErrInvalid. A nil *Options means all defaults.
type Options struct {
	// KeyPrefix is prepended to every lock name: the lock for name is stored
	// at KeyPrefix+"{"+name+"}", a hash tag its other keys share. It must not
	// contain '{' or '}'. Default "lock:".
	KeyPrefix string

	// Owner says who this Locker is: it is stored with every lock it takes,
	// shown by Locker.Inspect and the fencelock command, and named in the
	// ErrNotObtained of another Acquire. At most 200 bytes of printable
	// UTF-8; WithOwner overrides it per call. Default: the hostname and the
	// process id, "pod-2 (pid 7)".
	Owner string

	// TTL is how long Redis keeps a lock that is not extended or released.
	// It must be at least 10ms (below that, a lease's local deadline leaves
	// no time for a renewal's round trip) and at most 365 days. Acquire's
	// WithTTL overrides it per call. Default 30s.
	TTL time.Duration

	// MinRetryBackoff is the first pause between two attempts of an Acquire
	// that waits (WithWait); the pause doubles after each busy attempt up to
	// MaxRetryBackoff, jittered (GUARANTEES.md, "Waiting"). It must be at
	// least 1ms. Default 8ms.
	MinRetryBackoff time.Duration

	// MaxRetryBackoff caps the pause between two attempts of an Acquire that
	// waits; on a Redlock it also sets the pauses of a call in line and how
	// long its entry there lives ("How Redlock works"). It must not be
	// smaller than MinRetryBackoff. Default 256ms.
	MaxRetryBackoff time.Duration

	// ReleaseTimeout bounds the Redis calls that give a lock back (Release,
	// and the clean-up after an Acquire whose outcome is unknown), which run
	// on a context not cancelled with the caller's; a released lease's token
	// is remembered in Redis as long, so that a release resent by go-redis
	// after a lost reply reports what the first one did. Default 5s.
	ReleaseTimeout time.Duration

	// FenceRetention is how long a lock name's fence counter is kept after
	// the name's last acquisition; as fences are floored by the server's
	// clock, it only has to outlast the largest step back of that clock
	// ("Fencing tokens"). A longer retention costs one small key per name
	// acquired within it. Default 1h.
	FenceRetention time.Duration

	// RenewInterval is how often the watchdog (Lease.KeepAlive and
	// RunWithLock) extends a lease while its work runs. It must be shorter
	// than the TTL minus its drift allowance. Default: a third of the
	// lease's TTL.
	RenewInterval time.Duration

	// MaxHold caps how long the watchdog keeps renewing one lease, so that a
	// hung (not crashed) holder cannot keep the lock forever: past it the
	// work context is cancelled with ErrLost at the lease's deadline, within
	// one TTL. Set it to the longest the work may legitimately take. Default
	// 0: no cap.
	MaxHold time.Duration

	// Replicas is how many replicas must acknowledge an acquisition or an
	// extension before it counts (WAIT, on the connection that ran the
	// script). An acquisition acknowledged by fewer is given back and
	// Acquire returns ErrUnavailable ("k of n replicas acknowledged"); an
	// extension acknowledged by fewer does not move Deadline. An answer that
	// wrote no lock (busy; not held) stands whatever WAIT says. See
	// "Replicas and failover". 0, the default: do not wait.
	Replicas int

	// ReplicaTimeout bounds each WAIT. It must be shorter than a third of the
	// TTL (the watchdog renews at that interval, and each renewal waits for
	// it too). Default 100ms; used only when Replicas is positive.
	ReplicaTimeout time.Duration

	// ReplicaFsync makes the wait WAITAOF (Redis 7.2 and later, with
	// appendonly yes): the lock must be written to the append-only file of
	// the master and of Replicas replicas, not only be in their memory. On
	// an older server every acquisition fails with ErrMisconfigured. Default
	// false.
	ReplicaFsync bool

	// AttemptTimeout bounds how long one attempt of an Acquire waits for its
	// reply, whatever the go-redis client's options: past it the attempt
	// counts as Redis unavailable ("no reply within AttemptTimeout"), and a
	// wait (WithWait) tries again. An attempt of a fail-open call also ends
	// at half the time left before its context's deadline. An attempt runs
	// on the caller's goroutine on a Redlock, and with ContextTimeoutEnabled
	// and a context that is never cancelled (context.Background()); else on
	// one of its own, so that it is bounded so whatever go-redis does. It
	// must be at least 1ms. Default 1s (why: "Deadlines and the watchdog").
	AttemptTimeout time.Duration

	// FailOpen decides in advance what RunWithLock does when Redis is
	// unavailable at acquisition: false (the default, fail-closed) returns
	// ErrUnavailable without running the work; true runs the work without
	// the lock, on a degraded Lease (Degraded true, Fence 0), logged at
	// Error level. WithFailOpen overrides it per call, and makes Acquire
	// fail open too. Choose fail-open only where running the work twice is
	// acceptable, or where the resource's own checks make it safe ("Fail-open
	// and degraded runs").
	FailOpen bool

	// Logger receives the library's events: acquired, not obtained and
	// released at Debug level, a failed renewal at Warn, a lost lease and a
	// fail-open run at Error, each with the lock name, the fence and
	// timings. Default: discard.
	Logger *slog.Logger

	// Observer, if set, is told of every Acquire, Release and RunWithLock,
	// renewal and loss, for metrics and traces (see Observer). Default nil.
	Observer Observer

	// OnLost, if set, is called once for each lease lost (see KeepAlive),
	// after the work context was cancelled, with the cause (which matches
	// ErrLost); also when RunWithLock finds the loss only as its work returns.
	// It runs on the watchdog's goroutine, or RunWithLock's, and must not
	// block for long nor call the lease's Release. Default nil.
	OnLost func(lease *Lease, cause error)

	// Clock is the local time source for lease deadlines, the watchdog's
	// timers and the pauses of a wait; replace it only to test a local clock
	// that runs fast or slow. Default: the system's monotonic clock.
	Clock Clock
}

// Clock is a source of local time. Now must never go back, and a timer from
// NewTimer(d), or reset to d, must not fire before d has passed: every loop
// of the library waits at each turn on such a timer or on Redis, so no such
// Clock can make one spin, however its Now runs.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) *time.Timer
}

type systemClock struct{}

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
	if out.KeyPrefix == "" {
		out.KeyPrefix = defaultKeyPrefix
	}
	if strings.ContainsAny(out.KeyPrefix, "{}") {
		return out, invalidf("KeyPrefix %q contains '{' or '}'", out.KeyPrefix)
	}
	if out.Owner == "" {
		out.Owner = defaultOwner()
	} else if err := checkOwner("Options.Owner", out.Owner); err != nil {
		return out, err
	}
	if out.TTL == 0 {
		out.TTL = defaultTTL
	}
	if err := checkTTL("Options.TTL", out.TTL); err != nil {
		return out, err
	}
	if out.MinRetryBackoff == 0 {
		out.MinRetryBackoff = defaultMinRetryBackoff
	}
	if out.MaxRetryBackoff == 0 {
		out.MaxRetryBackoff = max(defaultMaxRetryBackoff, out.MinRetryBackoff)
	}
	if out.MinRetryBackoff < time.Millisecond {
		return out, invalidf("MinRetryBackoff %v is less than 1ms", out.MinRetryBackoff)
	}
	if out.MaxRetryBackoff < out.MinRetryBackoff {
		return out, invalidf("MaxRetryBackoff %v is less than MinRetryBackoff %v", out.MaxRetryBackoff, out.MinRetryBackoff)
	}
	if out.ReleaseTimeout == 0 {
		out.ReleaseTimeout = defaultReleaseTimeout
	}
	if out.ReleaseTimeout < 0 {
		return out, invalidf("ReleaseTimeout %v is negative", out.ReleaseTimeout)
	}
	if out.AttemptTimeout == 0 {
		out.AttemptTimeout = defaultAttemptTimeout
	}
	if err := checkDuration("AttemptTimeout", out.AttemptTimeout, time.Millisecond, maxTTL); err != nil {
		return out, err
	}
	if out.FenceRetention == 0 {
		out.FenceRetention = defaultFenceRetention
	}
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
		if out.ReplicaTimeout == 0 {
			out.ReplicaTimeout = defaultReplicaTimeout
		}
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
	if out.Clock == nil {
		out.Clock = systemClock{}
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out, nil
}

// Option changes one Acquire call.
type Option func(callOptions) callOptions

// Options are applied to a callOptions passed by value, so that nothing
// escapes to the heap.

// callOptions holds what the Options of one call set; zero means "not set".
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

// withKind makes a call acquire a lease of k instead of the lock of the
// name: how a Semaphore or an RWLock reuses Acquire and RunWithLock.
func withKind(k kind) Option {
	return func(c callOptions) callOptions { c.kind = k; return c }
}

// WithOwner sets who holds the lock for this call, overriding
// Options.Owner (see there).
func WithOwner(owner string) Option {
	return func(c callOptions) callOptions { c.owner, c.ownerSet = owner, true; return c }
}

// WithFailOpen decides for this call what happens when Redis is unavailable
// at acquisition, overriding Options.FailOpen: with open true, RunWithLock
// runs its work on a degraded Lease, and Acquire returns a degraded Lease
// (Degraded true, Fence 0, nothing to extend or release) and a nil error,
// logged at Error level; with open false, both return the ErrUnavailable.
// Without it, Acquire fails closed and RunWithLock follows Options.FailOpen.
// A busy lock, a refusal (ErrMisconfigured) or a context that ended first
// never opens.
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

// defaultOwner is the hostname and the process id.
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

// maxOwner is the longest owner stored with a lock, in bytes.
const maxOwner = 200

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

// WithTTL sets the lock's time to live for this call, overriding Options.TTL.
// It must be at least 10ms and at most 365 days; Acquire rejects other values
// with ErrInvalid.
func WithTTL(ttl time.Duration) Option {
	return func(c callOptions) callOptions { c.ttl, c.ttlSet = ttl, true; return c }
}

// WithWait makes Acquire wait up to d for a busy lock instead of trying once.
// d bounds the waiting between attempts, not an attempt in flight: an attempt
// that started before d ran out is waited for, bounded by the caller's
// context, and its lease is returned if it got the lock. The wait also ends
// with the caller's context. Zero means try once; a negative d is rejected
// with ErrInvalid.
func WithWait(d time.Duration) Option {
	return func(c callOptions) callOptions { c.wait = d; return c }
}

// WithFair makes a waiting Acquire (WithWait) wait in line: fair waiters of
// a lock are served in the order their first attempts reached Redis, and a
// release hands the lock straight to the first one, fence and all, so that
// it holds the lock when the release's message arrives (GUARANTEES.md, "How
// fair waiting works"). A plain Acquire of a lock with fair waiters in line
// does not jump the queue: it finds the lock busy until the queue is empty.
// Without WithWait, WithFair changes nothing. A NewRedlock Locker rejects
// WithFair with ErrInvalid.
func WithFair() Option {
	return func(c callOptions) callOptions { c.fair = true; return c }
}

// drift is the clock drift and network allowance subtracted from a TTL when
// computing a lease's local deadline (the Redis distlock formula).
func drift(ttl time.Duration) time.Duration {
	return ttl/100 + 2*time.Millisecond
}

func checkTTL(what string, ttl time.Duration) error {
	return checkDuration(what, ttl, minTTL, maxTTL)
}

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

// renewInterval returns the watchdog's interval for a lease with ttl.
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

// ttlMillis is the TTL sent to Redis: rounded up to whole milliseconds, so the
// server never holds the lock for less time than the local deadline assumes.
func ttlMillis(ttl time.Duration) int64 {
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}
