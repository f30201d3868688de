package fencelock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

const maxNames = 1000 // the most names one AcquireAll takes

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
		return l.degradedAll(ctx, names, co, err), nil
	}
	return leases, err
}

// setOptions checks a call for names, and applies opts as callOptions does.
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

// acquireAllObserved is AcquireAll without failing open, seen as one OpAcquire.
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

// acquireAll takes names with one script where one can, else one by one in sorted
// order: two overlapping calls never wait for each other in a circle.
func (l *Locker) acquireAll(ctx context.Context, names []string, co callOptions, open bool, st *acquireStats) ([]*Lease, error) {
	if l.single != nil && together(l.checks[0].client.Network().Topology(), l.opts.KeyPrefix, names) {
		return l.acquireTogether(ctx, names, co, open, st)
	}
	return l.acquireInOrder(ctx, names, co, open, st)
}

// together reports whether one script can take all of names on a
// deployment of topology t: a Cluster's when their keys share a slot.
func together(t notify.Topology, prefix string, names []string) bool {
	switch t {
	case notify.Cluster:
		slot := keys.Slot(keys.Lock(prefix, names[0]))
		for _, name := range names[1:] {
			if keys.Slot(keys.Lock(prefix, name)) != slot {
				return false
			}
		}
		return true
	case notify.Ring:
		return len(names) == 1
	}
	return true
}

// acquireTogether takes names in one script per attempt, as one acquisition.
func (l *Locker) acquireTogether(ctx context.Context, names []string, co callOptions, open bool, st *acquireStats) ([]*Lease, error) {
	l.bg.Add() // as acquireWith
	defer l.bg.Done()
	c := &setCall{l: l, names: names}
	spec := l.spec(strings.Join(names, ","), co)
	stand := l.leaseOf(spec, c.set(spec))
	got, err := l.newAcquisition(ctx, stand, co.wait, open, st).plain()
	if err != nil {
		return nil, err
	}
	leases := make([]*Lease, len(names))
	for i, m := range c.won.members {
		leases[i] = &Lease{locker: l, h: m, name: names[i], ttl: got.ttl, owner: got.owner, fence: c.won.fences[i],
			acquired: got.acquired, deadline: got.deadline, floorTTL: got.floorTTL}
	}
	return leases, nil
}

// A setCall is one AcquireAll's taking of names together.
type setCall struct {
	l     *Locker
	names []string
	won   *set // written by the set's Acquire that took the locks, read once the acquisition returned
}

// A set is the store lease of one token of a setCall: a lock lease per name.
type set struct {
	c       *setCall
	spec    store.Spec
	members []store.Lease
	keys    []any // multi_acquire.lua's: each lock's keys, as acquire.lua's
	argv    []any // its ttl, retention, owner, then each lock's token
	fences  []int64
}

var _ store.Lease = (*set)(nil)

// set returns the set of spec's token: a new token for each name.
func (c *setCall) set(spec store.Spec) *set {
	l := c.l
	s := &set{c: c, spec: spec, members: make([]store.Lease, len(c.names)), keys: make([]any, 0, keys.N*len(c.names))}
	s.argv = append(make([]any, 0, 3+len(c.names)), store.Millis(spec.TTL), store.Millis(l.opts.FenceRetention), spec.Owner)
	for i, name := range c.names {
		token := keys.NewToken()
		s.members[i] = l.single.Lock(store.Spec{Name: name, Token: token, TTL: spec.TTL, Owner: spec.Owner})
		for _, k := range keys.ForLease(l.opts.KeyPrefix, name, token) {
			s.keys = append(s.keys, k)
		}
		s.argv = append(s.argv, string(token))
	}
	return s
}

func (s *set) Key() string   { return s.members[0].Key() }
func (s *set) Token() string { return string(s.spec.Token) }
func (s *set) Next(token []byte) store.Lease {
	spec := s.spec
	spec.Token = token
	return s.c.set(spec)
}

func (s *set) Acquire(ctx context.Context) store.Attempt {
	d := s.c.l.single
	reply, err := d.Run(ctx, script.MultiAcquire, false, s.keys, s.argv...)
	fences, a := decodeAcquireAll(reply, s.c.names)
	a = d.Took(ctx, s, reply, err, a)
	if a.OK {
		s.fences, s.c.won = fences, s
	}
	return a
}

// decodeAcquireAll decodes multi_acquire.lua's reply: {1, fence, ...}, {0, i,
// pttl, owner} for the i-th name (from 1) found busy, or {2}: retired token.
func decodeAcquireAll(reply any, names []string) (fences []int64, a store.Attempt) {
	arr, _ := reply.([]any)
	flag := replyFlag(arr)
	switch n := len(names); {
	case flag == 1 && len(arr) == n+1:
		fences = make([]int64, n)
		for i := range fences {
			s, _ := arr[i+1].(string)
			f, err := strconv.ParseInt(s, 10, 64)
			if err != nil || f <= 0 {
				return nil, store.Attempt{Err: fmt.Errorf("%w from the multi_acquire script: fence %v", store.ErrReply, arr[i+1])}
			}
			fences[i] = f
		}
		return fences, store.Attempt{OK: true, Fence: fences[0]}
	case flag == 0 && len(arr) == 4:
		i, ok1 := arr[1].(int64)
		pttl, ok2 := arr[2].(int64)
		owner, ok3 := arr[3].(string)
		if ok1 && ok2 && ok3 && i >= 1 && i <= int64(n) {
			if pttl == -3 {
				owner = "fair waiters in line"
			}
			return nil, store.Attempt{Busy: store.Busy{TTL: time.Duration(pttl) * time.Millisecond, Owner: owner, Name: names[i-1]}}
		}
	case flag == 2 && len(arr) == 1:
		return nil, store.Attempt{Err: store.ErrRetired}
	}
	return nil, store.Attempt{Err: store.BadReply("multi_acquire", reply)}
}

// Extend extends every lock of the set, answering as the first that did not.
func (s *set) Extend(ctx context.Context, ttl time.Duration, renewal bool) (store.Result, error) {
	for _, m := range s.members {
		if r, err := m.Extend(ctx, ttl, renewal); err != nil || r != store.Done {
			return r, err
		}
	}
	return store.Done, nil
}

// Release releases (or abandons) every lock of the set, answering as the first
// not Done, with the first error once all were tried.
func (s *set) Release(ctx context.Context, mode store.Mode, ttl time.Duration) (r store.Result, perr, err error) {
	r = store.Done
	for _, m := range s.members {
		mr, pe, e := m.Release(ctx, mode, ttl)
		if err == nil {
			err = e
		}
		if perr == nil {
			perr = pe
		}
		if e == nil && mr != store.Done && r == store.Done {
			r = mr
		}
	}
	return r, perr, err
}

func (s *set) Read(ctx context.Context) (store.Holding, error) { return s.members[0].Read(ctx) }

// Wakeup wakes a waiting AcquireAll on the channels of the names found busy.
func (s *set) Wakeup() store.Wakeup {
	return &setReleases{c: s.c, wake: make(chan struct{}, 1), ws: make(map[string]*notify.Waiter)}
}

type setReleases struct {
	c    *setCall
	wake chan struct{}
	ws   map[string]*notify.Waiter // by name; nil after Close
}

func (s *setReleases) Next(at store.Attempt, busy bool, d time.Duration) (<-chan struct{}, time.Duration) {
	if _, ok := s.ws[at.Busy.Name]; busy && at.Busy.Name != "" && !ok {
		l := s.c.l
		s.ws[at.Busy.Name] = l.single.Listen(keys.Lock(l.opts.KeyPrefix, at.Busy.Name), s.wake, setHearing{})
	}
	if len(s.ws) == 0 {
		return nil, d
	}
	return s.wake, d
}

func (s *setReleases) Woken() time.Duration { return 0 }

func (s *setReleases) Leave(store.Lease, bool) {
	for _, w := range s.ws {
		if w != nil {
			w.Leave()
		}
	}
}

// setHearing wakes a waiting AcquireAll on every message but a grant, not
// one waiter of many: it may find another name busy and pass on to no one.
type setHearing struct{}

func (setHearing) Hear(m notify.Message) notify.Hearing {
	if m.Head == "granted" {
		return notify.Ignore
	}
	return notify.WakeAll
}

func (setHearing) Lingers() bool { return false }

// acquireInOrder takes names one by one in sorted order, all within co.wait.
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

// acquireHolding acquires name as Acquire does, waiting until end at most,
// in turns of a renewal interval after which it extends the leases held.
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

// releaseAll releases leases within one bound, the unanswered in the background.
func (l *Locker) releaseAll(ctx context.Context, leases []*Lease) {
	for i, err := range l.releaseLeases(ctx, leases, nil) {
		if errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrNotHeld) {
			l.releaseInBackground(leases[i])
		}
	}
}

func (l *Locker) degradedAll(ctx context.Context, names []string, co callOptions, err error) []*Lease {
	leases := make([]*Lease, len(names))
	for i, name := range names {
		leases[i] = l.degraded(ctx, name, co, err)
	}
	return leases
}

// settleAll is settle for several leases; it returns their losses joined.
func (l *Locker) settleAll(ctx context.Context, leases []*Lease) error {
	byWork := make(map[*Lease]bool, len(leases))
	lost := make([]error, len(leases))
	var rel []*Lease
	for i, lease := range leases {
		byWork[lease] = lease.isReleasing()
		if lost[i] = l.lostByNow(lease, byWork[lease]); lost[i] == nil {
			rel = append(rel, lease)
		}
	}
	rerrs := l.releaseLeases(ctx, rel, func(lease *Lease, rerr error) { l.lateLoss(lease, byWork[lease], rerr) })
	var all error
	j := 0
	for i, lease := range leases {
		if lost[i] == nil {
			lost[i] = l.settled(ctx, lease, byWork[lease], rerrs[j])
			j++
		}
		if lost[i] != nil {
			all = joinErr(all, lost[i])
		}
	}
	return all
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
		return work(ctx, l.degradedAll(ctx, names, co, err))
	}
	workCtx := ctx // each lease's from the one before: work's ends with the first loss
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

// releaseLeases releases leases as Release does each, all within ctx and
// one ReleaseTimeout; those not answered by then go on in the background.
// errs[i] is leases[i]'s error; notHeld, if not nil, gets a late ErrNotHeld.
func (l *Locker) releaseLeases(ctx context.Context, leases []*Lease, notHeld func(*Lease, error)) (errs []error) {
	errs = make([]error, len(leases))
	if obs := l.opts.Observer; obs != nil {
		defer l.observeReleases(ctx, leases, errs)()
	}
	var todo []*Lease
	var at []int // todo[j] is leases[at[j]]
	for i, lease := range leases {
		lease.endWork()
		switch {
		case lease.degraded:
			errs[i] = ErrNotHeld
		case lease.doneErr() != nil:
			errs[i] = lease.doneErr()
		default:
			todo, at = append(todo, lease), append(at, i)
		}
	}
	if len(todo) == 0 {
		return errs
	}
	rctx, cancel := l.detached(ctx)
	run := func() []error {
		res := make([]error, len(todo))
		for j, lease := range todo {
			res[j] = lease.release(rctx)
		}
		return res
	}
	var res []error
	done := ctx.Done() == nil && l.traits.Deadlines // as in releaseOp
	if done {
		res = run()
	} else {
		res, done = tasks.Call(l.bg, ctx.Done(), rctx.Done(), run, func(res []error) {
			cancel()
			for j, err := range res {
				lease := todo[j]
				lease.releasedLate(err, func(err error) {
					if notHeld != nil {
						notHeld(lease, err)
					}
				})
			}
		})
	}
	if !done {
		cut := l.releaseCutShort(ctx)
		for _, i := range at {
			errs[i] = cut
		}
		return errs
	}
	cancel()
	for j, err := range res {
		errs[at[j]] = err
	}
	return errs
}

// observeReleases starts an OpRelease for each lease; end ends them with errs.
func (l *Locker) observeReleases(ctx context.Context, leases []*Lease, errs []error) (end func()) {
	obs := l.opts.Observer
	ctxs := make([]context.Context, len(leases))
	for i, lease := range leases {
		ctxs[i] = obs.Start(ctx, OpRelease, lease.name)
	}
	start := l.clock.Now()
	return func() {
		now := l.clock.Now()
		for i, lease := range leases {
			obs.End(ctxs[i], releaseEvent(lease, errs[i], start, now))
		}
	}
}
