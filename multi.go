package fencelock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/redis/go-redis/v9"
)

// maxNames is the most names one AcquireAll takes.
const maxNames = 1000

// AcquireAll takes the locks called names, all or none, and returns their
// leases in the order given ("Several names at once"); WithWait bounds the
// whole call. It returns ErrInvalid, with no Redis call, for an empty list,
// more than 1,000 names, a name given twice, a bad name or option, or WithFair;
// a *BusyError naming the name found busy; otherwise Acquire's errors, or
// Lease.Extend's for a name kept alive while it waited. After an error it
// holds none of the names, as after a failed Acquire.
func (l *Locker) AcquireAll(ctx context.Context, names []string, opts ...Option) ([]*Lease, error) {
	co, err := l.setOptions(names, opts)
	if err != nil {
		return nil, err
	}
	open := co.openSet && co.open
	leases, err := l.acquireAllObserved(ctx, names, co, open)
	if err != nil && open && outage(ctx, err) {
		return l.degradedAll(ctx, names, err), nil
	}
	return leases, err
}

// RunWithLocks runs work holding the locks called names, taken as AcquireAll
// takes them, renewed and released as RunWithLock does one; work's context is
// cancelled with cause ErrLost as soon as any lease is lost. It returns
// RunWithLock's errors, AcquireAll's instead of Acquire's, with one matching
// ErrLost for each lease lost.
func (l *Locker) RunWithLocks(ctx context.Context, names []string,
	work func(ctx context.Context, leases []*Lease) error, opts ...Option) error {
	if err := l.usable(); err != nil {
		return err
	}
	if work == nil {
		return invalidf("nil work function")
	}
	if l.opts.Observer == nil { // without observeRun's closure and the joined names
		return l.runAll(ctx, names, work, opts)
	}
	return l.observeRun(ctx, strings.Join(names, ","), func(ctx context.Context, _ **Lease) error {
		return l.runAll(ctx, names, work, opts)
	})
}

// runAll is RunWithLocks, without the Observer's Start and End.
func (l *Locker) runAll(ctx context.Context, names []string,
	work func(ctx context.Context, leases []*Lease) error, opts []Option) error {
	co, err := l.setOptions(names, opts)
	if err != nil {
		return err
	}
	open := co.opens(l.opts.FailOpen)
	leases, err := l.acquireAllObserved(ctx, names, co, open)
	if err != nil {
		if !open || !outage(ctx, err) {
			return err
		}
		return work(ctx, l.degradedAll(ctx, names, err))
	}
	// Each lease's context is derived from the one before: the last,
	// work's, ends with the first lease lost, with its cause.
	workCtx := ctx
	for _, lease := range leases {
		if l.opts.Observer != nil {
			lease.obsCtx = ctx // the run's: renewals and a loss are its events
		}
		workCtx = lease.keepAlive(workCtx, true)
	}
	returned := false
	defer func() {
		if !returned { // work panicked or called runtime.Goexit
			l.releaseLeases(ctx, leases, nil)
		}
	}()
	werr := work(workCtx, leases)
	returned = true
	if lost := l.settleAll(ctx, leases); lost != nil {
		return joinErr(werr, lost)
	}
	return werr
}

// setOptions checks a call for names, and applies opts as callOptions does
// for one name.
func (l *Locker) setOptions(names []string, opts []Option) (callOptions, error) {
	if err := l.usable(); err != nil {
		return callOptions{}, err
	}
	switch {
	case len(names) == 0:
		return callOptions{}, invalidf("no lock names")
	case len(names) > maxNames:
		return callOptions{}, invalidf("%d lock names, more than %d", len(names), maxNames)
	}
	seen := make(map[string]struct{}, len(names))
	for _, name := range names {
		if err := checkName(name); err != nil {
			return callOptions{}, err
		}
		if _, dup := seen[name]; dup {
			return callOptions{}, invalidf("lock name %q given twice", name)
		}
		seen[name] = struct{}{}
	}
	co, err := l.callOptions(names[0], opts)
	if err == nil && co.fair {
		err = invalidf("WithFair with several names: they are taken all at once, not in line")
	}
	return co, err
}

// acquireAllObserved is AcquireAll with its options checked, without
// failing open; an Observer sees one OpAcquire, named by the names joined
// with commas.
func (l *Locker) acquireAllObserved(ctx context.Context, names []string, co callOptions, open bool) ([]*Lease, error) {
	obs := l.opts.Observer
	if obs == nil {
		return l.acquireAll(ctx, names, co, open, nil)
	}
	label := strings.Join(names, ",")
	ctx = obs.Start(ctx, OpAcquire, label)
	var st acquireStats
	start := l.clock.Now()
	got, err := l.acquireAll(ctx, names, co, open, &st)
	obs.End(ctx, Event{Op: OpAcquire, Name: label, Outcome: OutcomeOf(err), Err: err,
		Duration: l.clock.Now().Sub(start), Waited: st.waited, Handoff: st.handoff})
	for _, lease := range got {
		lease.obsCtx = ctx
	}
	return got, err
}

// acquireAll takes names as GUARANTEES.md ("Several names at once") says:
// with one script per attempt where one can take them all (acquireTogether),
// else one by one in sorted order, so that two overlapping calls never wait
// for each other in a circle (acquireInOrder).
func (l *Locker) acquireAll(ctx context.Context, names []string, co callOptions, open bool, st *acquireStats) ([]*Lease, error) {
	if d := l.fair; d != nil && together(d.base, names) {
		return l.acquireTogether(ctx, d, names, co, open, st)
	}
	return l.acquireInOrder(ctx, names, co, open, st)
}

// together reports whether one script can take all of names on c: on one
// server (or Sentinel's master), or when they hash to one Cluster slot.
func together(c redis.UniversalClient, names []string) bool {
	switch c.(type) {
	case *redis.ClusterClient:
		slot := keySlot(names[0])
		for _, name := range names[1:] {
			if keySlot(name) != slot {
				return false
			}
		}
		return true
	case *redis.Ring:
		return len(names) == 1 // a Ring's shards are chosen by a hash of its own
	}
	return true
}

// keySlot is the Cluster slot of the keys whose hash tag is tag: CRC16
// (XMODEM) modulo 16384.
func keySlot(tag string) int {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}

// acquireTogether takes names in one script per attempt, through one
// acquisition whose lease stands for the set.
func (l *Locker) acquireTogether(ctx context.Context, d *deployment, names []string, co callOptions, open bool, st *acquireStats) ([]*Lease, error) {
	l.bg.Add() // as acquireWith
	defer l.bg.Done()
	s := &set{d: d, names: names, members: make(map[*Lease][]*Lease)}
	stand := l.newLease(strings.Join(names, ","), co.ttl)
	stand.kind = s
	if co.owner != "" {
		stand.owner, stand.ownerArg = co.owner, co.owner
	}
	a := l.newAcquisition(ctx, stand, co.wait, open, st)
	got, err := a.plain(&setReleases{d: d, wake: make(chan struct{}, 1), ws: make(map[string]*waiter)})
	if err != nil {
		return nil, err
	}
	leases := s.leases(got)
	for _, lease := range leases {
		lease.acquired, lease.deadline, lease.floorTTL = got.acquired, got.deadline, got.floorTTL
	}
	return leases, nil
}

// A set is the kind of a lease that stands for several locks taken
// together: an AcquireAll's acquisition (its attempts, waiting, giving up)
// runs on it, and each of its tokens has an ordinary lock lease per name,
// which AcquireAll returns.
type set struct {
	d     *deployment
	names []string

	mu      sync.Mutex
	members map[*Lease][]*Lease // guarded by mu; the leases of each token (a new one after rotate)
}

var _ kind = (*set)(nil)

// leases returns the lock leases of stand, one per name, made at its first
// attempt with its TTL and owner.
func (s *set) leases(stand *Lease) []*Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.members[stand]
	if ls == nil {
		ls = make([]*Lease, len(s.names))
		for i, name := range s.names {
			ls[i] = s.d.l.newLease(name, stand.ttl)
			ls[i].owner, ls[i].ownerArg = stand.owner, stand.ownerArg
		}
		s.members[stand] = ls
	}
	return ls
}

func (s *set) acquire(ctx context.Context, stand *Lease) attempt {
	ls := s.leases(stand)
	keys := make([]any, 0, keys.N*len(ls))
	argv := make([]any, 3, 3+len(ls))
	argv[0], argv[1], argv[2] = s.d.l.ttlArg(stand.ttl), s.d.l.retentionMillis, stand.ownerArg
	for _, m := range ls {
		keys = append(keys, m.keyArgs[:]...)
		argv = append(argv, m.tokenArg)
	}
	reply, err := s.d.run(ctx, script.MultiAcquire, false, keys, argv...)
	fences, a := decodeAcquireAll(reply, s.names) // the locks' fences, when taken
	a = s.d.attempted(ctx, stand, reply, err, a)
	if a.ok {
		for i, m := range ls {
			m.fence = fences[i]
		}
	}
	return a
}

// decodeAcquireAll decodes multi_acquire.lua's reply for the locks called
// names: {1, fence, ...} with their fences, {0, i, pttl, owner} for the
// i-th (from 1) found busy, as acquireAttempt's busy attempt naming it, or
// {2} for a retired token.
func decodeAcquireAll(reply any, names []string) (fences []int64, a attempt) {
	arr, _ := reply.([]any)
	var flag int64
	if len(arr) > 0 {
		flag, _ = arr[0].(int64)
	}
	switch n := len(names); {
	case flag == 1 && len(arr) == n+1:
		fences = make([]int64, n)
		for i := range fences {
			s, _ := arr[i+1].(string)
			f, err := strconv.ParseInt(s, 10, 64)
			if err != nil || f <= 0 {
				return nil, attempt{err: fmt.Errorf("%w from the multi_acquire script: fence %v", errReply, arr[i+1])}
			}
			fences[i] = f
		}
		return fences, attempt{ok: true, fence: fences[0]}
	case flag == 0 && len(arr) == 4:
		i, ok1 := arr[1].(int64)
		pttl, ok2 := arr[2].(int64)
		owner, ok3 := arr[3].(string)
		if ok1 && ok2 && ok3 && i >= 1 && i <= int64(n) {
			if pttl == -3 {
				owner = "fair waiters in line"
			}
			return nil, attempt{pttl: time.Duration(pttl) * time.Millisecond, owner: owner, name: names[i-1]}
		}
	case flag == 2 && len(arr) == 1:
		return nil, attempt{err: errRetired}
	}
	return nil, attempt{err: fmt.Errorf("%w from the multi_acquire script: %v", errReply, reply)}
}

// extend extends every lock of the set, and answers as the first that
// did not extend (see kind.extend).
func (s *set) extend(ctx context.Context, stand *Lease, ttl time.Duration, renewal bool) (int64, error) {
	for _, m := range s.leases(stand) {
		if code, err := s.d.extend(ctx, m, ttl, renewal); err != nil || code != 1 {
			return code, err
		}
	}
	return 1, nil
}

// release releases (or, for modeAbandon, abandons: see release.lua) every
// lock of the set, each as a lone lease's, and answers 1 when each was
// deleted, else as the first that was not; err is the first error, after
// the others were tried.
func (s *set) release(ctx context.Context, stand *Lease, mode string) (code int64, perr, err error) {
	code = 1
	for _, m := range s.leases(stand) {
		c, pe, e := s.d.release(ctx, m, mode)
		if err == nil {
			err = e
		}
		if perr == nil {
			perr = pe
		}
		if e == nil && c != 1 && code == 1 {
			code = c
		}
	}
	return code, perr, err
}

// setReleases wakes a waiting AcquireAll as releases (acquire.go) wakes a
// waiting Acquire, on the channels of the names it found busy, each
// registered on one wake channel the first time an attempt finds it held.
type setReleases struct {
	d    *deployment
	wake chan struct{}
	ws   map[string]*waiter // by name; nil after Close
}

func (s *setReleases) next(at attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration) {
	if _, ok := s.ws[at.name]; busy && at.name != "" && !ok {
		key, _ := s.d.l.keys(at.name)
		s.ws[at.name] = s.d.waits.register(s.d.channel(key), s.wake, setHearing{})
	}
	if len(s.ws) == 0 {
		return nil, d
	}
	return s.wake, d
}

func (s *setReleases) woken() time.Duration { return 0 }

// setHearing is what a waiting AcquireAll makes of the messages on a busy
// name's channel: all but a grant wake it, not one waiter of many, as it
// may find another of its names busy and pass the release on to no one.
type setHearing struct{}

func (setHearing) hear(_ *waiter, m message) hearing {
	if m.head == "granted" {
		return ignore
	}
	return wakeAll
}

func (setHearing) lingers(*waiter) bool { return false }

func (s *setReleases) leave(*Lease, bool) {
	for _, w := range s.ws {
		if w != nil {
			w.leave()
		}
	}
}

// acquireInOrder takes names one by one in sorted order, each as Acquire
// does, all within co.wait, keeping those it holds (acquireHolding).
func (l *Locker) acquireInOrder(ctx context.Context, names []string, co callOptions, open bool, st *acquireStats) ([]*Lease, error) {
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(names[a], names[b]) })
	leases := make([]*Lease, len(names))
	held := make([]*Lease, 0, len(names))
	end := l.clock.Now().Add(co.wait)
	for _, i := range order {
		lease, err := l.acquireHolding(ctx, names[i], co, open, st, end, held)
		if err != nil {
			l.releaseAll(ctx, held)
			return nil, err
		}
		leases[i] = lease
		held = append(held, lease)
	}
	now := l.clock.Now()
	for _, lease := range held {
		if !now.Before(lease.Deadline()) { // a reply slower than its TTL
			l.releaseAll(ctx, held)
			return nil, &opError{msg: fmt.Sprintf("%s: the lease of %q expired while the others were taken",
				ErrUnavailable.Error(), lease.name), errs: []error{ErrUnavailable}}
		}
	}
	return leases, nil
}

// acquireHolding acquires name as Acquire does, waiting until end at most
// when co waits, in turns of a renewal interval after which it extends the
// leases held.
func (l *Locker) acquireHolding(ctx context.Context, name string, co callOptions, open bool, st *acquireStats, end time.Time, held []*Lease) (*Lease, error) {
	for {
		c := co
		if co.wait > 0 {
			c.wait = max(end.Sub(l.clock.Now()), 0) // 0 when it ran out: try once
			if len(held) > 0 {
				c.wait = min(c.wait, l.opts.renewInterval(co.ttl))
			}
		}
		lease, err := l.acquireWith(ctx, name, c, open, st)
		retry := errors.Is(err, ErrNotObtained) || (!open && errors.Is(err, ErrUnavailable))
		if err == nil || !retry || c.wait == 0 || !l.clock.Now().Before(end) || ctxErr(ctx) != nil || l.isClosed() {
			return lease, err
		}
		for _, h := range held {
			if err := h.Extend(ctx, h.currentTTL()); err != nil {
				return nil, fmt.Errorf("keeping %q while waiting for %q: %w", h.name, name, err)
			}
		}
	}
}

// releaseAll releases leases within one bound (see releaseLeases), handing
// a release that got no answer to the background.
func (l *Locker) releaseAll(ctx context.Context, leases []*Lease) {
	for i, err := range l.releaseLeases(ctx, leases, nil) {
		if errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrNotHeld) {
			l.releaseInBackground(leases[i])
		}
	}
}

// degradedAll returns the fail-open stand-ins for names.
func (l *Locker) degradedAll(ctx context.Context, names []string, err error) []*Lease {
	leases := make([]*Lease, len(names))
	for i, name := range names {
		leases[i] = l.degraded(ctx, name, nil, err)
	}
	return leases
}
