package chaos

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The Redlock scenarios: the workers lock with fencelock.NewRedlock over
// nNodes independent redis-servers (no replication, nothing persisted), each
// worker reaching each node through a proxy of its own, so that one worker's
// link to one node can be cut.

// nNodes is how many independent nodes the Redlock scenarios lock on: a
// quorum is 3, so any 2 may fail.
const nNodes = 5

// redlockTTL is every Redlock scenario's TTL, as S0, S1, S3 and S5's.
const redlockTTL = 300 * time.Millisecond

// A redlockRig is one Redlock scenario's processes: the nodes, a proxy per
// worker per node, the coordinator and the workers.
type redlockRig struct {
	t     *testing.T
	nodes []*redisNode
	links [][]*proxy // links[w][n]: worker w's proxy to node n
	c     *coord
}

// newRedlockRig starts the nodes, the proxies and the workers. A worker's
// configuration is defaults' with sections of 20ms (as S1's to S5's) over
// its five proxies, then changed by tune (if not nil).
func newRedlockRig(t *testing.T, tune func(c workerConfig) workerConfig) *redlockRig {
	t.Helper()
	r := &redlockRig{t: t}
	for i := range nNodes {
		r.nodes = append(r.nodes, startRedis(t, "redis"+strconv.Itoa(i)))
	}
	for range nWorkers {
		var links []*proxy
		for _, n := range r.nodes {
			links = append(links, startProxy(t, n.addr))
		}
		r.links = append(r.links, links)
	}
	r.c = startCoord(t, nWorkers, func(w int) workerConfig {
		var addrs []string
		for _, p := range r.links[w] {
			addrs = append(addrs, p.addr)
		}
		c := defaults("", redlockTTL)
		c.RedlockAddrs = addrs
		c.Hold = 20 * time.Millisecond
		if tune != nil {
			c = tune(c)
		}
		return c
	})
	return r
}

// setLinks sets worker w's links to nodes to mode.
func (r *redlockRig) setLinks(w int, nodes []int, mode proxyMode) {
	for _, n := range nodes {
		r.links[w][n].set(mode)
	}
}

// allNodes returns the indexes of every node.
func (r *redlockRig) allNodes() []int {
	all := make([]int, len(r.nodes))
	for i := range all {
		all[i] = i
	}
	return all
}

// heldBy returns which of nodes hold the lease with fence. The lock's value
// is "<token> <fence> <owner>": the lease's fence on the nodes of its
// quorum, and, on a node whose grant came after the quorum's (until the
// lease's fence is written there in the background) or that was behind,
// the value that node's counter reached. The token is not in the events, so
// it is read from a node (of all) that stores the fence, and every node of
// nodes holding that token counts.
func (r *redlockRig) heldBy(nodes []int, fence int64) []int {
	tokens := make(map[int]string)
	var token string
	for n := range r.nodes {
		v, err := r.nodes[n].do("GET", "lock:{chaos}")
		s, ok := v.(string)
		if err != nil || !ok {
			continue
		}
		tok, rest, _ := strings.Cut(s, " ")
		f, _, _ := strings.Cut(rest, " ")
		tokens[n] = tok
		if f == strconv.FormatInt(fence, 10) {
			token = tok
		}
	}
	var held []int
	for _, n := range nodes {
		if token != "" && tokens[n] == token {
			held = append(held, n)
		}
	}
	return held
}

// counter returns node n's fence counter, 0 when it has none.
func (r *redlockRig) counter(n int) int64 {
	v, err := r.nodes[n].do("GET", "lock:{chaos}:fence")
	if err != nil {
		return 0
	}
	c, _ := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	return c
}

// grantsDuring returns the sections of other workers granted while s's
// holder still believed it held the lock: the double grants against s.
func grantsDuring(secs []*section, s *section) []*section {
	var out []*section
	for _, x := range secs {
		if x.Acq != nil && x.W != s.W && x.Fence > s.Fence && x.at() < s.beliefEnd() {
			out = append(out, x)
		}
	}
	return out
}

// nextGrant returns the first section granted after s (by fence).
func nextGrant(secs []*section, s *section) *section {
	var next *section
	for _, x := range secs {
		if x.Acq != nil && x.Fence > s.Fence && (next == nil || x.Fence < next.Fence) {
			next = x
		}
	}
	return next
}

// redlockNotes describes the repairs and the failed tries. A quorum of the
// nodes is up throughout every R scenario, so an ErrUnavailable is one on
// which Options.FailOpen would have run the work without the lock.
func redlockNotes(f figures) string {
	return fmt.Sprintf("repairs (a renewal putting the lock back on a node that lost it): %d sent, %d put it back, %d sent after Release; "+
		"failed tries: %d ErrUnavailable (with a quorum of nodes up: FailOpen would have run the work), %d ErrNotObtained",
		f.Repairs, f.Repaired, f.RepairsAfterRelease, f.Unavailable, f.NotObtained)
}

// assertNoDoubleGrant asserts what holds on Redlock when no holder pauses
// and no node restarts while it holds a lock: one holder at a time.
func assertNoDoubleGrant(t *testing.T, f figures) {
	t.Helper()
	if f.DoubleGrants != 0 || f.Overlaps != 0 {
		t.Errorf("%d double grants and %d overlapping sections with a minority of the nodes down, want 0:\n%s",
			f.DoubleGrants, f.Overlaps, describeDoubles(f))
	}
}

// R0: no fault, five nodes: S0 on Redlock, the baseline of R1-R4. Mutual
// exclusion holds and fences increase. It also counts how many nodes hold
// each lease when its section begins.
func testR0(t *testing.T) {
	r := newRedlockRig(t, func(c workerConfig) workerConfig {
		c.Hold = 3 * time.Millisecond
		return c
	})
	// How many nodes hold each lease when its section begins (5 GETs
	// before the section is answered, well under a millisecond).
	var (
		mu     sync.Mutex
		spread [nNodes + 1]int // guarded by mu; the hook runs on each worker's connection
	)
	all := r.allNodes()
	r.c.setOnBegin(func(ev event) time.Duration {
		n := len(r.heldBy(all, ev.Fence))
		mu.Lock()
		spread[n]++
		mu.Unlock()
		return 0
	})
	if !r.c.awaitAcquired(0, 200, 60*time.Second) {
		t.Errorf("200 acquisitions not reached within 60s")
	}
	r.c.setOnBegin(nil)
	f, secs := finish(t, r.c, "R0")
	mu.Lock()
	defer mu.Unlock()
	report(t, "R0 Redlock none", f, fmt.Sprintf("throughput %.0f acquisitions/s over %.1fs; liveness %d/%d attempts; acquisitions per worker %v",
		f.Throughput, f.Span.Seconds(), f.Acquired, f.Attempts, perWorker(secs)),
		fmt.Sprintf("leases held on 5, 4, 3 nodes when their section began: %d, %d, %d", spread[5], spread[4], spread[3]),
		redlockNotes(f))
	assertSafe(t, f)
	if f.Overlaps != 0 {
		t.Errorf("%d overlapping critical sections without faults, want 0", f.Overlaps)
	}
	if !f.FencesIncreasing {
		t.Errorf("fences did not increase in the order of acquisition")
	}
	if f.Lost != 0 || f.LostRun != 0 {
		t.Errorf("%d/%d leases lost without faults, want 0:\n%s", f.Lost, f.LostRun, describeLosses(f))
	}
}

// rate counts the acquisitions in the next d, per second.
func (c *coord) rate(d time.Duration) float64 {
	mark := c.mark()
	time.Sleep(d)
	return float64(c.countFrom(mark, isOp("acquired"))) / d.Seconds()
}

// holderNote describes what became of the lease of section ev.
func holderNote(secs []*section, ev event) string {
	s := sectionOf(secs, ev)
	return fmt.Sprintf("worker %d (fence %d, a section of 2×TTL): ctx cause %q; RunWithLock: %s; renewal calls on nodes ok %d, failed %d",
		ev.W, ev.Fence, causeOf(s), errOf(s), s.Done.RenewOK, s.Done.RenewFail)
}

// R1: a minority (2 of 5) is killed while a lease that needs renewing is
// held, stays down for more than 5×TTL, and is restarted empty while
// another such lease is held; twice, with two other nodes the second time.
// The acquisition rate is measured for 1s before, and for 1s while the
// nodes are down (after the first lease ended).
func testR1(t *testing.T) {
	const ttl, window = redlockTTL, time.Second
	r := newRedlockRig(t, nil)
	if !r.c.awaitAcquired(0, 10, 10*time.Second) {
		t.Fatalf("no acquisitions")
	}
	healthy := r.c.rate(window)
	notes := []string{fmt.Sprintf("all 5 nodes up: %.0f acquisitions/s", healthy)}
	var holders []event
	for round, pair := range [][]int{{0, 1}, {3, 4}} {
		var held []int // written by engage, read after pickSection returned
		killed, ok := r.c.pickSection(anySection, 2*ttl, func(ev event) {
			held = r.heldBy(r.allNodes(), ev.Fence)
			for _, n := range pair {
				r.nodes[n].kill()
			}
		}, 10*time.Second)
		if !ok {
			t.Fatalf("round %d: nobody held the lock within 10s", round+1)
		}
		at := time.Now()
		if _, ok := r.c.awaitDone(killed, 10*time.Second); !ok {
			t.Fatalf("round %d: worker %d's attempt did not end", round+1, killed.W)
		}
		down := r.c.rate(window)

		// Restarted empty while the next lease is held: its next renewal
		// puts the lock back on them.
		up, ok := r.c.pickSection(anySection, 2*ttl, nil, 10*time.Second)
		if !ok {
			t.Fatalf("round %d: nobody held the lock within 10s with nodes %v down", round+1, pair)
		}
		restarted := time.Now()
		for _, n := range pair {
			r.nodes[n].restart()
		}
		back := "was not back on both within 2×TTL"
		if waitFor(2*ttl, func() error {
			if held := r.heldBy(pair, up.Fence); len(held) != len(pair) {
				return fmt.Errorf("held on %v", held)
			}
			return nil
		}) == nil {
			back = "was back on both " + ms(time.Since(restarted)) + " after the restart began"
		}
		if _, ok := r.c.awaitDone(up, 10*time.Second); !ok {
			t.Fatalf("round %d: worker %d's attempt did not end", round+1, up.W)
		}
		holders = append(holders, killed, up)
		notes = append(notes, fmt.Sprintf("round %d: nodes %v killed while worker %d held the lock (fence %d) on nodes %v; then %.0f acquisitions/s with them down; restarted empty %s later while worker %d held it (fence %d): its lock %s",
			round+1, pair, killed.W, killed.Fence, held, down, ms(restarted.Sub(at)), up.W, up.Fence, back))
		r.c.awaitAcquired(r.c.mark(), 5, 10*time.Second)
	}
	f, secs := finish(t, r.c, "R1")
	for _, ev := range holders {
		notes = append(notes, holderNote(secs, ev))
	}
	notes = append(notes, redlockNotes(f))
	report(t, "R1 Redlock 2/5 killed, restarted empty", f, notes...)
	assertSafe(t, f)
	assertNoDoubleGrant(t, f)
}

// R2: a minority (2 of 5) is SIGSTOPped while a lease that needs renewing
// is held, for that lease's section and 1s more (about 5×TTL in all), then
// resumed: it then runs the requests that reached it meanwhile. Twice, with
// two other nodes the second time. The acquisition rate is measured for 1s
// before, and for 1s while the nodes are paused (after the first lease
// ended).
func testR2(t *testing.T) {
	const ttl, window = redlockTTL, time.Second
	r := newRedlockRig(t, nil)
	if !r.c.awaitAcquired(0, 10, 10*time.Second) {
		t.Fatalf("no acquisitions")
	}
	healthy := r.c.rate(window)
	notes := []string{fmt.Sprintf("all 5 nodes up: %.0f acquisitions/s", healthy)}
	var holders []event
	for round, pair := range [][]int{{1, 2}, {3, 4}} {
		var perr error  // written by engage, read after pickSection returned
		var nodes []int // likewise
		held, ok := r.c.pickSection(anySection, 2*ttl, func(ev event) {
			nodes = r.heldBy(r.allNodes(), ev.Fence)
			for _, n := range pair {
				if err := r.nodes[n].pause(); err != nil {
					perr = err
				}
			}
		}, 10*time.Second)
		if !ok {
			t.Fatalf("round %d: nobody held the lock within 10s", round+1)
		}
		if perr != nil {
			t.Fatalf("round %d: %v", round+1, perr)
		}
		at := time.Now()
		if _, ok := r.c.awaitDone(held, 10*time.Second); !ok {
			t.Fatalf("round %d: worker %d's attempt did not end", round+1, held.W)
		}
		paused := r.c.rate(window)
		for _, n := range pair {
			if err := r.nodes[n].resume(); err != nil {
				t.Fatalf("round %d: %v", round+1, err)
			}
		}
		resumed := time.Now()
		recovered := "not within 10s"
		if r.c.awaitAcquired(r.c.mark(), 10, 10*time.Second) {
			recovered = ms(time.Since(resumed))
		}
		holders = append(holders, held)
		notes = append(notes, fmt.Sprintf("round %d: nodes %v paused for %s while worker %d held the lock (fence %d) on nodes %v; %.0f acquisitions/s with them paused; 10 acquisitions after the resume: %s",
			round+1, pair, ms(resumed.Sub(at)), held.W, held.Fence, nodes, paused, recovered))
	}
	f, secs := finish(t, r.c, "R2")
	for _, ev := range holders {
		notes = append(notes, holderNote(secs, ev))
	}
	notes = append(notes, redlockNotes(f))
	report(t, "R2 Redlock 2/5 SIGSTOP", f, notes...)
	assertSafe(t, f)
	assertNoDoubleGrant(t, f)
}

// R3: S1 on Redlock: the holder is SIGSTOPped for 3×TTL between its check of
// the context and its writes, three times.
func testR3(t *testing.T) {
	r := newRedlockRig(t, pausedHolderConfig)
	holderPaused(t, r.c, redlockTTL, "R3", "R3 Redlock holder SIGSTOP 3×TTL")
}

// R4: a node restarted empty at once while the lock is held.
//
// First on a holder that holds the lock on all five nodes (the suite picks
// such a lease: under contention many hold fewer, see R0): one node of its
// is restarted empty at once and the holder's link to another is cut
// (black hole) for its section of 2×TTL. The other workers can then find
// the lock free on at most two nodes.
//
// Then Kleppmann's double grant: the holder holds a bare quorum, because
// its links to two nodes were cut (black hole) before it acquired; one node
// of its quorum is restarted empty at once, so the other workers find the
// lock free on three nodes, that one and the two the holder never reached.
// The holder's write, checked against its context before the other
// worker's grant, is held at commit until the other worker has written (at
// most a TTL), the order in which Kleppmann's example has the stale write
// arrive. Just before the restart, the suite reads the fence counters of
// the two cut nodes: they show what the quorum intersection alone would
// have ordered the next fence by, since the restarted node lost the
// holder's fence and the cut nodes never had it.
func testR4(t *testing.T) {
	const ttl = redlockTTL
	r := newRedlockRig(t, nil)
	if !r.c.awaitAcquired(0, 10, 10*time.Second) {
		t.Fatalf("no acquisitions")
	}
	var notes []string

	// Phase 1: the holder holds all five nodes.
	var wide []event
	for round := range 2 {
		restart, cut := round, (round+1)%nNodes
		onAll := func(ev event) bool { return len(r.heldBy(r.allNodes(), ev.Fence)) == nNodes }
		v, ok := r.c.pickSection(onAll, 2*ttl, func(ev event) { r.links[ev.W][cut].set(blackHole) }, 10*time.Second)
		if !ok {
			t.Fatalf("phase 1 round %d: no lease held on all %d nodes within 10s", round+1, nNodes)
		}
		r.nodes[restart].kill()
		r.nodes[restart].restart()
		if _, ok := r.c.awaitDone(v, 10*time.Second); !ok {
			t.Fatalf("phase 1 round %d: worker %d's attempt did not end", round+1, v.W)
		}
		r.links[v.W][cut].set(pass)
		wide = append(wide, v)
		r.c.awaitAcquired(r.c.mark(), 3, 10*time.Second)
		notes = append(notes, fmt.Sprintf("holder on all 5, round %d: worker %d (fence %d) held the lock on all 5 nodes; node %d restarted empty at once, its link to node %d cut",
			round+1, v.W, v.Fence, restart, cut))
	}

	// Phase 2: the holder holds a bare quorum.
	type bare struct {
		v          event
		restart    int
		cut        []int
		counters   []int64 // of the cut nodes, just before the restart
		otherWrote bool    // another worker wrote while the holder's write was held
		heldQuorum []int   // nodes holding the holder's lock at its section's start
	}
	var rounds []bare
	for round := range 3 {
		v := round % nWorkers
		b := bare{restart: (2 + round) % nNodes, cut: []int{(3 + round) % nNodes, (4 + round) % nNodes}}
		r.setLinks(v, b.cut, blackHole)
		cutAt := wallMicros(time.Now())
		mine := func(ev event) bool { return ev.W == v && ev.Granted > cutAt }

		var mu sync.Mutex
		var once sync.Once
		r.c.setOnCommit(func(ev event) {
			if !mine(ev) {
				return
			}
			once.Do(func() {
				_, _, wrote := r.c.await(0, ttl, func(e event) bool { return e.Op == "fwrite" && e.W != v && e.Fence > ev.Fence })
				mu.Lock()
				b.otherWrote = wrote
				mu.Unlock()
			})
		})
		ev, ok := r.c.pickSection(mine, ttl/3, nil, 10*time.Second)
		if !ok {
			t.Fatalf("phase 2 round %d: worker %d did not get the lock within 10s with its links to nodes %v cut", round+1, v, b.cut)
		}
		b.v = ev
		b.heldQuorum = r.heldBy(r.allNodes(), ev.Fence)
		for _, n := range b.cut {
			b.counters = append(b.counters, r.counter(n))
		}
		r.nodes[b.restart].kill()
		r.nodes[b.restart].restart()
		if _, ok := r.c.awaitDone(ev, 10*time.Second); !ok {
			t.Fatalf("phase 2 round %d: worker %d's attempt did not end", round+1, v)
		}
		r.c.setOnCommit(nil)
		r.setLinks(v, b.cut, pass)
		r.c.awaitAcquired(r.c.mark(), 3, 10*time.Second)
		mu.Lock()
		rounds = append(rounds, b)
		mu.Unlock()
	}

	f, secs := finish(t, r.c, "R4")
	var wideDoubles int
	for _, v := range wide {
		d := grantsDuring(secs, sectionOf(secs, v))
		wideDoubles += len(d)
		notes = append(notes, fmt.Sprintf("holder on all 5: %d grants to others while it believed it held the lock; %s", len(d), holderNote(secs, v)))
	}
	var bareDoubles, stale, rejected, told, ordered, counterOrdered int
	for i, b := range rounds {
		s := sectionOf(secs, b.v)
		d := grantsDuring(secs, s)
		bareDoubles += len(d)
		note := fmt.Sprintf("bare quorum, round %d: worker %d (fence %d) held the lock on nodes %v (links to %v cut); node %d restarted empty at once; %d grants to others while it believed it held it",
			i+1, b.v.W, b.v.Fence, b.heldQuorum, b.cut, b.restart, len(d))
		if next := nextGrant(secs, s); next != nil {
			byCounters := max(b.counters[0], b.counters[1]) + 1
			note += fmt.Sprintf("; next grant: worker %d, fence %d (%+d)", next.W, next.Fence, next.Fence-b.v.Fence)
			if next.Fence > b.v.Fence {
				ordered++
			}
			note += fmt.Sprintf("; the cut nodes' counters %v: by the counters alone its fence would have been %d", b.counters, byCounters)
			if byCounters > b.v.Fence {
				counterOrdered++
				note += ", greater"
			} else {
				note += fmt.Sprintf(", %d behind the holder's (the restarted node's counter, started again from its TIME, ordered it)", b.v.Fence-byCounters)
			}
		}
		if s.FWrite != nil {
			stale++
			if !s.FWrite.Accepted {
				rejected++
			}
			note += fmt.Sprintf("; its write (held until another worker had written: %v) was %s", b.otherWrote,
				map[bool]string{true: "ACCEPTED", false: "rejected by the fence"}[s.FWrite.Accepted])
		}
		if (s.Cancel != nil && s.Cancel.Lost) || (s.Done != nil && s.Done.Lost) {
			told++
		}
		note += fmt.Sprintf("; ctx cause %q; RunWithLock: %s", causeOf(s), errOf(s))
		notes = append(notes, note)
	}
	notes = append(notes,
		fmt.Sprintf("holder on all 5: %d double grants in %d rounds; bare quorum: %d double grants in %d rounds, the holder told of its loss (ctx or RunWithLock) in %d; its writes: %d, %d rejected by the fence",
			wideDoubles, len(wide), bareDoubles, len(rounds), told, stale, rejected),
		fmt.Sprintf("fences after a bare-quorum holder's: greater in %d of %d rounds; by the counters alone (no TIME floor) in %d of %d",
			ordered, len(rounds), counterOrdered, len(rounds)),
		redlockNotes(f))
	report(t, "R4 Redlock restart at once + link cut", f, notes...)
	assertSafe(t, f)
}
