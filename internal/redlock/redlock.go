// Package redlock is the store of NewRedlock: a lock held on a quorum of
// independent Redis deployments, with fences ordered without trusting clocks
// (GUARANTEES.md, "How Redlock works", tells the algorithm once). Calls go to
// every node in parallel (each.go); an attempt is acquire.go, a waiting
// call's line on the first node line.go.
package redlock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/store"
	"github.com/fencelock/fencelock/internal/tasks"
)

// Config is what a Quorum needs of the Locker's options.
type Config struct {
	KeyPrefix       string
	Owner           string // the Locker's default
	ReleaseTimeout  time.Duration
	FenceRetention  time.Duration
	MinRetryBackoff time.Duration
	MaxRetryBackoff time.Duration
	Clock           tasks.Clock
	Tasks           *tasks.Group
	Closed          <-chan struct{} // closed by the Locker's Close: an attempt stops reading the nodes
	LineTag         string          // names the Locker's calls in a line, and the channel of their turns; "": New draws one
}

// A Quorum is a lock store over independent deployments, its nodes.
type Quorum struct {
	nodes []*deployment.Deployment
	n     int // how many nodes make a quorum
	cfg   Config

	answerTime atomic.Int64 // how long a quorum took to answer a grant, lately (a moving average, ns)
	entryTTL   any          // how long a line entry lives without an attempt (LineEntryTTL), ms, boxed
	retention  any          // FenceRetention, ms, boxed
}

var _ store.Store = (*Quorum)(nil)

// New returns the quorum of nodes: len(nodes)/2+1 of them.
func New(nodes []*deployment.Deployment, cfg Config) *Quorum {
	if cfg.LineTag == "" {
		var tag [4]byte
		_, _ = rand.Read(tag[:])
		cfg.LineTag = hex.EncodeToString(tag[:])
	}
	return &Quorum{nodes: nodes, n: len(nodes)/2 + 1, cfg: cfg,
		entryTTL: store.Millis(LineEntryTTL(cfg.MaxRetryBackoff)), retention: store.Millis(cfg.FenceRetention)}
}

// Traits returns what the Locker needs to know of q: its attempts stop at
// their context's end (the node calls run on goroutines of their own), and
// its calls honour their deadlines when every node's client does.
func (q *Quorum) Traits() store.Traits {
	t := store.Traits{Deadlines: true, Stops: true}
	for _, d := range q.nodes {
		t.Deadlines = t.Deadlines && d.Traits().Deadlines
	}
	return t
}

// SetAnswerTime sets how long a quorum took to answer lately, as if measured (tests).
func (q *Quorum) SetAnswerTime(d time.Duration) { q.answerTime.Store(int64(d)) }

// LineTag returns Config.LineTag.
func (q *Quorum) LineTag() string { return q.cfg.LineTag }

// Mark returns the counts of every node's dials.
func (q *Quorum) Mark() store.Mark {
	var m store.Mark
	for _, d := range q.nodes {
		dm := d.Mark()
		m.Dials += dm.Dials
		m.Failures += dm.Failures
	}
	return m
}

// Since returns the error of a dial that failed on a node since m, never
// unsent: the other nodes may have had the request on open connections.
func (q *Quorum) Since(m store.Mark) (cause error, unsent bool) {
	if q.Mark().Failures == m.Failures {
		return nil, false
	}
	for _, d := range q.nodes {
		if cause = d.LastDialError(); cause != nil {
			break
		}
	}
	return cause, false
}

// Close closes every node's subscriptions.
func (q *Quorum) Close(by time.Time) {
	for _, d := range q.nodes {
		d.Close(by)
	}
}

// A quorumError is the error of a call that did not get a quorum, its class
// the verdict on the whole (a minority unreachable is no outage).
type quorumError struct {
	class store.Class
	msg   string
	errs  []error
}

func (e *quorumError) Error() string      { return e.msg }
func (e *quorumError) Unwrap() []error    { return e.errs }
func (e *quorumError) Class() store.Class { return e.class }

// Unsent reports whether no node can have had the request.
func (e *quorumError) Unsent() bool {
	for _, err := range e.errs {
		if !store.Unsent(err) {
			return false
		}
	}
	return len(e.errs) > 0
}

// nodeErrs are the nodes' errors of one call, for its quorumError.
type nodeErrs struct {
	errs  []error
	parts []string
}

func (e *nodeErrs) add(d *deployment.Deployment, err error) {
	e.errs = append(e.errs, err)
	e.parts = append(e.parts, d.Name()+": "+store.OneLine(err.Error()))
}

// error returns a quorumError of class: msg, then each node's error.
func (e *nodeErrs) error(class store.Class, msg string) *quorumError {
	if len(e.parts) > 0 {
		msg += ": " + strings.Join(e.parts, "; ")
	}
	return &quorumError{class: class, msg: msg, errs: e.errs}
}

// Inspect reads the lock called name on every node, deciding once a quorum
// holds it for one token or none can: the value most of them have, the PTTL
// after which fewer than a quorum hold it, the quorum's lowest counter.
func (q *Quorum) Inspect(ctx context.Context, name string, waiters bool) (store.Holding, error) {
	type read struct {
		h   store.Holding
		err error
	}
	reads := each(ctx, q, q.cfg.ReleaseTimeout, false, func(ctx context.Context, _ int, d *deployment.Deployment) read {
		h, err := d.Inspect(ctx, name, waiters)
		return read{h, err}
	})
	defer reads.stop()
	in := inspection{byToken: map[string][]store.Holding{}}
	reads.collect(func(r read) bool {
		in.add(r.h, r.err)
		return in.decided(q)
	})
	if len(in.counters) < q.n || !in.decided(q) { // errors, or nodes that did not answer in time
		if err := ctx.Err(); err != nil {
			return store.Holding{}, err
		}
		return store.Holding{}, in.failed(q)
	}
	return in.holding(q), nil
}

// inspection is what an Inspect read of the nodes so far.
type inspection struct {
	out      store.Holding
	errs     []error
	byToken  map[string][]store.Holding
	counters []int64
	most     int // the most reads of one token
}

func (in *inspection) add(h store.Holding, err error) {
	if err != nil {
		in.errs = append(in.errs, err)
		return
	}
	in.counters = append(in.counters, h.Counter)
	in.out.Waiters = max(in.out.Waiters, h.Waiters)
	if token, _, _ := keys.Parse(h.Value); h.Value != "" {
		in.byToken[token] = append(in.byToken[token], h)
		in.most = max(in.most, len(in.byToken[token]))
	}
}

func (in *inspection) decided(q *Quorum) bool {
	pending := len(q.nodes) - len(in.counters) - len(in.errs)
	return in.most >= q.n || (len(in.counters) >= q.n && in.most+pending < q.n) || len(in.errs) > len(q.nodes)-q.n
}

func (in *inspection) failed(q *Quorum) error {
	class := store.Unavailable
	if len(in.errs) > 0 {
		class = store.ClassOf(errors.Join(in.errs...))
	}
	msg := fmt.Sprintf("%d of %d nodes answered, %d needed", len(in.counters), len(q.nodes), q.n)
	if len(in.counters) >= q.n {
		msg = fmt.Sprintf("%d of %d nodes answered, too few to know whether a quorum holds the lock (%d of them for one token, %d needed)",
			len(in.counters), len(q.nodes), in.most, q.n)
	}
	return &quorumError{class: class, errs: in.errs, msg: msg}
}

func (in *inspection) holding(q *Quorum) store.Holding {
	out := in.out
	slices.Sort(in.counters)
	out.Counter = in.counters[len(in.counters)-q.n]
	for _, hs := range in.byToken {
		if len(hs) < q.n {
			continue
		}
		pttls := make([]time.Duration, 0, len(hs))
		fences := map[int64]int{}
		var best store.Holding
		var bestFence int64
		for _, h := range hs {
			pttls = append(pttls, h.PTTL)
			_, f, _ := keys.Parse(h.Value)
			fences[f]++
			if n, bn := fences[f], fences[bestFence]; best.Value == "" || n > bn || (n == bn && f > bestFence) {
				best, bestFence = h, f
			}
		}
		out.Value, out.PTTL = best.Value, kthShortest(pttls, len(pttls)-q.n+1)
	}
	return out
}
