package fencelock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/redis/go-redis/v9"
)

// NewRedlock returns a Locker whose locks are held on a quorum of
// independent Redis deployments, the Redlock algorithm with fences ordered
// without trusting clocks ("How Redlock works"), its leases used as New's. A
// lock is held when len(clients)/2+1 deployments granted it within its
// validity; a minority down or hung is not an outage. Use an odd number (four
// tolerate the loss of one, as three do), none a replica of another or a node
// of the same Cluster, given in the same order in every process: waiters wait
// in line on the first. It returns an error matching ErrInvalid, with no Redis
// call, for no clients or more than 64, a nil client, the same client twice,
// or an option it cannot honour. It adds New's dial hook to every client.
func NewRedlock(clients []redis.UniversalClient, opts *Options) (*Locker, error) {
	if len(clients) == 0 {
		return nil, invalidf("no redis clients")
	}
	if len(clients) > 64 {
		return nil, invalidf("%d redis clients: at most 64", len(clients))
	}
	for i, c := range clients {
		if isNil(c) {
			return nil, invalidf("redis client %d is nil", i)
		}
		if err := checkClient(c); err != nil {
			return nil, fmt.Errorf("redis client %d: %w", i, err)
		}
		for j := range i {
			if clients[j] == c {
				return nil, invalidf("redis clients %d and %d are the same client", j, i)
			}
		}
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := newLocker(o)
	q := &quorum{l: l, n: len(clients)/2 + 1, entryTTL: ttlMillis(lineEntryTTL(o.MaxRetryBackoff))}
	for i, c := range clients {
		d := newDeployment(l, c)
		d.name = "node " + strconv.Itoa(i)
		if rc, ok := c.(*redis.Client); ok {
			d.name += " (" + rc.Options().Addr + ")"
		}
		q.nodes = append(q.nodes, d)
	}
	l.rl, l.traits = q, traits{deadlines: true, stops: true}
	for _, d := range q.nodes {
		l.traits.deadlines = l.traits.deadlines && d.deadlines
	}
	var tag [4]byte
	_, _ = rand.Read(tag[:])
	l.lineTag = hex.EncodeToString(tag[:])
	l.b = q
	return l, nil
}

// A quorum is the backend of NewRedlock: every call goes to all nodes in
// parallel, each bounded so that a hung node cannot hold the others up, and
// counts when n of them agree (results.collect).
type quorum struct {
	l     *Locker
	nodes []*deployment
	n     int // how many nodes make a quorum

	answerTime atomic.Int64 // how long a quorum took to answer a grant, lately (a moving average, ns)
	entryTTL   any          // how long a line entry lives without an attempt (see lineEntryTTL), milliseconds, boxed
}

var _ backend = (*quorum)(nil)

// quorumError is the error of a call that did not get a quorum: its class
// is the verdict on the whole (busy nodes are not an outage; a minority
// unreachable is not one either).
type quorumError struct {
	class errClass
	msg   string
	errs  []error
}

func (e *quorumError) Error() string   { return e.msg }
func (e *quorumError) Unwrap() []error { return e.errs }

// nodeErrs are the nodes' errors of one call, for its quorumError.
type nodeErrs struct {
	errs  []error
	parts []string
}

func (e *nodeErrs) add(d *deployment, err error) {
	e.errs = append(e.errs, err)
	e.parts = append(e.parts, d.name+": "+oneLine(err.Error()))
}

// error returns a quorumError of class: msg, then each node's error.
func (e *nodeErrs) error(class errClass, msg string) *quorumError {
	if len(e.parts) > 0 {
		msg += ": " + strings.Join(e.parts, "; ")
	}
	return &quorumError{class: class, msg: msg, errs: e.errs}
}

// each runs f on every node in parallel, on goroutines the Locker tracks,
// with a context bounded by timeout that ends when every call has returned,
// not when the caller stops reading (a straggler's grant is part of the
// lease, released with it), and with detach not with ctx either.
func each[T any](ctx context.Context, q *quorum, timeout time.Duration, detach bool, f func(ctx context.Context, i int, d *deployment) T) *results[T] {
	base := ctx
	if detach {
		base = context.WithoutCancel(ctx)
	}
	nctx, cancel := context.WithTimeout(base, timeout)
	var left atomic.Int32
	left.Store(int32(len(q.nodes)))
	returned := func() {
		if left.Add(-1) == 0 {
			cancel()
		}
	}
	r := &results[T]{ch: make(chan T, len(q.nodes)), n: len(q.nodes), ctx: ctx, timer: q.l.clock.NewTimer(timeout),
		clock: q.l.clock, start: q.l.clock.Now()}
	for i, d := range q.nodes {
		q.l.bg.Add()
		go func() {
			defer q.l.bg.Done()
			defer returned()
			r.ch <- f(nctx, i, d)
		}()
	}
	return r
}

// results are the nodes' results of each, as they come.
type results[T any] struct {
	ch     chan T // buffered: no node's goroutine waits for the reader
	n      int    // how many results come: one per node
	ctx    context.Context
	closed <-chan struct{} // an attempt's: the Locker's Close stops the reading too
	timer  *time.Timer     // the calls' timeout
	clock  Clock
	start  time.Time // when the calls began, on clock
}

// collect passes the results to take as they come, until every node has
// answered, the timeout has passed or the caller's context has ended, or
// for a grace (see quorumGrace) once take has reported the outcome decided:
// the nodes that answer within it have applied the call when it returns,
// and a hung node holds it up no longer. take must go on reporting true
// once it has.
func (r *results[T]) collect(take func(T) (decided bool)) {
	var grace <-chan time.Time
	for range r.n {
		v, more := r.nextOr(grace)
		if !more {
			return
		}
		if take(v) && grace == nil {
			t := r.clock.NewTimer(quorumGrace(r.clock.Now().Sub(r.start)))
			defer t.Stop()
			grace = t.C
		}
	}
}

// quorumGrace is how long the nodes that have not answered get once a call
// is decided, took after it began: about one more round trip (twice took,
// at least minGrace, at most maxGrace), so that the healthy ones have
// answered when the call returns.
func quorumGrace(took time.Duration) time.Duration {
	return min(max(minGrace, 2*took), maxGrace)
}

// Bounds of quorumGrace: minGrace leaves room for a reply on its way on a
// busy machine; maxGrace bounds what a hung minority costs every call.
const (
	minGrace = 5 * time.Millisecond
	maxGrace = 100 * time.Millisecond
)

// next returns the next result, or false once the timeout has passed or the
// caller's context has ended.
func (r *results[T]) next() (T, bool) { return r.nextOr(nil) }

// nextOr is next, also ending when or fires. A result already there comes
// first.
func (r *results[T]) nextOr(or <-chan time.Time) (T, bool) {
	select {
	case v := <-r.ch:
		return v, true
	default:
	}
	select {
	case v := <-r.ch:
		return v, true
	case <-r.timer.C:
	case <-r.ctx.Done():
	case <-r.closed:
	case <-or:
	}
	var zero T
	return zero, false
}

func (r *results[T]) stop() { r.timer.Stop() }

// nodeGrant is one node's reply to redlock_grant.lua.
type nodeGrant struct {
	node  int
	ok    bool
	pttl  time.Duration // the holder's, when busy
	owner string        // the holder's, when busy
	fence int64         // stored with the lock on this node, when ok
	ahead int64         // when busy: how many are ahead of the attempt's call in the node's line; -1: not in it
	err   error
}

// grant runs redlock_grant.lua on the node: an attempt's phase 1 with fence
// 0, a repair with the lease's fence otherwise. With a line id, the attempt
// joins (or keeps its place in) the node's line when the lock is busy, and
// leaves it when it is granted (see line).
func (d *deployment) grant(ctx context.Context, lease *Lease, ttl time.Duration, fence int64, lineID string, entryTTL any) nodeGrant {
	reply, err := d.run(ctx, script.RedlockGrant, false, lease.keyArgs[:], lease.tokenArg,
		ttlMillis(ttl), strconv.FormatInt(fence, 10), lease.ownerArg, d.l.retentionMillis, lineID, entryTTL)
	if err != nil {
		// With Options.Replicas, too few replicas count as no grant; a
		// busy answer (which wrote only the line) stands.
		if g := decodeGrant(reply); isReplicaShort(err) && g.err == nil && !g.ok {
			return g
		}
		return nodeGrant{err: err}
	}
	return decodeGrant(reply)
}

// releaseNode runs redlock_release.lua on the node in mode (modeRelease or
// modeAbandon), which also takes the call lineID out of the node's line
// ("" for none; see line). Its marker refuses a late attempt for as long as
// the lock would live, whatever the mode: a grant still in flight to a slow
// node must not take the lock.
func (d *deployment) releaseNode(ctx context.Context, lease *Lease, mode, lineID string) (int64, error, error) {
	keys := []any{lease.keyArgs[keys.LockKey], lease.keyArgs[keys.MarkerKey], lease.keyArgs[keys.QueueKey], lease.keyArgs[keys.QueueInfoKey]}
	argv := []any{lease.tokenArg, d.channelArg(lease), modeArg(mode), d.abandonMarkerMillis(lease)}
	if lineID != "" {
		argv = append(argv, lineID)
	}
	reply, err := evalScript(ctx, d.client, script.RedlockRelease, false, keys, argv).Result()
	if err != nil {
		return 0, nil, err
	}
	return decodeRelease(reply)
}

// decodeGrant decodes redlock_grant.lua's reply.
func decodeGrant(reply any) nodeGrant {
	arr, _ := reply.([]any)
	flag := int64(-1)
	if len(arr) > 0 {
		flag, _ = arr[0].(int64)
	}
	switch {
	case flag == 1 && len(arr) == 3:
		f, _ := arr[1].(string)
		if fence, err := strconv.ParseInt(f, 10, 64); err == nil {
			return nodeGrant{ok: true, fence: fence}
		}
	case flag == 0 && (len(arr) == 3 || len(arr) == 4):
		pttl, isInt := arr[1].(int64)
		owner, isStr := arr[2].(string)
		g := nodeGrant{pttl: time.Duration(pttl) * time.Millisecond, owner: owner, ahead: -1}
		inLine := true
		if len(arr) == 4 {
			g.ahead, inLine = arr[3].(int64)
		}
		if isInt && isStr && inLine {
			return g
		}
	case flag == 2 && len(arr) == 1:
		return nodeGrant{err: errRetired}
	}
	return nodeGrant{err: fmt.Errorf("%w from the grant script: %v", errReply, reply)}
}

// acquire takes the lock on a quorum and issues its fence: phase 1 grants
// the lock on every node, each counting its fence counter on; the fence is
// the largest value the granting nodes counted to, and phase 2 writes it to
// those that counted to less, until a quorum has it (why this orders fences
// without trusting clocks: GUARANTEES.md, "How Redlock works"). The lease
// exists when a quorum has the fence within the validity.
func (q *quorum) acquire(ctx context.Context, lease *Lease) attempt {
	ttl := lease.ttl // read here: the node calls may outlive the attempt, and a renewal sets it
	validity := ttl - drift(ttl)
	start := q.l.clock.Now()
	// A grant after the validity is of no use. The node calls are
	// detached from ctx, which ends with the attempt (AttemptTimeout):
	// the grants that come after it returns are read by settle, or given
	// back by the clean-up of an Acquire that gives up.
	grants := each(ctx, q, validity, true, func(ctx context.Context, i int, _ *deployment) nodeGrant {
		lineID := ""
		if i == 0 {
			lineID = lease.line // the line is kept on the first node
		}
		return q.grantNode(ctx, lease, ttl, i, lineID)
	})
	grants.closed = q.l.closed
	defer grants.stop()
	var ok, busy, failed []nodeGrant
	answered := make([]bool, len(q.nodes))
	take := func(g nodeGrant) {
		answered[g.node] = true
		sortGrant(g, &ok, &busy, &failed)
	}
	// Collect until a quorum granted, a quorum is out of reach, or every
	// node answered; once a quorum has answered, the others get quorumGrace,
	// not the validity: a hung minority must not hold an attempt for a TTL.
	// (Unlike results.collect, a granted quorum ends the wait at once.)
	var straggle <-chan time.Time
	for len(ok) < q.n && len(busy)+len(failed) <= len(q.nodes)-q.n && len(ok)+len(busy)+len(failed) < len(q.nodes) {
		if straggle == nil && len(ok)+len(busy)+len(failed) >= q.n {
			t := q.l.clock.NewTimer(quorumGrace(q.l.clock.Now().Sub(start)))
			defer t.Stop()
			straggle = t.C
		}
		g, more := grants.nextOr(straggle)
		if !more {
			break
		}
		take(g)
	}
	if err := ctx.Err(); err != nil && len(failed) == 0 {
		return attempt{err: err} // no verdict: Acquire cleans up if it gives up
	}
	if len(ok)+len(busy)+len(failed) >= q.n {
		took := int64(q.l.clock.Now().Sub(start))
		if old := q.answerTime.Load(); old > 0 {
			took = old + (took-old)/8
		}
		q.answerTime.Store(took)
	}
	if len(ok) < q.n {
		// No quorum. The replies still on their way usually come within a
		// round trip: wait a little for them, so that a node that will not
		// grant the lock needs no clean-up.
		grace := q.l.clock.NewTimer(quorumGrace(q.l.clock.Now().Sub(start)))
	wait:
		for len(ok)+len(busy)+len(failed) < len(q.nodes) {
			select {
			case g := <-grants.ch:
				take(g)
			case <-grace.C:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		grace.Stop()
		ok, busy, failed = q.decideSplit(ctx, lease, start, validity, ok, busy, failed, answered)
		if len(ok) < q.n {
			return q.refused(lease, ok, busy, failed, answered)
		}
	}

	// Phase 2 is waited for only until a quorum has the fence; nodes that
	// counted in step (the usual case) need none.
	var fence int64
	for _, g := range ok {
		fence = max(fence, g.fence)
	}
	fenceArg := strconv.FormatInt(fence, 10)
	behind := make([]bool, len(q.nodes))
	var recorded, lagging int
	for _, g := range ok {
		if g.fence == fence {
			recorded++
		} else {
			behind[g.node] = true
			lagging++
		}
	}
	var errs []error
	if lagging > 0 {
		// Detached: a caller that gives up must not leave a node behind.
		sets := each(ctx, q, start.Add(validity).Sub(q.l.clock.Now()), true, func(ctx context.Context, i int, d *deployment) nodeGrant {
			if !behind[i] {
				return nodeGrant{node: i}
			}
			reply, err := d.run(ctx, script.RedlockFence, false, []any{lease.keyArgs[keys.LockKey], lease.keyArgs[keys.CounterKey]}, lease.tokenArg,
				fenceArg, q.l.retentionMillis)
			return nodeGrant{node: i, ok: err == nil && reply == int64(1), err: err}
		})
		defer sets.stop()
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
				errs = append(errs, fmt.Errorf("%s: %w", q.nodes[s.node].name, s.err))
			}
		}
		if err := ctx.Err(); err != nil {
			return attempt{err: err}
		}
	}
	if recorded < q.n || !q.l.clock.Now().Before(start.Add(validity)) {
		msg := fmt.Sprintf("the fence reached %d of %d nodes within the lock's validity %v", recorded, len(q.nodes), validity)
		if lagging == 0 {
			msg = fmt.Sprintf("a quorum granted the lock after its validity %v", validity)
		}
		q.retire(lease, nil)
		return attempt{retire: true, free: true, err: &quorumError{class: classUnavailable, msg: msg, errs: errs}}
	}
	q.settle(lease, grants, len(q.nodes)-len(ok)-len(busy)-len(failed), fence, start.Add(validity))
	return attempt{ok: true, fence: fence}
}

// decideSplit asks the nodes that found the lock held again, up to three
// times within half the validity, when the attempt got the first node but
// too few others and could still get a quorum: the first node decides a
// split (GUARANTEES.md, "How Redlock works").
func (q *quorum) decideSplit(ctx context.Context, lease *Lease, start time.Time, validity time.Duration, ok, busy, failed []nodeGrant, answered []bool) ([]nodeGrant, []nodeGrant, []nodeGrant) {
	if !slices.ContainsFunc(ok, func(g nodeGrant) bool { return g.node == 0 }) {
		return ok, busy, failed
	}
	end, ttl := start.Add(validity/2), lease.ttl
	for round := 0; round < 3 && len(ok) < q.n && len(ok)+len(busy) >= q.n; round++ {
		answerTime := time.Duration(q.answerTime.Load())
		pause := max(200*time.Microsecond, answerTime)
		timeout := max(5*time.Millisecond, 2*answerTime)
		if q.l.clock.Now().Add(pause + timeout).After(end) {
			break
		}
		t := q.l.clock.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ok, busy, failed
		case <-t.C:
		}
		asked := busy
		ask := make([]bool, len(q.nodes))
		for _, g := range asked {
			ask[g.node] = true
		}
		busy = nil
		again := each(ctx, q, timeout, false, func(ctx context.Context, i int, _ *deployment) nodeGrant {
			if !ask[i] {
				return nodeGrant{node: -1}
			}
			return q.grantNode(ctx, lease, ttl, i, "")
		})
		for got := 0; got < len(asked); {
			g, more := again.next()
			if !more {
				break
			}
			if g.node < 0 {
				continue
			}
			sortGrant(g, &ok, &busy, &failed)
			ask[g.node] = false
			answered[g.node] = true
			got++
		}
		again.stop()
		for _, g := range asked {
			if ask[g.node] { // no answer: busy still; given back on failure (it may grant)
				busy = append(busy, g)
				answered[g.node] = false
			}
		}
	}
	return ok, busy, failed
}

// grantNode is an attempt's grant (phase 1) on node i, which the lease then
// holds there if it granted it.
func (q *quorum) grantNode(ctx context.Context, lease *Lease, ttl time.Duration, i int, lineID string) nodeGrant {
	g := q.nodes[i].grant(ctx, lease, ttl, 0, lineID, q.entryTTL)
	g.node = i
	if g.ok {
		lease.held.Or(1 << i)
	}
	return g
}

// sortGrant adds a node's answer to a grant to those that granted it,
// failed, or found the lock held.
func sortGrant(g nodeGrant, ok, busy, failed *[]nodeGrant) {
	switch {
	case g.ok:
		*ok = append(*ok, g)
	case g.err != nil:
		*failed = append(*failed, g)
	default:
		*busy = append(*busy, g)
	}
}

// settle writes the fence, in the background, to the nodes whose grants
// came after the quorum's were read (pending replies), which stored what
// their own counters reached: so that Inspect reads the lease's fence there
// and a counter behind it is raised. It stops at end, the lease's validity;
// no ordering rests on it: a quorum had the fence before Acquire returned.
func (q *quorum) settle(lease *Lease, grants *results[nodeGrant], pending int, fence int64, end time.Time) {
	if pending == 0 {
		return
	}
	fenceArg := strconv.FormatInt(fence, 10)
	q.l.bg.Add()
	go func() {
		defer q.l.bg.Done()
		for range pending {
			g := <-grants.ch // every node's call sends its result, within its timeout
			if !g.ok || g.fence == fence || !q.l.clock.Now().Before(end) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), end.Sub(q.l.clock.Now()))
			_, _ = q.nodes[g.node].run(ctx, script.RedlockFence, false, []any{lease.keyArgs[keys.LockKey], lease.keyArgs[keys.CounterKey]},
				lease.tokenArg, fenceArg, q.l.retentionMillis)
			cancel()
		}
	}()
}

// refused is the outcome of an attempt that got no quorum: busy when enough
// nodes are held by another, misconfigured when refusals make a quorum
// impossible, unavailable otherwise. The nodes that granted it, and those
// whose answer is not known, are cleaned up in the background, and the
// token retired: the next attempt needs a new one.
func (q *quorum) refused(lease *Lease, ok, busy, failed []nodeGrant, answered []bool) attempt {
	var cleanup []int
	for _, g := range ok {
		cleanup = append(cleanup, g.node)
	}
	var misconfigured int
	var errs nodeErrs
	for _, g := range failed {
		if classify(g.err) == classMisconfigured {
			misconfigured++
		} else if !notSent(g.err) {
			cleanup = append(cleanup, g.node) // it may have granted it
		}
		errs.add(q.nodes[g.node], g.err)
	}
	for i, a := range answered {
		if !a {
			cleanup = append(cleanup, i) // it may grant it yet
		}
	}
	retire := len(cleanup) > 0
	if retire {
		q.retire(lease, cleanup)
	}
	spare := len(q.nodes) - q.n // how many nodes a quorum can do without
	if len(busy) > spare {
		return q.busyVerdict(busy, retire, lease.line != "")
	}
	// Unavailable only when fewer than a quorum of nodes could answer: a
	// minority down is not an outage. Otherwise the lock is held, on the
	// nodes that answered busy and perhaps on those that did not.
	reachable := len(ok) + len(busy) + misconfigured
	if reachable >= q.n && len(busy) > 0 && misconfigured == 0 {
		return q.busyVerdict(busy, retire, lease.line != "")
	}
	class := classUnavailable
	if misconfigured > 0 && reachable >= q.n {
		class = classMisconfigured
	}
	msg := fmt.Sprintf("%d of %d nodes granted the lock, %d needed", len(ok), len(q.nodes), q.n)
	if len(busy) > 0 {
		msg += fmt.Sprintf(", %d held by another", len(busy))
	}
	if missing := len(q.nodes) - len(ok) - len(busy) - len(failed); missing > 0 {
		msg += fmt.Sprintf(", %d did not answer within the lock's validity", missing)
	}
	return attempt{retire: retire, err: errs.error(class, msg)}
}

// busyVerdict is a busy attempt's outcome: the holder's owner, the time
// until the lock is free on a quorum (when this many of the busy nodes have
// let it expire), and, for an attempt with a line id (inLine), whether the
// first node found it busy: the attempt's Acquire is then in that node's
// line.
func (q *quorum) busyVerdict(busy []nodeGrant, retire, inLine bool) attempt {
	var lined bool
	ahead := int64(-1)
	pttls := make([]time.Duration, 0, len(busy))
	for _, g := range busy {
		if g.node == 0 && inLine && g.ahead >= 0 {
			lined, ahead = true, g.ahead
		}
		pttls = append(pttls, g.pttl)
	}
	k := q.n - (len(q.nodes) - len(busy))
	return attempt{pttl: kthShortest(pttls, min(max(k, 1), len(pttls))), owner: busy[0].owner, retire: retire, lined: lined, ahead: ahead}
}

// kthShortest returns the k-th shortest of pttls, from 1, a negative one (no
// expiry) counting as the longest and returned as -1. It sorts pttls.
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

// retire gives back, in the background, what an attempt without a quorum
// may hold on nodes (all nodes when nodes is nil), and retires its token
// there, so that a grant still on its way is refused.
func (q *quorum) retire(lease *Lease, nodes []int) {
	if nodes == nil {
		nodes = make([]int, len(q.nodes))
		for i := range nodes {
			nodes[i] = i
		}
	}
	q.l.giveBack(lease, "clean-up of an attempt without a quorum", func(ctx context.Context) (bool, error) {
		out := make(chan nodeReply, len(nodes))
		for _, i := range nodes {
			d := q.nodes[i]
			q.l.bg.Add()
			go func() {
				defer q.l.bg.Done()
				// The call goes on waiting: it keeps its place in line.
				code, _, err := d.releaseNode(ctx, lease, modeAbandon, "")
				out <- nodeReply{code: code, err: err}
			}()
		}
		var deleted bool
		var errs []error
		for range nodes {
			r := <-out
			deleted = deleted || r.code == 1
			if r.err != nil {
				errs = append(errs, r.err)
			}
		}
		if len(errs) > 0 { // tried again, on the same nodes: it is idempotent
			return deleted, &quorumError{class: classUnavailable,
				msg: fmt.Sprintf("%d nodes did not answer the clean-up", len(errs)), errs: errs}
		}
		return deleted, nil
	})
}

// nodeReply is one node's answer to an extension or a release: its code (1:
// extended or taken back, or deleted; 0: absent; -1: another's) and errors.
type nodeReply struct {
	node      int
	code      int64
	perr, err error // perr: a release's publishing error
}

func (q *quorum) extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error) {
	// A node that lost the lock, or never got it, is given it back where it
	// is free ("How Redlock works"): before the deadline the lease still
	// holds a quorum, so no one else can hold one. Detached: every node is
	// extended, also after the quorum has answered.
	//
	// A repair never stores a fence older than a node has seen: the node
	// refuses it (as taken meanwhile) where its counter is beyond the
	// lease's fence (redlock_grant.lua), so a repair that reaches it after
	// the deadline, once another lease was granted and released there,
	// does not put the lock back with a stale fence. That check, on the
	// node, is the rule; the deadline, read again right before each
	// repair, only spares the calls that cannot be of use. A legitimate
	// repair refused so (the counter raised by another Locker's attempt
	// that got no quorum, or by this lease's own late grant) costs that
	// node only: the lease still holds its quorum on the others. A node
	// restarted empty has no counter and is repaired.
	fence := lease.fence
	exts := each(ctx, q, ttl-drift(ttl), true, func(ctx context.Context, i int, d *deployment) nodeReply {
		code, err := d.extend(ctx, lease, ttl, renewal)
		if err == nil && code == 0 && q.l.clock.Now().Before(lease.Deadline()) {
			if g := d.grant(ctx, lease, ttl, fence, "", q.entryTTL); g.ok {
				code = 1
			} else if g.err == nil {
				code = -1 // taken meanwhile
			} else if isReplicaShort(g.err) {
				err = g.err // repaired, but too few replicas have it
			}
		}
		if code == 1 {
			lease.held.Or(1 << i)
		}
		return nodeReply{node: i, code: code, err: err}
	})
	defer exts.stop()
	var ours, other, gone int
	var errs nodeErrs
	exts.collect(func(e nodeReply) bool {
		switch {
		case e.err != nil:
			errs.add(q.nodes[e.node], e.err)
		case e.code == 1:
			ours++
		case e.code == 0:
			gone++
		default:
			other++
		}
		return ours >= q.n || other+gone > len(q.nodes)-q.n
	})
	switch {
	case ours >= q.n:
		return 1, nil
	case other+gone > len(q.nodes)-q.n:
		if other > 0 {
			return -1, nil
		}
		return 0, nil
	case ctx.Err() != nil:
		return 0, ctx.Err()
	}
	msg := fmt.Sprintf("the lock's expiry was set on %d of %d nodes, %d needed", ours, len(q.nodes), q.n)
	return 0, errs.error(classUnavailable, msg)
}

func (q *quorum) release(ctx context.Context, lease *Lease, mode string) (int64, error, error) {
	// Every node gets the release, also after the result is known.
	rels := each(ctx, q, q.l.opts.ReleaseTimeout, true, func(ctx context.Context, i int, d *deployment) nodeReply {
		lineID := ""
		if i == 0 {
			lineID = lease.line // the lease's Acquire, or one that gave up, is out of line
		}
		code, perr, err := d.releaseNode(ctx, lease, mode, lineID)
		return nodeReply{node: i, code: code, perr: perr, err: err}
	})
	defer rels.stop()
	var deleted, other, gone, maybe int
	var perr error
	var errs nodeErrs
	held := lease.held.Load()
	answered := make([]bool, len(q.nodes))
	// Decided when the lease held it on a quorum, or cannot have.
	rels.collect(func(r nodeReply) bool {
		answered[r.node] = true
		switch {
		case r.err != nil:
			errs.add(q.nodes[r.node], r.err)
			if held&(1<<r.node) != 0 {
				maybe++ // it held the lock, and may still
			}
		case r.code == 1:
			deleted++
			if perr == nil {
				perr = r.perr
			}
		case r.code == 0:
			gone++
		default:
			other++
		}
		return deleted >= q.n || other+gone > len(q.nodes)-q.n
	})
	for i, a := range answered {
		if !a && held&(1<<i) != 0 {
			maybe++ // no answer in time from a node that held it
		}
	}
	// Held only if still held on a quorum ("How Redlock works"); a node
	// that did not answer counts only if it ever confirmed holding the lock.
	switch {
	case deleted >= q.n:
		return 1, perr, nil
	case deleted+maybe >= q.n && ctx.Err() != nil:
		return 0, nil, ctx.Err()
	case deleted+maybe < q.n && other > 0:
		return -1, nil, nil
	case deleted+maybe < q.n:
		return 0, nil, nil
	}
	msg := fmt.Sprintf("%d of %d nodes released the lock, %d needed to know it was held", deleted, len(q.nodes), q.n)
	return 0, nil, errs.error(classUnavailable, msg)
}

func (q *quorum) close(by time.Time) {
	for _, d := range q.nodes {
		d.close(by)
	}
}
