package fencelock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/tasks"
)

// LockInfo is what Locker.Inspect found about a lock.
type LockInfo struct {
	Name      string
	Held      bool
	Owner     string        // the holder's Options.Owner or WithOwner; "" when not held or not stored
	TTL       time.Duration // left on the server; 0 when not held, -1 when the lock has no expiry
	Fence     int64         // the fence of the current holding; 0 when not held
	LastFence int64         // the last fence issued, kept for FenceRetention; 0 if none (Redlock: "How Redlock works")
	Waiters   int           // how many Lockers wait for the lock's release, each counted once
}

// Inspect reads the lock called name, changing nothing; on a Redlock, the
// holding a quorum agree on. It returns ErrInvalid for a bad name, ErrUnavailable
// (on a Redlock, no quorum answered within Options.ReleaseTimeout) or
// ErrMisconfigured, or an error matching ctx.Err().
func (l *Locker) Inspect(ctx context.Context, name string) (LockInfo, error) {
	if err := l.usable(); err != nil {
		return LockInfo{}, err
	}
	if err := checkName(name); err != nil {
		return LockInfo{}, err
	}
	key, fenceKey := l.keys(name)
	h, err := l.read(ctx, name, fmt.Sprintf("inspect %q", name), func(ctx context.Context) (holding, error) {
		return l.b.inspect(ctx, key, fenceKey, true)
	})
	if err != nil {
		return LockInfo{}, err
	}
	info := LockInfo{Name: name, LastFence: h.counter, Waiters: h.waiters}
	if h.value != "" {
		_, info.Fence, info.Owner = keys.Parse(h.value)
		info.Held, info.TTL = true, h.pttl
	}
	return info, nil
}

// TTL returns how long the server keeps the lock if this lease still holds it
// (-1: no expiry; on a Redlock, the longest a quorum keeps it), changing
// nothing. It returns ErrNotHeld when it does not, and on a nil or degraded
// lease; ErrUnavailable or ErrMisconfigured; or an error matching ctx.Err().
func (l *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if l == nil || l.locker == nil || l.degraded {
		return 0, ErrNotHeld
	}
	h, err := l.locker.read(ctx, l.name, "ttl", func(ctx context.Context) (holding, error) {
		if o, ok := l.kind.(ownKeys); ok { // a semaphore's permit, ...
			return o.holding(ctx, l)
		}
		return l.locker.b.inspect(ctx, l.keys[keys.LockKey], l.keys[keys.CounterKey], false)
	})
	if err != nil {
		return 0, err
	}
	token, _, _ := keys.Parse(h.value)
	switch {
	case h.value == "":
		return 0, errGone
	case token != l.token:
		return 0, errTakenBy
	}
	return h.pttl, nil
}

// read runs f, a read of the lock called name (see backend.inspect),
// returning when ctx ends whatever the client's options; what names the
// call in the error then.
func (l *Locker) read(ctx context.Context, name, what string, f func(ctx context.Context) (holding, error)) (holding, error) {
	type result struct {
		h   holding
		err error
	}
	res, done := tasks.Call(l.bg, ctx.Done(), nil, func() result {
		h, err := f(ctx)
		return result{h, err}
	}, nil)
	switch {
	case !done || (res.err != nil && (classify(res.err) == classNoVerdict || ctxErr(ctx) != nil)):
		return holding{}, ctxEnded(ctx, what)
	case res.err != nil:
		return holding{}, callError(name, res.err)
	}
	return res.h, nil
}

// holding is what one read of a lock found.
type holding struct {
	value   string        // the lock's value; "" when not held
	pttl    time.Duration // when held; -1: no expiry
	counter int64         // the fence counter; 0 when none
	waiters int
}

// inspect reads the lock at key and its fence counter in one step, then,
// with waiters, counts the subscribers of its channel.
func (d *deployment) inspect(ctx context.Context, key, fenceKey string, waiters bool) (holding, error) {
	reply, err := evalScript(ctx, d.client, script.Inspect, false, []any{key, fenceKey}, nil).Slice()
	if err != nil {
		return holding{}, err
	}
	value, ok1 := reply[0].(string)
	pttl, ok2 := reply[1].(int64)
	counter, ok3 := reply[2].(string)
	if len(reply) != 3 || !ok1 || !ok2 || !ok3 {
		return holding{}, fmt.Errorf("%w from the inspect script: %v", errReply, reply)
	}
	h := holding{value: value, pttl: time.Duration(pttl) * time.Millisecond}
	if pttl < 0 {
		h.pttl = -1
	}
	h.counter, _ = strconv.ParseInt(counter, 10, 64)
	if waiters {
		h.waiters, err = d.subscribers(ctx, d.channel(key))
	}
	return h, err
}

// subscribers counts the connections subscribed to channel on the node that
// serves it: sharded, or classic on a server without sharded pub/sub.
func (d *deployment) subscribers(ctx context.Context, channel string) (int, error) {
	node, err := d.node(ctx, channel)
	if err != nil {
		return 0, err
	}
	n, err := node.PubSubShardNumSub(ctx, channel).Result()
	if err != nil && isUnknownCommand(err) {
		n, err = node.PubSubNumSub(ctx, channel).Result()
	}
	if err != nil {
		return 0, err
	}
	return int(n[channel]), nil
}

// inspect reads the lock on every node and reports the holding a quorum
// agrees on. It is unavailable when the nodes that answered in time cannot
// tell: a quorum answered, but the lock's holding on the others could still
// make one.
func (q *quorum) inspect(ctx context.Context, key, fenceKey string, waiters bool) (holding, error) {
	type read struct {
		h   holding
		err error
	}
	reads := each(ctx, q, q.l.opts.ReleaseTimeout, false, func(ctx context.Context, _ int, d *deployment) read {
		h, err := d.inspect(ctx, key, fenceKey, waiters)
		return read{h, err}
	})
	defer reads.stop()
	var (
		out      holding
		errs     []error
		byToken  = map[string][]holding{}
		counters []int64
		most     int // the most reads of one token
	)
	// Decided when a quorum holds the lock for one token, or no token can
	// have a quorum any more, given the nodes yet to answer, and a quorum's
	// counters were read (for LastFence); or when too many nodes failed for
	// a quorum to answer (see collect). A quorum of answers is not enough:
	// the first ones may be the nodes that do not hold the lock, and a
	// holder a little slower than they are is no hung minority.
	decided := func() bool {
		pending := len(q.nodes) - len(counters) - len(errs)
		return most >= q.n || (len(counters) >= q.n && most+pending < q.n) || len(errs) > len(q.nodes)-q.n
	}
	reads.collect(func(r read) bool {
		if r.err != nil {
			errs = append(errs, r.err)
		} else {
			counters = append(counters, r.h.counter)
			out.waiters = max(out.waiters, r.h.waiters)
			if token, _, _ := keys.Parse(r.h.value); r.h.value != "" {
				byToken[token] = append(byToken[token], r.h)
				most = max(most, len(byToken[token]))
			}
		}
		return decided()
	})
	if len(counters) < q.n || !decided() { // errors, or nodes that did not answer in time
		if err := ctx.Err(); err != nil {
			return holding{}, err
		}
		class := classUnavailable
		if len(errs) > 0 {
			class = classify(errors.Join(errs...))
		}
		msg := fmt.Sprintf("%d of %d nodes answered, %d needed", len(counters), len(q.nodes), q.n)
		if len(counters) >= q.n {
			msg = fmt.Sprintf("%d of %d nodes answered, too few to know whether a quorum holds the lock (%d of them for one token, %d needed)",
				len(counters), len(q.nodes), most, q.n)
		}
		return holding{}, &quorumError{class: class, errs: errs, msg: msg}
	}
	// The q-th largest counter: a quorum's counters are at least the last
	// fence issued, and an attempt may have counted a minority further.
	slices.Sort(counters)
	out.counter = counters[len(counters)-q.n]
	for _, hs := range byToken {
		if len(hs) < q.n {
			continue
		}
		// Held while a quorum keeps it: the q-th longest TTL. Its fence is
		// the one most of its nodes store (a quorum did before Acquire
		// returned; others may still store their own counter's, see
		// quorum.settle), the larger on a tie.
		pttls := make([]time.Duration, 0, len(hs))
		fences := map[int64]int{}
		var best holding
		var bestFence int64
		for _, h := range hs {
			pttls = append(pttls, h.pttl)
			_, f, _ := keys.Parse(h.value)
			fences[f]++
			if n, bn := fences[f], fences[bestFence]; best.value == "" || n > bn || (n == bn && f > bestFence) {
				best, bestFence = h, f
			}
		}
		out.value, out.pttl = best.value, kthShortest(pttls, len(pttls)-q.n+1)
	}
	return out, nil
}
