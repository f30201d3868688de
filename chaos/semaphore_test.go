package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// N1: a semaphore (fencelock.Semaphore, issue 26) of semPermits permits,
// semWorkers workers competing for it through proxies to one Redis, under
// the faults of S1, S2 and S5 in turn: a holder SIGSTOPped for 3×TTL before
// its writes (three times), a holder's link black-holed for 2×TTL (twice),
// and the Redis restarted without persistence, which forgets every permit
// (twice). It measures what the semaphore promises: how often more than N
// were inside (overlaps beyond N, on the unfenced resource; grants beyond
// N, as the holders believed), and that the fenced resource accepted no
// stale write (by its own log and as the workers saw it; it applies the
// lock's rule, so it also refuses writes of holders whose permits are
// valid but whose fences are older than one it accepted: those count as
// rejected, never as accepted).
const (
	semPermits = 2
	semWorkers = 4
)

func testN1(t *testing.T) {
	const ttl = 300 * time.Millisecond
	node := startRedis(t, "redis")
	var proxies []*proxy
	for range semWorkers {
		proxies = append(proxies, startProxy(t, node.addr))
	}
	c := startCoord(t, semWorkers, func(w int) workerConfig {
		cfg := pausedHolderConfig(defaults(proxies[w].addr, ttl))
		cfg.Permits = semPermits
		return cfg
	})
	if !c.awaitAcquired(0, 20, 20*time.Second) {
		t.Fatalf("20 acquisitions not reached within 20s")
	}
	type phase struct {
		name     string
		from, to time.Duration
	}
	var phases []phase
	begin := func() time.Duration { return time.Since(c.t0) }

	// Pauses: the holder of the 10th, 20th and 30th commit from now is
	// SIGSTOPped for 3×TTL before it writes.
	from := begin()
	var (
		mu      sync.Mutex
		commits int
		paused  []event
	)
	done := make(chan struct{}, 3)
	c.setOnCommit(func(ev event) {
		mu.Lock()
		commits++
		n := commits
		mu.Unlock()
		if n != 10 && n != 20 && n != 30 {
			return
		}
		if err := c.pauseFor(ev.W, 3*ttl); err != nil {
			t.Errorf("pause: %v", err)
		}
		mu.Lock()
		paused = append(paused, ev)
		mu.Unlock()
		done <- struct{}{}
	})
	for range 3 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("the pauses did not all happen within 30s")
		}
	}
	c.setOnCommit(nil)
	c.awaitAcquired(c.mark(), 10, 10*time.Second)
	phases = append(phases, phase{"SIGSTOP 3×TTL", from, begin()})

	// Partitions: once worker v holds a permit, its proxy black-holes
	// everything for 2×TTL; the section holds 3×TTL, so it needs renewals.
	from = begin()
	var partitioned []event
	for round := range 2 {
		v := round % semWorkers
		ev, ok := c.pickSection(func(ev event) bool { return ev.W == v }, 3*ttl,
			func(event) { proxies[v].set(blackHole) }, 10*time.Second)
		if !ok {
			t.Fatalf("worker %d held no permit within 10s", v)
		}
		time.Sleep(2 * ttl)
		proxies[v].set(pass)
		if _, ok := c.awaitDone(ev, 10*time.Second); !ok {
			t.Fatalf("worker %d's attempt did not end within 10s of the partition healing", v)
		}
		partitioned = append(partitioned, ev)
	}
	c.awaitAcquired(c.mark(), 10, 10*time.Second)
	phases = append(phases, phase{"partition 2×TTL", from, begin()})

	// Restarts: while someone holds a permit, Redis is killed and started
	// again at once, empty.
	from = begin()
	for range 2 {
		v, ok := c.pickSection(anySection, 2*ttl, nil, 10*time.Second)
		if !ok {
			t.Fatalf("nobody held a permit within 10s")
		}
		time.Sleep(30 * time.Millisecond)
		node.kill()
		node.restart()
		if _, ok := c.awaitDone(v, 10*time.Second); !ok {
			t.Fatalf("the holder's attempt did not end within 10s of the restart")
		}
		c.awaitAcquired(c.mark(), 5, 10*time.Second)
	}
	phases = append(phases, phase{"restart, no persistence", from, begin()})

	c.stopWorkers(15 * time.Second)
	events, counter, highest := c.snapshot()
	f, secs := analyze(events, counter, highest, ttl, "N1")
	sf := semaphoreFigures(events, secs, semPermits)
	sf.apply(&f)

	notes := []string{fmt.Sprintf("%d permits, %d workers: at most %d inside at once (unfenced sections); %d sections began with %d or more inside (overlaps beyond N); "+
		"%d grants while %d or more earlier holders still believed they held (grants beyond N); %d fences below one reported before their Acquire began",
		semPermits, semWorkers, sf.mostInside, sf.beyondN, semPermits, sf.grantsBeyondN, semPermits, sf.fenceInversions)}
	for _, ph := range phases {
		var b, g int
		for _, at := range sf.beyondAt {
			if at >= ph.from && at <= ph.to {
				b++
			}
		}
		for _, at := range sf.grantsBeyondAt {
			if at >= ph.from && at <= ph.to {
				g++
			}
		}
		notes = append(notes, fmt.Sprintf("%s: %d overlaps beyond N, %d grants beyond N", ph.name, b, g))
	}
	for _, ev := range paused {
		s := sectionOf(secs, ev)
		verdict := "no fenced write"
		if s.FWrite != nil {
			verdict = map[bool]string{true: "its fenced write was ACCEPTED", false: "its stale fenced write was rejected"}[s.FWrite.Accepted]
		}
		notes = append(notes, fmt.Sprintf("paused worker %d (fence %d): %s; ctx cause %q; RunWithLock: %s", ev.W, ev.Fence, verdict, causeOf(s), errOf(s)))
		if s.Cancel == nil || !s.Cancel.Lost {
			t.Errorf("paused worker %d's work context was not cancelled with ErrLost (cause %q)", ev.W, causeOf(s))
		}
	}
	for _, ev := range partitioned {
		s := sectionOf(secs, ev)
		if s.Cancel == nil || !s.Cancel.Lost {
			t.Errorf("black-holed worker %d's work was not cancelled with ErrLost (cause %q)", ev.W, causeOf(s))
			continue
		}
		if s.FWrite != nil || s.End == nil || s.End.Wrote {
			t.Errorf("black-holed worker %d wrote although its permit was lost before its section ended", ev.W)
		}
		notes = append(notes, fmt.Sprintf("black-holed worker %d (fence %d): cancelled %s after its local deadline, wrote nothing",
			ev.W, ev.Fence, ms(time.Duration(s.Cancel.LagUS)*time.Microsecond)))
	}
	notes = append(notes, fmt.Sprintf("fenced resource: %d writes accepted, %d rejected (%d of holders whose permit was lost, %d of valid holders with an older fence than one accepted), stale accepted: %d (resource), %d (workers)",
		f.FencedWrites-f.StaleRejected, f.StaleRejected, sf.rejectedLost, f.StaleRejected-sf.rejectedLost, f.StaleAccepted, f.StaleAckWorker),
		"row: overlaps, double grants, late cancels, margin and writes after regrant count against N, not 1 (see semFigures.apply); "+
			"lost upd is the unfenced counter's read-modify-write, which N holders share by design")
	report(t, fmt.Sprintf("N1 semaphore N=%d: SIGSTOP, partition, restart", semPermits), f, notes...)
	assertSafe(t, f)
	if sf.fenceInversions != 0 {
		t.Errorf("%d acquisitions got a fence below one reported before their Acquire began, want 0", sf.fenceInversions)
	}
	if sf.mostInside < semPermits {
		t.Errorf("at most %d inside at once: the %d permits were never all used", sf.mostInside, semPermits)
	}
	// Without a pause or a lost Redis, never more than N inside: the
	// partitioned holders were told before their permits expired.
	for _, at := range sf.grantsBeyondAt {
		if ph := phases[1]; at >= ph.from && at <= ph.to {
			t.Errorf("a grant beyond N during the partitions, at %s", ms(at))
		}
	}
}

// semFigures is what N1 measures beyond the lock's figures.
type semFigures struct {
	mostInside      int             // the most unfenced sections inside at once
	beyondN         int             // sections that began with n or more inside
	beyondAt        []time.Duration // when each began
	grantsBeyondN   int             // grants while n or more earlier holders believed they held
	grantsBeyondAt  []time.Duration
	beyond          [][2]*section // each grant beyond N: its first believer and the grant
	fenceInversions int           // acquisitions whose fence is below one reported before their attempt began
	rejectedLost    int           // fenced writes rejected of holders that lost their permit
}

// apply puts sf into f's row, which counts against one holder: overlaps
// are sections begun with N inside, double grants grants beyond N; a lost
// permit's regrant is the first grant beyond N it still believed it held
// through (late cancels, margin min and writes after regrant follow).
func (sf semFigures) apply(f *figures) {
	f.Overlaps, f.DoubleGrants, f.doubles = sf.beyondN, sf.grantsBeyondN, sf.beyond
	f.LateCancels, f.WritesAfter, f.MarginMin = 0, 0, 0
	first := true
	for i := range f.losses {
		l := &f.losses[i]
		l.next, l.margin, l.writesAfter = nil, 0, 0
		for _, d := range sf.beyond {
			if d[0] != l.sec && !believedThrough(l.sec, d[1]) {
				continue
			}
			l.next = d[1]
			l.margin = time.Duration(d[1].at()-l.sec.Cancel.Wall) * time.Microsecond
			for _, ev := range []*event{l.sec.FWrite, l.sec.End} {
				if ev != nil && (ev.Op == "fwrite" || ev.Wrote) && ev.TWall > d[1].at() {
					l.writesAfter++
				}
			}
			break
		}
		if l.next == nil {
			continue
		}
		if l.margin <= 0 {
			f.LateCancels++
		}
		f.WritesAfter += l.writesAfter
		if first || l.margin < f.MarginMin {
			f.MarginMin, first = l.margin, false
		}
	}
}

// believedThrough reports whether y, granted before x, still believed it
// held its permit when x was granted.
func believedThrough(y, x *section) bool {
	return y.W != x.W && y.Fence < x.Fence && y.beliefEnd() > x.at()
}

// semaphoreFigures computes semFigures for a semaphore of n permits.
func semaphoreFigures(events []event, secs []*section, n int) semFigures {
	var sf semFigures
	// Unfenced sections, on the coordinator's clock.
	type edge struct {
		at    time.Duration
		delta int
	}
	var edges []edge
	for _, s := range secs {
		if s.Begin == nil {
			continue
		}
		end := time.Duration(1<<63 - 1)
		switch {
		case s.End != nil:
			end = s.End.T
		case s.Done != nil:
			end = s.Done.T
		}
		edges = append(edges, edge{s.Begin.T, 1}, edge{end, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.delta, b.delta) // an end before a begin at the same instant
	})
	inside := 0
	for _, e := range edges {
		if e.delta > 0 && inside >= n {
			sf.beyondN++
			sf.beyondAt = append(sf.beyondAt, e.at)
		}
		inside += e.delta
		sf.mostInside = max(sf.mostInside, inside)
	}

	// Grants against the holders' beliefs, on the wall clock (a fence is
	// its server's TIME at the grant).
	byFence := make([]*section, 0, len(secs))
	for _, s := range secs {
		if s.Acq != nil {
			byFence = append(byFence, s)
		}
	}
	slices.SortFunc(byFence, func(a, b *section) int { return cmp.Compare(a.Fence, b.Fence) })
	for i, x := range byFence {
		var believers []*section
		for _, y := range byFence[:i] {
			if believedThrough(y, x) {
				believers = append(believers, y)
			}
		}
		if len(believers) >= n {
			sf.grantsBeyondN++
			sf.grantsBeyondAt = append(sf.grantsBeyondAt, x.Acq.T)
			sf.beyond = append(sf.beyond, [2]*section{believers[0], x})
		}
	}
	for _, s := range secs {
		lost := (s.Cancel != nil && s.Cancel.Lost) || (s.Done != nil && s.Done.Lost)
		if s.FWrite != nil && !s.FWrite.Accepted && lost {
			sf.rejectedLost++
		}
	}

	// Fences against real time: an attempt begins when the coordinator
	// answers its "next"; every acquisition reported before that has a
	// smaller fence.
	started := make(map[[2]int]time.Duration)
	for _, ev := range events {
		if ev.Op == "next" {
			started[[2]int{ev.W, ev.Seq}] = ev.T
		}
	}
	for _, x := range byFence {
		st, ok := started[[2]int{x.W, x.Seq}]
		if !ok {
			continue
		}
		for _, y := range byFence {
			if y.Acq.T < st && y.Fence >= x.Fence {
				sf.fenceInversions++
				break
			}
		}
	}
	return sf
}
