package redlock

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// vote is an attempt's grants so far, by outcome, and which nodes answered.
type vote struct {
	ok, busy, failed []nodeGrant
	answered         []bool
}

func (v *vote) take(g nodeGrant) {
	v.answered[g.node] = true
	switch {
	case g.ok:
		v.ok = append(v.ok, g)
	case g.err != nil:
		v.failed = append(v.failed, g)
	default:
		v.busy = append(v.busy, g)
	}
}

func (v *vote) count() int { return len(v.ok) + len(v.busy) + len(v.failed) }

// Acquire takes the lock on a quorum and issues its fence: phase 1 grants it
// on every node, each counting its fence counter on, and phase 2 (fenced)
// writes the largest count to the nodes behind. The lease exists when a
// quorum has the fence within the validity.
func (k *lease) Acquire(ctx context.Context) store.Attempt {
	q := k.q
	ttl := k.spec.TTL
	validity := ttl - store.Drift(ttl)
	start := q.cfg.Clock.Now()
	// Detached from ctx (AttemptTimeout): a later grant is read by settle, or
	// given back by the clean-up of an Acquire that gives up.
	line := k.call.line // the line is kept on the first node
	k.call.lined, k.call.ahead = false, 0
	grants := each(ctx, q, validity, true, func(ctx context.Context, i int, _ *deployment.Deployment) nodeGrant {
		if i == 0 {
			return k.grant(ctx, i, ttl, 0, line)
		}
		return k.grant(ctx, i, ttl, 0, "")
	})
	grants.closed = q.cfg.Closed
	defer grants.stop()
	v := &vote{answered: make([]bool, len(q.nodes))}
	q.gather(grants, v, start)
	if err := ctx.Err(); err != nil && len(v.failed) == 0 {
		return store.Attempt{Err: err} // no verdict: Acquire cleans up if it gives up
	}
	if v.count() >= q.n {
		took := int64(q.cfg.Clock.Now().Sub(start))
		if old := q.answerTime.Load(); old > 0 {
			took = old + (took-old)/8
		}
		q.answerTime.Store(took)
	}
	if len(v.ok) < q.n {
		q.straggle(ctx, grants, v, start)
		q.decideSplit(ctx, k, start, validity, v)
		if len(v.ok) < q.n {
			return q.refused(k, v)
		}
	}
	return k.fenced(ctx, grants, v, start, validity)
}

// gather collects grants until a quorum granted, a quorum is out of reach,
// or every node answered; once a quorum has answered, the others get the
// grace, not the validity (unlike collect, a granted quorum ends it at once).
func (q *Quorum) gather(grants *results[nodeGrant], v *vote, start time.Time) {
	var straggle <-chan time.Time
	for len(v.ok) < q.n && len(v.busy)+len(v.failed) <= len(q.nodes)-q.n && v.count() < len(q.nodes) {
		if straggle == nil && v.count() >= q.n {
			t := graceTimer(q.cfg.Clock, start)
			defer t.Stop()
			straggle = t.C
		}
		g, more := grants.nextOr(straggle)
		if !more {
			return
		}
		v.take(g)
	}
}

// straggle waits the grace for the replies of an attempt without a quorum
// still on their way: a node that will not grant the lock needs no clean-up.
func (q *Quorum) straggle(ctx context.Context, grants *results[nodeGrant], v *vote, start time.Time) {
	grace := graceTimer(q.cfg.Clock, start)
	defer grace.Stop()
	for v.count() < len(q.nodes) {
		select {
		case g := <-grants.ch:
			v.take(g)
		case <-grace.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// fenced is phase 2, once a quorum granted: it writes the fence to the
// granting nodes that counted to less, until a quorum has it.
func (k *lease) fenced(ctx context.Context, grants *results[nodeGrant], v *vote, start time.Time, validity time.Duration) store.Attempt {
	q := k.q
	var fence int64
	for _, g := range v.ok {
		fence = max(fence, g.fence)
	}
	behind := make([]bool, len(q.nodes))
	var recorded, lagging int
	for _, g := range v.ok {
		if g.fence == fence {
			recorded++
		} else {
			behind[g.node] = true
			lagging++
		}
	}
	var errs []error
	if lagging > 0 {
		n, e, err := k.catchUp(ctx, behind, fence, recorded, start.Add(validity))
		if err != nil {
			return store.Attempt{Err: err}
		}
		recorded, errs = n, e
	}
	if recorded < q.n || !q.cfg.Clock.Now().Before(start.Add(validity)) {
		msg := fmt.Sprintf("the fence reached %d of %d nodes within the lock's validity %v", recorded, len(q.nodes), validity)
		if lagging == 0 {
			msg = fmt.Sprintf("a quorum granted the lock after its validity %v", validity)
		}
		q.retire(k, nil)
		return store.Attempt{Retire: true, Free: true, Err: &quorumError{class: store.Unavailable, msg: msg, errs: errs}}
	}
	k.mu.Lock()
	k.fence, k.until = fence, start.Add(validity)
	k.mu.Unlock()
	k.settle(grants, len(q.nodes)-v.count(), fence, start.Add(validity))
	return store.Attempt{OK: true, Fence: fence}
}

// catchUp writes fence to the nodes behind until end, detached, and returns
// how many nodes record it once a quorum does, and the nodes' errors.
func (k *lease) catchUp(ctx context.Context, behind []bool, fence int64, recorded int, end time.Time) (int, []error, error) {
	q := k.q
	fenceArg := strconv.FormatInt(fence, 10)
	sets := each(ctx, q, end.Sub(q.cfg.Clock.Now()), true, func(ctx context.Context, i int, d *deployment.Deployment) nodeGrant {
		if !behind[i] {
			return nodeGrant{node: i}
		}
		reply, err := d.Run(ctx, script.RedlockFence, false, []any{k.args[keys.LockKey], k.args[keys.CounterKey]}, k.arg,
			fenceArg, q.retention)
		return nodeGrant{node: i, ok: err == nil && reply == int64(1), err: err}
	})
	defer sets.stop()
	var errs []error
	for range q.nodes {
		if recorded >= q.n {
			break
		}
		s, more := sets.next()
		if !more {
			break
		}
		if s.ok {
			recorded++
		} else if s.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", q.nodes[s.node].Name(), s.err))
		}
	}
	return recorded, errs, ctx.Err()
}

// decideSplit asks the nodes that found the lock held again, up to three
// times within half the validity, when the attempt got the first node, which
// decides a split, but too few others.
func (q *Quorum) decideSplit(ctx context.Context, k *lease, start time.Time, validity time.Duration, v *vote) {
	if !slices.ContainsFunc(v.ok, func(g nodeGrant) bool { return g.node == 0 }) {
		return
	}
	end := start.Add(validity / 2)
	for round := 0; round < 3 && len(v.ok) < q.n && len(v.ok)+len(v.busy) >= q.n; round++ {
		answerTime := time.Duration(q.answerTime.Load())
		pause := max(200*time.Microsecond, answerTime)
		timeout := max(5*time.Millisecond, 2*answerTime)
		if q.cfg.Clock.Now().Add(pause + timeout).After(end) {
			return
		}
		t := q.cfg.Clock.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		q.askAgain(ctx, k, timeout, v)
	}
}

// askAgain asks the nodes v found busy for the grant again, within timeout;
// one that does not answer stays busy, and is given back on failure.
func (q *Quorum) askAgain(ctx context.Context, k *lease, timeout time.Duration, v *vote) {
	asked := v.busy
	ask := make([]bool, len(q.nodes))
	for _, g := range asked {
		ask[g.node] = true
	}
	v.busy = nil
	ttl := k.spec.TTL
	again := each(ctx, q, timeout, false, func(ctx context.Context, i int, _ *deployment.Deployment) nodeGrant {
		if !ask[i] {
			return nodeGrant{node: -1}
		}
		return k.grant(ctx, i, ttl, 0, "")
	})
	defer again.stop()
	for got := 0; got < len(asked); {
		g, more := again.next()
		if !more {
			break
		}
		if g.node < 0 {
			continue
		}
		v.take(g)
		ask[g.node] = false
		got++
	}
	for _, g := range asked {
		if ask[g.node] {
			v.busy = append(v.busy, g)
			v.answered[g.node] = false
		}
	}
}

// settle writes the fence, on a goroutine Tasks tracks until end at most, to
// the nodes whose grants came after the quorum's (pending replies), so that
// Inspect reads it there; no ordering rests on it.
func (k *lease) settle(grants *results[nodeGrant], pending int, fence int64, end time.Time) {
	if pending == 0 {
		return
	}
	q := k.q
	fenceArg := strconv.FormatInt(fence, 10)
	q.cfg.Tasks.Add()
	go func() {
		defer q.cfg.Tasks.Done()
		for range pending {
			g := <-grants.ch // every node's call sends its result, within its timeout
			if !g.ok || g.fence == fence || !q.cfg.Clock.Now().Before(end) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), end.Sub(q.cfg.Clock.Now()))
			_, _ = q.nodes[g.node].Run(ctx, script.RedlockFence, false, []any{k.args[keys.LockKey], k.args[keys.CounterKey]},
				k.arg, fenceArg, q.retention)
			cancel()
		}
	}()
}

// refused is the outcome of an attempt without a quorum: busy, misconfigured
// when refusals make a quorum impossible, else unavailable. The nodes that
// may hold it are cleaned up in the background and the token retired.
func (q *Quorum) refused(k *lease, v *vote) store.Attempt {
	var cleanup []int
	for _, g := range v.ok {
		cleanup = append(cleanup, g.node)
	}
	var misconfigured int
	var errs nodeErrs
	for _, g := range v.failed {
		if store.ClassOf(g.err) == store.Misconfigured {
			misconfigured++
		} else if !store.Unsent(g.err) {
			cleanup = append(cleanup, g.node) // it may have granted it
		}
		errs.add(q.nodes[g.node], g.err)
	}
	for i, a := range v.answered {
		if !a {
			cleanup = append(cleanup, i) // it may grant it yet
		}
	}
	retire := len(cleanup) > 0
	if retire {
		q.retire(k, cleanup)
	}
	spare := len(q.nodes) - q.n // how many nodes a quorum can do without
	// Unavailable only when fewer than a quorum could answer; else the lock
	// is held, on the nodes that answered busy and perhaps the others.
	reachable := len(v.ok) + len(v.busy) + misconfigured
	if len(v.busy) > spare || (reachable >= q.n && len(v.busy) > 0 && misconfigured == 0) {
		return k.busyVerdict(v.busy, retire)
	}
	class := store.Unavailable
	if misconfigured > 0 && reachable >= q.n {
		class = store.Misconfigured
	}
	msg := fmt.Sprintf("%d of %d nodes granted the lock, %d needed", len(v.ok), len(q.nodes), q.n)
	if len(v.busy) > 0 {
		msg += fmt.Sprintf(", %d held by another", len(v.busy))
	}
	if missing := len(q.nodes) - v.count(); missing > 0 {
		msg += fmt.Sprintf(", %d did not answer within the lock's validity", missing)
	}
	return store.Attempt{Retire: retire, Err: errs.error(class, msg)}
}

// busyVerdict is a busy attempt's outcome: the holder, the time until the
// lock is free on a quorum, and whether the first node put the call in line.
func (k *lease) busyVerdict(busy []nodeGrant, retire bool) store.Attempt {
	q := k.q
	c := k.call
	c.lined, c.ahead = false, -1
	pttls := make([]time.Duration, 0, len(busy))
	for _, g := range busy {
		if g.node == 0 && c.line != "" && g.ahead >= 0 {
			c.lined, c.ahead = true, g.ahead
		}
		pttls = append(pttls, g.pttl)
	}
	need := q.n - (len(q.nodes) - len(busy))
	return store.Attempt{Retire: retire, Busy: store.Busy{TTL: kthShortest(pttls, min(max(need, 1), len(pttls))), Owner: busy[0].owner}}
}

// kthShortest returns the k-th shortest of pttls, from 1, a negative one
// (no expiry) counting as the longest and returned as -1. It sorts pttls.
func kthShortest(pttls []time.Duration, k int) time.Duration {
	for i, p := range pttls {
		if p < 0 {
			pttls[i] = math.MaxInt64
		}
	}
	slices.Sort(pttls)
	if p := pttls[k-1]; p != math.MaxInt64 {
		return p
	}
	return -1
}

// retire gives back in the background what an attempt without a quorum may
// hold on nodes (all when nil), retiring its token so a late grant is refused.
func (q *Quorum) retire(k *lease, nodes []int) {
	if nodes == nil {
		nodes = make([]int, len(q.nodes))
		for i := range nodes {
			nodes[i] = i
		}
	}
	ttl := k.spec.TTL
	q.cfg.Tasks.GiveBack("clean-up of an attempt without a quorum", k.spec.Name, ttl, func(ctx context.Context) (bool, error) {
		out := make(chan nodeReply, len(nodes))
		for _, i := range nodes {
			d := q.nodes[i]
			q.cfg.Tasks.Add()
			go func() {
				defer q.cfg.Tasks.Done()
				// The call goes on waiting: it keeps its place in line.
				r, _, err := k.releaseNode(ctx, d, store.Abandon, ttl, "")
				out <- nodeReply{r: r, err: err}
			}()
		}
		var deleted bool
		var errs []error
		for range nodes {
			r := <-out
			deleted = deleted || r.r == store.Done
			if r.err != nil {
				errs = append(errs, r.err)
			}
		}
		if len(errs) > 0 { // tried again, on the same nodes: it is idempotent
			return deleted, &quorumError{class: store.Unavailable,
				msg: fmt.Sprintf("%d nodes did not answer the clean-up", len(errs)), errs: errs}
		}
		return deleted, nil
	})
}
