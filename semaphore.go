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
	"github.com/fencelock/fencelock/internal/store"
)

// A Semaphore lets at most its number of permits hold a name at once, each
// permit an ordinary Lease with fences increasing across all of them
// ("Semaphores"). It is safe for concurrent use.
type Semaphore struct {
	l       *Locker
	name    string
	permits int
	err     error       // why its calls fail with no Redis call (ErrInvalid); nil when usable
	key     string      // P{name}:sem and its companions: the lock's hash tag, none of its keys
	marker  string      // the prefix of each permit's marker
	args    [keys.N]any // key, -, counter, queue, queueInfo, boxed
	// The info key, permits, FenceRetention and the wake window, boxed: how long, in ms, releases
	// publish a wake-up after a plain waiter found all permits taken (its pause and next attempt).
	infoArg, permitsArg, retention, wakeWindow any
}

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
	if l.single == nil { // a quorum semaphore is safe only if every node grants each permit
		s.err = invalidf("semaphore %q on a NewRedlock Locker: its %d nodes would each count holders on their own, "+
			"so up to %d holders (nodes × permits / quorum) could each win a quorum; use New", name, len(l.checks), len(l.checks)*permits/(len(l.checks)/2+1))
		return s
	}
	k := keys.Lock(l.opts.KeyPrefix, name) + keys.Sem
	s.key, s.marker, s.infoArg = k, k+keys.Marker, k+keys.SemInfo
	s.args = [keys.N]any{keys.LockKey: k, keys.CounterKey: k + keys.Fence, keys.QueueKey: k + keys.Queue, keys.QueueInfoKey: k + keys.QueueInfo}
	s.retention, s.wakeWindow = store.Millis(l.opts.FenceRetention), store.Millis(l.opts.MaxRetryBackoff+l.opts.AttemptTimeout)
	return s
}

// Acquire takes one permit and returns its Lease, as Locker.Acquire takes a
// lock, with its options and errors (cleaning up after one as it does). All
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

// with returns a copy of opts and the option that makes a call take a permit.
func (s *Semaphore) with(opts []Option) []Option {
	k := kind{lease: func(spec store.Spec) store.Lease { return s.permit(spec) },
		queued: func(spec store.Spec) lineLease { return s.permit(spec) }}
	return append(opts[:len(opts):len(opts)], withKind(k))
}

// A permit is the store lease of one token's permit.
type permit struct {
	s     *Semaphore
	spec  store.Spec
	token string
	arg   any // token, boxed
	keys  []any
	owner any
}

var _ lineLease = (*permit)(nil)

func (s *Semaphore) permit(spec store.Spec) *permit {
	p := &permit{s: s, spec: spec, token: string(spec.Token), owner: spec.Owner}
	p.arg = p.token
	p.keys = append(s.args[:keys.N:keys.N], s.infoArg)
	p.keys[keys.MarkerKey] = s.marker + p.token
	return p
}

func (p *permit) Key() string          { return p.s.key }
func (p *permit) Token() string        { return p.token }
func (p *permit) Wakeup() store.Wakeup { return p.s.l.single.Releases(p.s.key) }
func (p *permit) Next(token []byte) store.Lease {
	return p.s.permit(store.Spec{Name: p.spec.Name, Token: token, TTL: p.spec.TTL, Owner: p.spec.Owner, Fair: p.spec.Fair})
}

func (p *permit) Acquire(ctx context.Context) store.Attempt {
	s, d := p.s, p.s.l.single
	fair := "0"
	if p.spec.Fair {
		fair = "1"
	}
	reply, err := d.Run(ctx, script.SemAcquire, false, p.keys, p.arg, store.Millis(p.spec.TTL), s.retention,
		p.owner, fair, store.Millis(store.QueueEntryTTL), s.permitsArg, s.wakeWindow)
	return d.Took(ctx, p, reply, err, s.attemptOf(reply))
}

// attemptOf decodes semaphore_acquire.lua's reply: as acquire.lua's, or {0, pttl,
// holders, owner} when all are taken, or {3, permits} for another number of permits.
func (s *Semaphore) attemptOf(reply any) store.Attempt {
	arr, _ := reply.([]any)
	flag := replyFlag(arr)
	switch {
	case flag == 0 && len(arr) == 4:
		pttl, ok1 := arr[1].(int64)
		n, ok2 := arr[2].(int64)
		owner, ok3 := arr[3].(string)
		if ok1 && ok2 && ok3 {
			if pttl < 0 { // a permit is free, but fair waiters are in line first
				return store.Attempt{Busy: store.Busy{TTL: -3, Owner: "fair waiters in line"}}
			}
			return store.Attempt{Busy: store.Busy{TTL: time.Duration(pttl) * time.Millisecond, Owner: owner, Holders: int(n)}}
		}
	case flag == 1 || flag == 2:
		return store.AcquireReply("semaphore_acquire", reply)
	case flag == 3 && len(arr) == 2:
		used, _ := arr[1].(string)
		if n, err := strconv.Atoi(used); err == nil {
			return store.Attempt{Err: &permitsError{name: s.name, used: n, want: s.permits}}
		}
	}
	return store.Attempt{Err: store.BadReply("semaphore_acquire", reply)}
}

// A permitsError is an Acquire with another number of permits than the holders'.
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

// Class is store.Misconfigured: retrying does not help.
func (e *permitsError) Class() store.Class { return store.Misconfigured }

func (p *permit) Extend(ctx context.Context, ttl time.Duration, renewal bool) (store.Result, error) {
	reply, err := p.s.l.single.Run(ctx, script.SemExtend, renewal, []any{p.s.args[keys.LockKey], p.s.infoArg}, p.arg, store.Millis(ttl))
	return store.ExtendReply("semaphore_extend", reply, err)
}

func (p *permit) Release(ctx context.Context, mode store.Mode, ttl time.Duration) (store.Result, error, error) {
	s, d := p.s, p.s.l.single
	reply, err := d.Eval(ctx, script.SemRelease, p.keys, p.arg, d.ChannelArg(s.key, s.args[keys.LockKey]),
		store.ModeArg(mode), d.MarkerArg(mode, ttl), s.retention)
	if err != nil {
		return store.Gone, nil, err
	}
	return store.ReleaseReply("semaphore_release", reply)
}

func (p *permit) Queue(ctx context.Context, ttl time.Duration, leave bool) (queueReply, error) {
	s := p.s
	return queue(ctx, s.l.single, script.SemQueue, []any{s.args[keys.LockKey], s.args[keys.QueueKey], s.args[keys.QueueInfoKey], s.infoArg},
		p.arg, leave, ttl, p.owner, s.permitsArg)
}

// Read reads the permit for Lease.TTL: its value as a lock's, "" if none.
func (p *permit) Read(ctx context.Context) (store.Holding, error) {
	r, err := p.s.read(ctx)
	if err != nil {
		return store.Holding{}, err
	}
	for _, h := range r.Holders {
		if h.Token == p.token {
			return store.Holding{Value: keys.Value(h.Token, h.Fence, h.Owner), PTTL: h.TTL}, nil
		}
	}
	return store.Holding{}, nil
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
	var info SemaphoreInfo // read only once the read returned
	h, err := s.l.read(ctx, s.name, fmt.Sprintf("inspect semaphore %q", s.name), func(ctx context.Context) (store.Holding, error) {
		var err error
		if info, err = s.read(ctx); err != nil {
			return store.Holding{}, err
		}
		n, err := s.l.single.Subscribers(ctx, s.key)
		return store.Holding{Waiters: n}, err
	})
	if err != nil {
		return SemaphoreInfo{}, err
	}
	info.Name, info.Waiters = s.name, h.Waiters
	if info.Permits <= 0 { // no holder
		info.Permits = s.permits
	}
	return info, nil
}

// read reads semaphore_inspect.lua's Permits (0 when none holds one),
// LastFence and Holders.
func (s *Semaphore) read(ctx context.Context) (SemaphoreInfo, error) {
	reply, err := s.l.single.Eval(ctx, script.SemInspect, []any{s.args[keys.LockKey], s.infoArg, s.args[keys.CounterKey]})
	if err != nil {
		return SemaphoreInfo{}, err
	}
	arr, _ := reply.([]any)
	bad := store.BadReply("semaphore_inspect", reply)
	if len(arr) != 3 {
		return SemaphoreInfo{}, bad
	}
	permits, ok1 := arr[0].(string)
	counter, ok2 := arr[1].(string)
	items, ok3 := arr[2].([]any)
	if !ok1 || !ok2 || !ok3 || len(items)%3 != 0 {
		return SemaphoreInfo{}, bad
	}
	var r SemaphoreInfo
	r.Permits, _ = strconv.Atoi(permits)
	r.LastFence, _ = strconv.ParseInt(counter, 10, 64)
	for i := 0; i < len(items); i += 3 {
		token, _ := items[i].(string)
		pttl, _ := items[i+1].(int64)
		value, _ := items[i+2].(string)
		_, fence, owner := keys.Parse("x " + value)
		r.Holders = append(r.Holders, HolderInfo{Token: token, Owner: owner, TTL: time.Duration(pttl) * time.Millisecond, Fence: fence})
	}
	slices.SortFunc(r.Holders, func(a, b HolderInfo) int { return cmp.Compare(a.Fence, b.Fence) })
	return r, nil
}
