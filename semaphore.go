package fencelock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
)

// A Semaphore lets at most its number of permits hold a name at once, each
// permit an ordinary Lease with fences increasing across all of them
// ("Semaphores"). It is safe for concurrent use.
type Semaphore struct {
	l       *Locker
	d       *deployment // where the permits are kept
	name    string
	permits int
	err     error // why its calls fail with no Redis call (ErrInvalid); nil when usable

	keys       [keys.N]string // its leases' keys, but the token marker
	keyArgs    [keys.N]any    // keys, boxed once
	marker     string         // the token markers' prefix, P{name}:sem:t:
	info       any            // the info key, P{name}:sem:h, boxed
	permitsArg any
	// wakeWindow is how long, in ms, the releases after a plain waiter
	// found all permits taken publish a wake-up: longer than its pause
	// (MaxRetryBackoff at most) and its next attempt (AttemptTimeout).
	wakeWindow any
}

var _ ownKeys = (*Semaphore)(nil)

// Semaphore returns the semaphore called name with permits permits, making no
// Redis call. Its calls fail with ErrInvalid, with no Redis call, for a bad
// name, permits < 1, and on a NewRedlock Locker ("Semaphores").
func (l *Locker) Semaphore(name string, permits int) *Semaphore {
	s := &Semaphore{l: l, name: name, permits: permits, permitsArg: strconv.Itoa(permits)}
	if s.err = l.usable(); s.err != nil {
		return s
	}
	if s.err = checkName(name); s.err != nil {
		return s
	}
	if permits < 1 {
		s.err = invalidf("semaphore %q: permits %d is less than 1", name, permits)
		return s
	}
	switch b := l.b.(type) {
	case *deployment:
		s.d = b
	case *quorum:
		// GUARANTEES.md ("Semaphores"): a quorum semaphore would be safe
		// only if every node had to grant each permit.
		s.err = invalidf("semaphore %q on a NewRedlock Locker: its %d nodes would each count holders on their own, "+
			"so up to %d holders (nodes × permits / quorum) could each win a quorum; use New", name, len(b.nodes), len(b.nodes)*permits/b.n)
		return s
	default:
		s.err = invalidf("semaphore %q: not on a Locker of New", name)
		return s
	}
	// P{name}:sem and the keys after it: the lock's hash tag, none of the
	// lock's keys (P{name}, P{name}:fence, P{name}:t:<token>, P{name}:q,
	// P{name}:qi).
	base := l.opts.KeyPrefix + "{" + name + "}:sem"
	s.keys[keys.LockKey] = base
	s.keys[keys.CounterKey] = base + ":fence"
	s.keys[keys.QueueKey] = base + ":q"
	s.keys[keys.QueueInfoKey] = base + ":qi"
	for i, k := range s.keys {
		s.keyArgs[i] = k
	}
	s.marker, s.info = base+":t:", base+":h"
	s.wakeWindow = ttlMillis(l.opts.MaxRetryBackoff + l.opts.AttemptTimeout)
	return s
}

// Acquire takes one permit and returns its Lease, as Locker.Acquire takes a
// lock, with its options and errors (after an error, what its attempts may
// have taken is given back in the background, as there). All
// permits taken is a *BusyError; holders using another number of permits
// make it fail with ErrMisconfigured until none of them is left.
func (s *Semaphore) Acquire(ctx context.Context, opts ...Option) (*Lease, error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	return s.l.Acquire(ctx, s.name, s.with(opts)...)
}

// RunWithLock runs work holding one permit, taken as Acquire takes it, as
// Locker.RunWithLock does with a lock, with its errors.
func (s *Semaphore) RunWithLock(ctx context.Context, work func(ctx context.Context, lease *Lease) error, opts ...Option) error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.l.RunWithLock(ctx, s.name, work, s.with(opts)...)
}

func (s *Semaphore) usable() error {
	if s == nil {
		return invalidf("nil Semaphore")
	}
	return s.err
}

// with returns opts and the option that makes a call take a permit of s, in
// a slice of their own.
func (s *Semaphore) with(opts []Option) []Option {
	return append(opts[:len(opts):len(opts)], withKind(s))
}

// setKeys gives lease the semaphore's keys in place of the lock's.
func (s *Semaphore) setKeys(lease *Lease) {
	lease.keys, lease.keyArgs = s.keys, s.keyArgs
	lease.keys[keys.MarkerKey] = s.marker + lease.token
	lease.keyArgs[keys.MarkerKey] = lease.keys[keys.MarkerKey]
}

// allKeys returns the KEYS of the acquire and release scripts for lease.
func (s *Semaphore) allKeys(lease *Lease) []any {
	return append(lease.keyArgs[:keys.N:keys.N], s.info)
}

// The semaphore's scripts, each declared by the method that runs it, run
// after prelude.lua and semaphore_prelude.lua.

func (s *Semaphore) acquire(ctx context.Context, lease *Lease) attempt {
	fair := "0"
	if lease.fair {
		fair = "1"
	}
	reply, err := s.d.run(ctx, script.SemAcquire, false, s.allKeys(lease), lease.tokenArg,
		s.d.l.ttlArg(lease.ttl), s.d.l.retentionMillis, lease.ownerArg, fair, queueEntryMillis, s.permitsArg, s.wakeWindow)
	return s.d.attempted(ctx, lease, reply, err, s.attemptOf(reply))
}

// attemptOf is the attempt of semaphore_acquire.lua's reply, as
// acquireAttempt is a lock's.
func (s *Semaphore) attemptOf(reply any) attempt {
	r, err := s.decodeAcquire(reply)
	if r.pttl < 0 { // a permit is free, but fair waiters are in line first
		return attempt{pttl: -3, owner: "fair waiters in line"}
	}
	return attempt{ok: r.ok, fence: r.fence, pttl: r.pttl, owner: r.owner, holders: r.holders, err: err}
}

// semAcquireReply is semaphore_acquire.lua's reply.
type semAcquireReply struct {
	ok      bool
	fence   int64
	pttl    time.Duration // of the first permit to expire; -3: free, fair waiters first
	holders int
	owner   string // the first permit's to expire
}

// decodeAcquire decodes semaphore_acquire.lua's reply: {0, pttl, holders,
// owner}, {3, permits} for holders with another number of permits, which
// reads as an error, or, as decodeAcquire reads a lock's, {1, fence} or {2}.
func (s *Semaphore) decodeAcquire(reply any) (semAcquireReply, error) {
	arr, _ := reply.([]any)
	var flag int64
	if len(arr) > 0 {
		flag, _ = arr[0].(int64)
	}
	switch {
	case flag == 0 && len(arr) == 4:
		pttl, ok1 := arr[1].(int64)
		n, ok2 := arr[2].(int64)
		owner, ok3 := arr[3].(string)
		if ok1 && ok2 && ok3 {
			return semAcquireReply{pttl: time.Duration(pttl) * time.Millisecond, holders: int(n), owner: owner}, nil
		}
	case flag == 1 || flag == 2:
		ok, fence, _, err := decodeAcquire(reply)
		return semAcquireReply{ok: ok, fence: fence}, err
	case flag == 3 && len(arr) == 2:
		used, _ := arr[1].(string)
		if n, err := strconv.Atoi(used); err == nil {
			return semAcquireReply{}, &permitsError{name: s.name, used: n, want: s.permits}
		}
	}
	return semAcquireReply{}, fmt.Errorf("%w from the semaphore's acquire script: %v", errReply, reply)
}

// A permitsError is an Acquire whose Semaphore has another number of
// permits than the name's holders use.
type permitsError struct {
	name       string
	used, want int
}

func (e *permitsError) Error() string {
	return fmt.Sprintf("%s: semaphore %q is held with %d permits, this Semaphore has %d: "+
		"give every Semaphore of a name one number (a new one counts once no holder is left)",
		ErrMisconfigured.Error(), e.name, e.used, e.want)
}

// Is reports whether target is ErrMisconfigured.
func (e *permitsError) Is(target error) bool { return target == ErrMisconfigured }

func (s *Semaphore) extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error) {
	reply, err := s.d.run(ctx, script.SemExtend, renewal, []any{lease.keyArgs[keys.LockKey], s.info}, lease.tokenArg, s.d.l.ttlArg(ttl))
	return decodeExtend(script.SemExtend, reply, err)
}

func (s *Semaphore) release(ctx context.Context, lease *Lease, mode string) (int64, error, error) {
	return s.d.releaseKind(ctx, script.SemRelease, s.allKeys(lease), lease, s.d.channelArg(lease), mode, s.d.l.retentionMillis)
}

func (s *Semaphore) queue(ctx context.Context, lease *Lease, ttl time.Duration, mode string) (queueReply, error) {
	reply, err := evalScript(ctx, s.d.client, script.SemQueue, false,
		[]any{lease.keyArgs[keys.LockKey], lease.keyArgs[keys.QueueKey], lease.keyArgs[keys.QueueInfoKey], s.info},
		[]any{lease.tokenArg, mode, queueEntryMillis, s.d.l.ttlArg(ttl), lease.ownerArg, s.permitsArg}).Slice()
	if err != nil {
		return queueReply{}, err
	}
	return decodeQueue(reply)
}

// holding reads lease's permit for Lease.TTL: its value as a lock's,
// "<token> <fence> <owner>", or "" when it holds none.
func (s *Semaphore) holding(ctx context.Context, lease *Lease) (holding, error) {
	r, err := s.read(ctx)
	if err != nil {
		return holding{}, err
	}
	for _, h := range r.holders {
		if h.Token == lease.token {
			return holding{value: h.Token + " " + strconv.FormatInt(h.Fence, 10) + " " + h.Owner, pttl: h.TTL}, nil
		}
	}
	return holding{}, nil
}

// SemaphoreInfo is what Semaphore.Inspect found about a semaphore.
type SemaphoreInfo struct {
	Name      string
	Permits   int          // the number the holders use; the Semaphore's own when none holds one
	Holders   []HolderInfo // the permits held, oldest fence first
	LastFence int64        // the last fence issued, kept as LockInfo.LastFence is
	Waiters   int          // how many Lockers wait for a permit, counted as LockInfo.Waiters is
}

// HolderInfo is one holder of a semaphore's permit.
type HolderInfo struct {
	Token string        // the holder's Lease.Token
	Owner string        // its Options.Owner or WithOwner
	TTL   time.Duration // left on the server
	Fence int64
}

// Inspect reads the semaphore without changing it (see SemaphoreInfo). It
// returns ErrInvalid as Acquire does, ErrUnavailable or ErrMisconfigured, or
// an error matching ctx.Err().
func (s *Semaphore) Inspect(ctx context.Context) (SemaphoreInfo, error) {
	if err := s.usable(); err != nil {
		return SemaphoreInfo{}, err
	}
	var r semRead // set by the read, read only once it returned
	h, err := s.l.read(ctx, s.name, fmt.Sprintf("inspect semaphore %q", s.name), func(ctx context.Context) (holding, error) {
		var err error
		if r, err = s.read(ctx); err != nil {
			return holding{}, err
		}
		n, err := s.d.subscribers(ctx, s.d.channel(s.keys[keys.LockKey]))
		return holding{waiters: n}, err
	})
	if err != nil {
		return SemaphoreInfo{}, err
	}
	info := SemaphoreInfo{Name: s.name, Permits: s.permits, Holders: r.holders, LastFence: r.counter, Waiters: h.waiters}
	if r.permits > 0 {
		info.Permits = r.permits
	}
	return info, nil
}

// semRead is what semaphore_inspect.lua read.
type semRead struct {
	permits int // the holders'; 0 when none holds one
	counter int64
	holders []HolderInfo // oldest fence first
}

func (s *Semaphore) read(ctx context.Context) (semRead, error) {
	reply, err := evalScript(ctx, s.d.client, script.SemInspect, false,
		[]any{s.keyArgs[keys.LockKey], s.info, s.keyArgs[keys.CounterKey]}, nil).Slice()
	if err != nil {
		return semRead{}, err
	}
	bad := fmt.Errorf("%w from the semaphore's inspect script: %v", errReply, reply)
	if len(reply) != 3 {
		return semRead{}, bad
	}
	permits, ok1 := reply[0].(string)
	counter, ok2 := reply[1].(string)
	items, ok3 := reply[2].([]any)
	if !ok1 || !ok2 || !ok3 || len(items)%3 != 0 {
		return semRead{}, bad
	}
	var r semRead
	r.permits, _ = strconv.Atoi(permits)
	r.counter, _ = strconv.ParseInt(counter, 10, 64)
	for i := 0; i < len(items); i += 3 {
		token, _ := items[i].(string)
		pttl, _ := items[i+1].(int64)
		value, _ := items[i+2].(string)
		_, fence, owner := keys.Parse("x " + value)
		r.holders = append(r.holders, HolderInfo{Token: token, Owner: owner, TTL: time.Duration(pttl) * time.Millisecond, Fence: fence})
	}
	slices.SortFunc(r.holders, func(a, b HolderInfo) int { return cmp.Compare(a.Fence, b.Fence) })
	return r, nil
}
