package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"
)

// nWorkers is how many worker processes contend for the lock in every
// scenario.
const nWorkers = 3

// defaults is a worker's configuration unless a scenario says otherwise:
// short sections, quick retries, Redis timeouts of a few hundred ms.
func defaults(addr string, ttl time.Duration) workerConfig {
	return workerConfig{
		Addr: addr, Lock: "chaos", TTL: ttl,
		Wait: 2 * ttl, Hold: 5 * time.Millisecond,
		MinBackoff: 2 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		ReleaseTimeout: ttl, IOTimeout: 200 * time.Millisecond,
	}
}

// A variant is how a scenario's workers wait for the lock: plain waiters
// (WithWait) or fair ones (WithWait and WithFair), which wait in the lock's
// line and are handed the lock by the release. S0-S3 run both ways, on the
// same faults and with the same assertions. It also names the client the
// workers hold the lock through (workerConfig.Client): S1, S3 and S4 run
// with plain waiters on rueidis and valkey-go too.
type variant struct {
	fair   bool
	client string // "": go-redis
}

var (
	plain    = variant{}
	fair     = variant{fair: true}
	onRueid  = variant{client: rueidisC}
	onValkey = variant{client: valkeyC}
)

// config returns c with the variant's way of waiting and client.
func (v variant) config(c workerConfig) workerConfig {
	c.Fair = v.fair
	c.Client = v.client
	return c
}

// row returns the name of a scenario's row in the table.
func (v variant) row(name string) string {
	if v.fair {
		name += ", fair"
	}
	if v.client != "" {
		name += ", " + v.client
	}
	return name
}

// artifact returns the prefix of a scenario's artifact files.
func (v variant) artifact(name string) string {
	if v.fair {
		name += "f"
	}
	if v.client != "" {
		name += "-" + v.client
	}
	return name
}

// A rig is one scenario's processes: a Redis node, a proxy to it per worker,
// the coordinator and the workers.
type rig struct {
	t       *testing.T
	node    *redisNode
	proxies []*proxy
	c       *coord
}

func newRig(t *testing.T, nodeArgs []string, cfg func(w int, addr string) workerConfig) *rig {
	t.Helper()
	r := &rig{t: t, node: startRedis(t, "redis", nodeArgs...)}
	for range nWorkers {
		r.proxies = append(r.proxies, startProxy(t, r.node.addr))
	}
	r.c = startCoord(t, nWorkers, func(w int) workerConfig { return cfg(w, r.proxies[w].addr) })
	return r
}

// finish stops the workers and analyzes what they did.
func finish(t *testing.T, c *coord, name string) (figures, []*section) {
	t.Helper()
	c.stopWorkers(15 * time.Second)
	events, counter, highest := c.snapshot()
	return analyze(events, counter, highest, c.config(0).TTL, name)
}

// awaitAcquired waits up to d for n acquisitions reported from index from on.
func (c *coord) awaitAcquired(from, n int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for range n {
		var ok bool
		if _, from, ok = c.await(from, time.Until(deadline), isOp("acquired")); !ok {
			return false
		}
	}
	return true
}

func isOp(op string) func(ev event) bool { return func(ev event) bool { return ev.Op == op } }

// awaitDone waits up to d for the done event of the attempt ev belongs to.
func (c *coord) awaitDone(ev event, d time.Duration) (event, bool) {
	done, _, ok := c.await(0, d, func(e event) bool { return e.Op == "done" && e.W == ev.W && e.Seq == ev.Seq })
	return done, ok
}

// pickSection chooses the next critical section to begin that accept admits:
// it calls engage (if not nil) before the section is answered, makes the
// section hold for hold, and returns its ubegin event.
func (c *coord) pickSection(accept func(ev event) bool, hold time.Duration, engage func(ev event), d time.Duration) (event, bool) {
	picked := make(chan event, 1)
	var once sync.Once
	c.setOnBegin(func(ev event) time.Duration {
		if !accept(ev) {
			return 0
		}
		mine := false
		once.Do(func() { mine = true })
		if !mine {
			return 0
		}
		if engage != nil {
			engage(ev)
		}
		picked <- ev
		return hold
	})
	defer c.setOnBegin(nil)
	select {
	case ev := <-picked:
		return ev, true
	case <-time.After(d):
		return event{}, false
	}
}

func anySection(event) bool { return true }

// slowLink is how a worker on a slow link fared against the others.
type slowLink struct {
	wins, all, tries int
	// bypassMax is the most grants to other workers made after one of the
	// worker's attempts could have reached Redis (its start plus the
	// one-way latency) and before that attempt's own grant.
	bypassMax int
	// learn and turn are means over its acquisitions: from the grant (its
	// fence, the server's TIME) to the worker reporting it, and to the
	// next grant to anyone.
	learn, turn time.Duration
}

// slowLinkOf measures worker w in events[from:to], while it had oneWay of
// latency each way.
func slowLinkOf(events []event, from, to, w int, oneWay time.Duration) slowLink {
	var sl slowLink
	started := make(map[int]int64) // by seq: the wall µs the attempt began
	for _, ev := range events[from:to] {
		switch {
		case ev.Op == "acquired":
			sl.all++
		case ev.Op == "next" && ev.W == w:
			started[ev.Seq] = ev.TWall
		case ev.Op == "done" && ev.W == w:
			sl.tries++
		}
	}
	var fences []int64 // every grant, in order
	for _, ev := range events {
		if ev.Op == "acquired" {
			fences = append(fences, ev.Fence)
		}
	}
	slices.Sort(fences)
	const slack = 5 * time.Millisecond
	var learn, turn time.Duration
	var turns int
	for _, ev := range events[from:to] {
		if ev.Op != "acquired" || ev.W != w {
			continue
		}
		sl.wins++
		learn += time.Duration(ev.TWall-ev.Fence) * time.Microsecond
		i, _ := slices.BinarySearch(fences, ev.Fence)
		if i+1 < len(fences) {
			turn += time.Duration(fences[i+1]-ev.Fence) * time.Microsecond
			turns++
		}
		if start, ok := started[ev.Seq]; ok {
			reached := start + (oneWay + slack).Microseconds()
			j, _ := slices.BinarySearch(fences, reached)
			sl.bypassMax = max(sl.bypassMax, i-j)
		}
	}
	if sl.wins > 0 {
		sl.learn = learn / time.Duration(sl.wins)
	}
	if turns > 0 {
		sl.turn = turn / time.Duration(turns)
	}
	return sl
}

// share formats n of all as a percentage.
func share(n, all int) string {
	if all == 0 {
		return "no acquisitions"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(n)/float64(all))
}

// perWorker returns how many acquisitions each worker made.
func perWorker(secs []*section) []int {
	n := make([]int, nWorkers)
	for _, s := range secs {
		if s.Acq != nil {
			n[s.W]++
		}
	}
	return n
}

// sectionOf returns the section of ev's attempt.
func sectionOf(secs []*section, ev event) *section {
	for _, s := range secs {
		if s.W == ev.W && s.Seq == ev.Seq {
			return s
		}
	}
	return nil
}

// assertSafe asserts what must hold in every scenario, whatever the fault:
// the fenced resource never accepted a stale write (by its own log and as the
// workers saw it), no acknowledged write was lost, the fenced history is
// linearizable, no fence was issued twice, and no renewal was sent after
// Release.
func assertSafe(t *testing.T, f figures) {
	t.Helper()
	if f.StaleAccepted != 0 {
		t.Errorf("fenced resource accepted %d stale writes, want 0", f.StaleAccepted)
	}
	if f.StaleAckWorker != 0 {
		t.Errorf("workers saw %d acknowledged writes not greater than one acknowledged before, want 0", f.StaleAckWorker)
	}
	if f.AckLost != 0 {
		t.Errorf("%d acknowledged fenced writes lost, want 0", f.AckLost)
	}
	if f.Linearizable != porcupine.Ok {
		t.Errorf("fenced history is %s, want Ok; visualization: %s", f.Linearizable, f.Visualization)
	}
	if f.DupFences != 0 {
		t.Errorf("%d fences issued to more than one acquisition, want 0", f.DupFences)
	}
	if f.AfterRelease != 0 {
		t.Errorf("%d renewals sent after their lease's Release, want 0", f.AfterRelease)
	}
	if f.Acquired == 0 {
		t.Errorf("no acquisition at all")
	}
}

// assertToldInTime asserts that every lease lost while its holder ran was
// cancelled before the lock was granted to anyone else, and that no write of
// the lost lease reached a resource after that grant.
func assertToldInTime(t *testing.T, f figures) {
	t.Helper()
	if f.LateCancels != 0 {
		t.Errorf("%d lost leases had their work cancelled only after the lock was granted again, want 0:\n%s",
			f.LateCancels, describeLosses(f))
	}
	if f.WritesAfter != 0 {
		t.Errorf("%d writes of lost leases reached a resource after the lock was granted again, want 0:\n%s",
			f.WritesAfter, describeLosses(f))
	}
}

// S0: no fault, one node. Mutual exclusion holds and fences increase.
func testS0(t *testing.T, v variant) {
	const ttl = 300 * time.Millisecond
	r := newRig(t, nil, func(_ int, addr string) workerConfig {
		c := defaults(addr, ttl)
		c.Hold = 3 * time.Millisecond
		return v.config(c)
	})
	if !r.c.awaitAcquired(0, 300, 60*time.Second) {
		t.Errorf("300 acquisitions not reached within 60s")
	}
	f, secs := finish(t, r.c, v.artifact("S0"))
	report(t, v.row("S0 none"), f, fmt.Sprintf("throughput %.0f acquisitions/s over %.1fs; liveness %d/%d attempts; acquisitions per worker %v",
		f.Throughput, f.Span.Seconds(), f.Acquired, f.Attempts, perWorker(secs)))
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

// S1: the holder is SIGSTOPped for 3×TTL between its check of the context and
// its writes (a GC pause at the worst moment), then resumed.
func testS1(t *testing.T, v variant) {
	const ttl = 300 * time.Millisecond
	r := newRig(t, nil, func(_ int, addr string) workerConfig { return v.config(pausedHolderConfig(defaults(addr, ttl))) })
	holderPaused(t, r.c, ttl, v.artifact("S1"), v.row("S1 SIGSTOP 3×TTL"))
}

// pausedHolderConfig is c with S1's sections: short, with work going on
// briefly after the writes.
func pausedHolderConfig(c workerConfig) workerConfig {
	c.Hold = 20 * time.Millisecond
	c.Linger = c.TTL / 5
	return c
}

// holderPaused runs S1 (and R3) on c's workers: the holder of the 10th,
// 30th and 50th commit is SIGSTOPped for 3×ttl before it writes.
func holderPaused(t *testing.T, c *coord, ttl time.Duration, artifact, row string) {
	t.Helper()
	type pause struct {
		ev       event
		from, to time.Duration
	}
	var (
		mu      sync.Mutex
		commits int
		pauses  []pause
	)
	pauseAt := map[int]bool{10: true, 30: true, 50: true}
	paused := make(chan struct{}, len(pauseAt))
	c.setOnCommit(func(ev event) {
		mu.Lock()
		commits++
		n := commits
		mu.Unlock()
		if !pauseAt[n] {
			return
		}
		from := time.Since(c.t0)
		if err := c.pauseFor(ev.W, 3*ttl); err != nil {
			t.Errorf("pause: %v", err)
		}
		mu.Lock()
		pauses = append(pauses, pause{ev, from, time.Since(c.t0)})
		mu.Unlock()
		paused <- struct{}{}
	})
	timeout := time.After(60 * time.Second)
	for range pauseAt {
		select {
		case <-paused:
		case <-timeout:
			t.Fatalf("the pauses did not all happen within 60s")
		}
	}
	c.setOnCommit(nil)
	c.awaitAcquired(0, 60, 20*time.Second)
	f, secs := finish(t, c, artifact)

	var notes []string
	for _, p := range pauses {
		s := sectionOf(secs, p.ev)
		var others int
		for _, x := range secs {
			if x.Acq != nil && x.W != p.ev.W && x.Acq.T > p.from && x.Acq.T < p.to {
				others++
			}
		}
		verdict := "no fenced write"
		if s.FWrite != nil {
			verdict = map[bool]string{true: "its fenced write was ACCEPTED", false: "its stale fenced write was rejected"}[s.FWrite.Accepted]
		}
		notes = append(notes, fmt.Sprintf("paused worker %d (fence %d) for %s: %d grants to others meanwhile; %s; ctx cause %q; RunWithLock: %s",
			p.ev.W, p.ev.Fence, ms(p.to-p.from), others, verdict, causeOf(s), errOf(s)))
		if others == 0 {
			t.Errorf("no other worker acquired the lock during a %s pause of its holder (TTL %s): a waiter was stuck past the holder's expiry", ms(p.to-p.from), ms(ttl))
		}
		if s.Cancel == nil || !s.Cancel.Lost {
			t.Errorf("worker %d's work context was not cancelled with ErrLost after its pause (cause %q)", p.ev.W, causeOf(s))
		}
		if s.Done == nil || !s.Done.Lost {
			t.Errorf("worker %d's RunWithLock did not report ErrLost after its pause: %s", p.ev.W, errOf(s))
		}
	}
	notes = append(notes, fmt.Sprintf("unfenced: %d overlapping sections, %d of %d updates lost; fenced: %d stale writes rejected, 0 accepted",
		f.Overlaps, f.LostUpdates, f.Writes, f.StaleRejected))
	report(t, row, f, notes...)
	assertSafe(t, f)
}

func causeOf(s *section) string {
	if s == nil || s.Cancel == nil {
		return "(not cancelled while the work ran)"
	}
	return s.Cancel.Cause
}

func errOf(s *section) string {
	if s == nil || s.Done == nil {
		return "(no result)"
	}
	if s.Done.Err == "" {
		return "nil"
	}
	return s.Done.Err
}

// S2: the holder's network is black-holed (or its connections reset) for
// 2×TTL; separately, one worker's round trips to Redis get about TTL/3 of
// added latency. Plain waiters let that slow worker starve. Fair ones serve
// it in its turn once its request is in line (asserted); its share of the
// acquisitions is reported against issue 16's target of a quarter, not
// asserted (GUARANTEES.md, open finding 1).
func testS2(t *testing.T, v variant) {
	const ttl, hold = 500 * time.Millisecond, 20 * time.Millisecond
	r := newRig(t, nil, func(_ int, addr string) workerConfig {
		c := defaults(addr, ttl)
		c.Hold = hold
		return v.config(c)
	})
	var notes []string
	var victims []event
	// The partition: once worker v holds the lock, its proxy black-holes
	// everything for 2×TTL (three rounds), or resets every connection for
	// 2×TTL (one round). The section holds 3×TTL, so it needs renewals.
	for round, mode := range []proxyMode{blackHole, blackHole, blackHole, reset} {
		v := round % nWorkers
		ev, ok := r.c.pickSection(func(ev event) bool { return ev.W == v }, 3*ttl,
			func(event) { r.proxies[v].set(mode) }, 10*time.Second)
		if !ok {
			t.Fatalf("worker %d did not hold the lock within 10s", v)
		}
		time.Sleep(2 * ttl)
		r.proxies[v].set(pass)
		if _, ok := r.c.awaitDone(ev, 10*time.Second); !ok {
			t.Fatalf("worker %d's attempt did not end within 10s of the partition healing", v)
		}
		victims = append(victims, ev)
	}

	// Latency: once worker 0 holds the lock, its proxy delays each direction
	// by TTL/6, so that each round trip to Redis takes about TTL/3 more; the
	// section holds 1.5×TTL, so it needs renewals.
	latency := ttl / 6
	var slow []event
	for range 3 {
		ev, ok := r.c.pickSection(func(ev event) bool { return ev.W == 0 }, 3*ttl/2,
			func(event) { r.proxies[0].setLatency(latency) }, 10*time.Second)
		if !ok {
			t.Fatalf("worker 0 did not hold the lock within 10s")
		}
		if _, ok := r.c.awaitDone(ev, 10*time.Second); !ok {
			t.Fatalf("worker 0's attempt under latency did not end within 10s")
		}
		r.proxies[0].setLatency(0)
		slow = append(slow, ev)
	}
	// Starvation: with the latency on for 3s, how often does worker 0 win
	// the lock against two workers without it?
	r.proxies[0].setLatency(latency)
	mark := r.c.mark()
	time.Sleep(3 * time.Second)
	r.proxies[0].setLatency(0)
	end := r.c.mark()

	f, secs := finish(t, r.c, v.artifact("S2"))
	events, _, _ := r.c.snapshot()
	sl := slowLinkOf(events, mark, end, 0, latency)
	for i, ev := range victims {
		mode := map[bool]string{true: "black-holed", false: "reset"}[i < 3]
		s := sectionOf(secs, ev)
		if s.Cancel == nil || !s.Cancel.Lost {
			t.Errorf("%s worker %d's work was not cancelled with ErrLost (cause %q)", mode, ev.W, causeOf(s))
			continue
		}
		if s.FWrite != nil || s.End == nil || s.End.Wrote {
			t.Errorf("%s worker %d wrote although its lease was lost before its section ended", mode, ev.W)
		}
		notes = append(notes, fmt.Sprintf("%s worker %d (fence %d): cancelled %s after its local deadline",
			mode, ev.W, ev.Fence, ms(time.Duration(s.Cancel.LagUS)*time.Microsecond)))
	}
	var lostSlow, okRenewals, failedRenewals int
	for _, ev := range slow {
		s := sectionOf(secs, ev)
		if s.Cancel != nil && s.Cancel.Lost {
			lostSlow++
		}
		okRenewals += s.Done.RenewOK
		failedRenewals += s.Done.RenewFail
	}
	notes = append(notes, fmt.Sprintf("latency %s each way from the start of worker 0's section: %d sections of 1.5×TTL, %d lost; their renewals: %d succeeded, %d failed",
		ms(latency), len(slow), lostSlow, okRenewals, failedRenewals),
		fmt.Sprintf("starvation: with that latency on for 3s, worker 0 won %d of %d acquisitions (%s; %d attempts of its own)",
			sl.wins, sl.all, share(sl.wins, sl.all), sl.tries))
	if sl.wins > 0 {
		notes = append(notes, fmt.Sprintf("at most %d grants to others came between one of its requests reaching Redis and its grant; "+
			"it learnt of a grant %s after it (mean), and the lock passed to the next holder %s after it (its sections hold %s)",
			sl.bypassMax, ms(sl.learn), ms(sl.turn), ms(hold)))
	}
	if v.fair && 4*sl.wins < sl.all {
		// Issue 16's target for fair waiting. Not asserted: a waiter is
		// in line only from when its request reaches Redis, and the two
		// local workers take turns meanwhile (GUARANTEES.md, open
		// finding 1); what the line does promise is asserted below.
		notes = append(notes, fmt.Sprintf("below issue 16's target for fair waiting: %s of the acquisitions, want at least 25%%",
			share(sl.wins, sl.all)))
	}
	report(t, v.row("S2 partition 2×TTL / +TTL/3 RTT"), f, notes...)
	assertSafe(t, f)
	if v.fair {
		// Once in line, the slow worker is served after the waiters ahead
		// of it, at most one other worker; one more for the grant that
		// may race its arrival.
		if sl.wins == 0 {
			t.Errorf("fair waiting: the worker on the slow link won none of %d acquisitions in 3s", sl.all)
		} else if sl.bypassMax > nWorkers-1 {
			t.Errorf("fair waiting: %d grants to other workers came after the slow worker's request reached Redis and before its grant, want at most %d",
				sl.bypassMax, nWorkers-1)
		}
	}
	assertToldInTime(t, f)
	if f.AfterCancel != 0 {
		t.Errorf("%d writes of lost leases after their cancellation, want 0:\n%s", f.AfterCancel, describeLosses(f))
	}
}

// S3r: S3's failover with Options.Replicas 1. A lock is granted only once
// the replica has acknowledged it (WAIT), so a failover to that replica
// keeps it. Each round: the replica in sync, a holder picked, the master
// killed at once, the replica promoted and the clients moved to it; 0 double
// grants (asserted). Then the replica's link is cut for 1s: acquisitions
// are refused (ErrUnavailable, "0 of 1 replicas acknowledged") instead of
// granted unreplicated, which is what made S3 lose the lock.
func testS3Replicas(t *testing.T) {
	const ttl = 300 * time.Millisecond
	master := startRedis(t, "redis0")
	var proxies []*proxy
	for range nWorkers {
		proxies = append(proxies, startProxy(t, master.addr))
	}
	link := startProxy(t, master.addr)
	_, linkPort, _ := strings.Cut(link.addr, ":")
	replica := startRedis(t, "redis1", "--replicaof", "127.0.0.1", linkPort)
	if err := waitFor(10*time.Second, func() error { return inSync(master, replica) }); err != nil {
		t.Fatalf("replica not in sync: %v", err)
	}
	time.Sleep(1100 * time.Millisecond) // the replica's first acknowledgement: WAIT ignores it before
	c := startCoord(t, nWorkers, func(w int) workerConfig {
		cfg := defaults(proxies[w].addr, ttl)
		cfg.Hold = 20 * time.Millisecond
		cfg.Replicas, cfg.ReplicaTimeout = 1, 50*time.Millisecond
		return cfg
	})
	if !c.awaitAcquired(0, 5, 10*time.Second) {
		t.Fatalf("no acquisitions on the first master")
	}
	var notes []string
	var rounds [][2]event
	for round := 1; round <= 3; round++ {
		// The replica's link cut: nothing is granted.
		link.set(blackHole)
		mark := c.mark()
		time.Sleep(time.Second)
		granted := c.countFrom(mark, func(ev event) bool { return ev.Op == "acquired" })
		refused := c.countFrom(mark, func(ev event) bool { return ev.Op == "done" && ev.Unavailable })
		link.set(pass)
		notes = append(notes, fmt.Sprintf("round %d: with the replica's link cut for 1s, %d acquisitions granted, %d attempts refused",
			round, granted, refused))
		if granted > 1 { // one may have been acknowledged just before the cut
			t.Errorf("round %d: %d acquisitions granted while the replica could not acknowledge them", round, granted)
		}
		if err := waitFor(10*time.Second, func() error { return inSync(master, replica) }); err != nil {
			t.Fatalf("round %d: replica not in sync: %v", round, err)
		}

		// A failover while a lock is held: the promoted replica has it.
		after := wallMicros(time.Now())
		victim, ok := c.pickSection(func(ev event) bool { return ev.Fence > after }, 2*ttl, nil, 10*time.Second)
		if !ok {
			t.Fatalf("round %d: no lock taken after the link was healed", round)
		}
		master.kill()
		if _, err := replica.do("REPLICAOF", "NO", "ONE"); err != nil {
			t.Fatalf("round %d: promote: %v", round, err)
		}
		held, _ := replica.do("EXISTS", "lock:{chaos}")
		for _, p := range proxies {
			p.retarget(replica.addr)
		}
		// The promoted master needs a replica of its own before anything
		// can be acknowledged again (renewals included).
		link.close()
		master = replica
		link = startProxy(t, master.addr)
		_, linkPort, _ = strings.Cut(link.addr, ":")
		replica = startRedis(t, fmt.Sprintf("redis%d", round+1), "--replicaof", "127.0.0.1", linkPort)
		if err := waitFor(10*time.Second, func() error { return inSync(master, replica) }); err != nil {
			t.Fatalf("round %d: new replica not in sync: %v", round, err)
		}
		next, _, granted2 := c.await(0, 10*time.Second, func(ev event) bool { return ev.Op == "acquired" && ev.Fence > victim.Fence })
		if _, ok := c.awaitDone(victim, 10*time.Second); !ok {
			t.Fatalf("round %d: the victim's attempt did not end", round)
		}
		note := fmt.Sprintf("round %d: worker %d took the lock on the master (fence %d), acknowledged by the replica; keys named lock:{chaos} on the promoted replica: %v",
			round, victim.W, victim.Fence, held)
		if granted2 {
			note += fmt.Sprintf("; the next grant, once the promoted master had a replica again: worker %d, fence %d (+%s)", next.W, next.Fence,
				ms(time.Duration(next.Fence-victim.Fence)*time.Microsecond))
			rounds = append(rounds, [2]event{victim, next})
		}
		notes = append(notes, note)
	}
	link.close()
	f, secs := finish(t, c, "S3r")
	doubled := 0
	for _, rd := range rounds {
		if v := sectionOf(secs, rd[0]); v != nil && v.beliefEnd() > rd[1].Fence {
			doubled++
		}
	}
	notes = append(notes, fmt.Sprintf("%d of %d failovers granted the lock while its holder still believed it held it", doubled, len(rounds)),
		"a holder whose renewals found no replica to acknowledge them lost its lease at its deadline (lost ctx/run): Replicas trades availability for it")
	report(t, "S3r failover, Replicas 1", f, notes...)
	if len(rounds) == 0 {
		t.Errorf("no grant after any failover")
	}
	assertSafe(t, f)
	if doubled != 0 || f.DoubleGrants != 0 {
		t.Errorf("%d double grants at failovers (%d in all), want 0 with Replicas 1", doubled, f.DoubleGrants)
	}
}

// S3: a deterministic failover that loses the lock: the replica's link is
// cut, a lock is taken on the master, the master is killed, the replica is
// promoted and the clients are moved to it.
func testS3(t *testing.T, v variant) {
	const ttl = 300 * time.Millisecond
	master := startRedis(t, "redis0")
	var proxies []*proxy
	for range nWorkers {
		proxies = append(proxies, startProxy(t, master.addr))
	}
	c := startCoord(t, nWorkers, func(w int) workerConfig {
		cfg := defaults(proxies[w].addr, ttl)
		cfg.Hold = 20 * time.Millisecond
		return v.config(cfg)
	})
	if !c.awaitAcquired(0, 5, 10*time.Second) {
		t.Fatalf("no acquisitions on the first master")
	}
	var notes []string
	var rounds [][2]event // the victim and the next grant of each round
	for round := 1; round <= 3; round++ {
		link := startProxy(t, master.addr)
		_, linkPort, _ := strings.Cut(link.addr, ":")
		replica := startRedis(t, fmt.Sprintf("redis%d", round), "--replicaof", "127.0.0.1", linkPort)
		if err := waitFor(10*time.Second, func() error { return inSync(master, replica) }); err != nil {
			t.Fatalf("round %d: replica not in sync: %v", round, err)
		}
		link.set(blackHole) // the replica's link is cut: it receives nothing more
		// The replica may still have the lock of the holder at the cut
		// (its release came later): wait until that copy has expired, so
		// that the next lock taken on the master is one the replica knows
		// nothing about.
		err := waitFor(2*ttl, func() error {
			n, err := replica.do("EXISTS", "lock:{chaos}")
			if err == nil && n != int64(0) {
				err = fmt.Errorf("the replica still has a lock")
			}
			return err
		})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		free := wallMicros(time.Now())
		victim, ok := c.pickSection(func(ev event) bool { return ev.Fence > free }, 2*ttl, nil, 10*time.Second)
		if !ok {
			t.Fatalf("round %d: no lock taken on the master after the cut", round)
		}
		time.Sleep(30 * time.Millisecond)
		master.kill()
		if _, err := replica.do("REPLICAOF", "NO", "ONE"); err != nil {
			t.Fatalf("round %d: promote: %v", round, err)
		}
		held, _ := replica.do("EXISTS", "lock:{chaos}")
		// Fair waiters' line as the replica had it at the cut: entries of
		// waiters that have long moved on, which the promoted replica
		// serves first until they expire.
		line, _ := replica.do("ZCARD", "lock:{chaos}:q")
		for _, p := range proxies {
			p.retarget(replica.addr)
		}
		next, _, granted := c.await(0, 5*time.Second, func(ev event) bool { return ev.Op == "acquired" && ev.Fence > victim.Fence })
		if _, ok := c.awaitDone(victim, 10*time.Second); !ok {
			t.Fatalf("round %d: the victim's attempt did not end", round)
		}
		note := fmt.Sprintf("round %d: worker %d took the lock on the master (fence %d); keys named lock:{chaos} on the promoted replica: %v, entries in its line: %v",
			round, victim.W, victim.Fence, held, line)
		if granted {
			note += fmt.Sprintf("; worker %d then got it from the promoted replica with fence %d (+%s)",
				next.W, next.Fence, ms(time.Duration(next.Fence-victim.Fence)*time.Microsecond))
			rounds = append(rounds, [2]event{victim, next})
		}
		notes = append(notes, note)
		link.close()
		master = replica
	}
	f, secs := finish(t, c, v.artifact("S3"))
	doubled := 0
	for _, rd := range rounds {
		if s := sectionOf(secs, rd[0]); s != nil && s.beliefEnd() > rd[1].Fence {
			doubled++
			notes = append(notes, fmt.Sprintf("worker %d still believed it held the lock %s after the promoted replica granted it to worker %d",
				rd[0].W, ms(time.Duration(s.beliefEnd()-rd[1].Fence)*time.Microsecond), rd[1].W))
		}
	}
	notes = append(notes, fmt.Sprintf("failovers with a double grant: %d of 3 (grants made while an earlier holder still believed: %d)", doubled, f.DoubleGrants))
	report(t, v.row("S3 failover, link cut"), f, notes...)
	assertSafe(t, f)
}

// inSync reports whether replica is connected to master and has received
// everything master had sent when asked.
func inSync(master, replica *redisNode) error {
	mi, err := master.info("replication")
	if err != nil {
		return err
	}
	ri, err := replica.info("replication")
	if err != nil {
		return err
	}
	if ri["master_link_status"] != "up" {
		return fmt.Errorf("master_link_status %q", ri["master_link_status"])
	}
	mo, _ := strconv.ParseInt(mi["master_repl_offset"], 10, 64)
	ro, _ := strconv.ParseInt(ri["slave_repl_offset"], 10, 64)
	if ro < mo {
		return fmt.Errorf("replica offset %d behind master's %d", ro, mo)
	}
	return nil
}

// S4: Sentinel (1 master, 2 replicas, 3 sentinels) and the variant's
// Sentinel client (go-redis's failover client, or rueidis's or valkey-go's
// with its Sentinel option); the master is killed (and restarted), killed
// again, then SIGSTOPped for 3s.
func testS4(t *testing.T, v variant) {
	const ttl = 300 * time.Millisecond
	setupStart := time.Now()
	m := startRedis(t, "redis0")
	nodes := []*redisNode{m}
	for i := 1; i <= 2; i++ {
		nodes = append(nodes, startRedis(t, fmt.Sprintf("redis%d", i), "--replicaof", "127.0.0.1", strconv.Itoa(m.port)))
	}
	for _, r := range nodes[1:] {
		if err := waitFor(10*time.Second, func() error { return inSync(m, r) }); err != nil {
			t.Fatalf("replica %s: %v", r.name, err)
		}
	}
	conf := fmt.Sprintf("sentinel monitor fl 127.0.0.1 %d 2\n"+
		"sentinel down-after-milliseconds fl 1000\n"+
		"sentinel failover-timeout fl 2000\n"+
		"sentinel parallel-syncs fl 2\n", m.port)
	var sentinels []*redisNode
	var addrs []string
	for i := range 3 {
		s := startSentinel(t, fmt.Sprintf("sentinel%d", i), conf)
		sentinels = append(sentinels, s)
		addrs = append(addrs, s.addr)
	}
	for _, s := range sentinels {
		err := waitFor(20*time.Second, func() error {
			others, err := s.do("SENTINEL", "SENTINELS", "fl")
			if err != nil {
				return err
			}
			replicas, err := s.do("SENTINEL", "REPLICAS", "fl")
			if err != nil {
				return err
			}
			if len(others.([]any)) != 2 || len(replicas.([]any)) != 2 {
				return fmt.Errorf("%s knows %d sentinels and %d replicas", s.name, len(others.([]any)), len(replicas.([]any)))
			}
			return nil
		})
		if err != nil {
			t.Fatalf("sentinels not ready: %v", err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("FENCELOCK_CHAOS_DUMP") == "1" {
			for _, n := range append(append([]*redisNode{}, nodes...), sentinels...) {
				path := filepath.Join(artifactDir(), v.artifact("S4")+"-"+n.name+".log")
				if err := os.WriteFile(path, []byte(n.log()), 0o644); err == nil {
					t.Logf("chaos: %s's log written to %s", n.name, path)
				}
			}
		}
	})
	c := startCoord(t, nWorkers, func(int) workerConfig {
		cfg := defaults("", ttl)
		cfg.SentinelAddrs, cfg.MasterName = addrs, "fl"
		cfg.Hold = 20 * time.Millisecond
		return v.config(cfg)
	})
	if !c.awaitAcquired(0, 10, 10*time.Second) {
		t.Fatalf("no acquisitions through Sentinel")
	}
	notes := []string{fmt.Sprintf("setup (3 nodes, 3 sentinels discovering each other): %s", ms(time.Since(setupStart)))}
	failovers := 0
	for i, fault := range []string{"kill", "kill", "stop"} {
		// A fault during an unfinished failover leaves the sentinels
		// disagreeing for seconds (two masters, clients split between
		// them): start each round from a settled configuration.
		// On a loaded machine a rejoin can take Sentinel long: that is
		// Sentinel's timing, not the library's, so later rounds are skipped
		// (with a note) rather than failed; the rounds run are still judged.
		if err := waitFor(45*time.Second, func() error { return settled(sentinels) }); err != nil {
			if i == 0 {
				t.Fatalf("round 1: Sentinel did not settle: %v", err)
			}
			notes = append(notes, fmt.Sprintf("round %d: not run, Sentinel did not settle within 45s: %v", i+1, err))
			break
		}
		old, err := masterOf(sentinels[0])
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		var n *redisNode
		for _, x := range nodes {
			if x.addr == old {
				n = x
			}
		}
		if n == nil {
			t.Fatalf("round %d: sentinel names unknown master %s", i, old)
		}
		// Poll the sentinels from the moment the fault begins, also while
		// a stopped master is still stopped.
		var (
			movedAfter time.Duration
			now        string
			resumedAt  time.Time
		)
		moved := func() error {
			for _, s := range sentinels {
				a, err := masterOf(s)
				if err != nil {
					return err
				}
				if a == old {
					return fmt.Errorf("%s still names %s", s.name, old)
				}
				now = a
			}
			return nil
		}
		faultAt := time.Now()
		switch fault {
		case "stop":
			if err := n.pause(); err != nil {
				t.Fatal(err)
			}
			if waitFor(3*time.Second-10*time.Millisecond, moved) == nil {
				movedAfter = time.Since(faultAt)
			}
			time.Sleep(time.Until(faultAt.Add(3 * time.Second)))
			if err := n.resume(); err != nil {
				t.Fatal(err)
			}
			resumedAt = time.Now()
		case "kill":
			n.kill()
		}
		if movedAfter == 0 {
			if err := waitFor(15*time.Second, moved); err != nil {
				notes = append(notes, fmt.Sprintf("round %d (%s %s): no failover: %v", i+1, fault, n.name, err))
			} else {
				movedAfter = time.Since(faultAt)
			}
		}
		if movedAfter != 0 {
			failovers++
			notes = append(notes, fmt.Sprintf("round %d (%s %s at %s): all sentinels named the new master %s %s after the fault began",
				i+1, fault, n.name, faultAt.Format("15:04:05.000"), now, ms(movedAfter)))
		}
		if fault == "kill" {
			n.restart()
		}
		// The old master rejoins as a replica of the new one.
		err = waitFor(20*time.Second, func() error {
			info, err := n.info("replication")
			if err != nil {
				return err
			}
			if info["role"] != "slave" || info["master_link_status"] != "up" {
				return fmt.Errorf("%s: role %s, link %s", n.name, info["role"], info["master_link_status"])
			}
			return nil
		})
		if err != nil {
			notes = append(notes, fmt.Sprintf("round %d: old master did not rejoin: %v", i+1, err))
		} else {
			note := fmt.Sprintf("round %d: old master rejoined as a replica %s after the fault began", i+1, ms(time.Since(faultAt)))
			if !resumedAt.IsZero() {
				note += fmt.Sprintf(" (resumed, it was a second master for %s)", ms(time.Since(resumedAt)))
			}
			notes = append(notes, note)
		}
		c.awaitAcquired(c.mark(), 5, 10*time.Second)
	}
	f, _ := finish(t, c, v.artifact("S4"))
	notes = append(notes, fmt.Sprintf("failovers: %d of 3 faults; unavailability (longest time with no holder): %s; overlaps: %d; double grants: %d",
		failovers, ms(f.MaxGap), f.Overlaps, f.DoubleGrants))
	report(t, v.row("S4 Sentinel stop/kill"), f, notes...)
	assertSafe(t, f)
}

// settled reports whether every sentinel names the same master with the same
// configuration epoch and no failover in progress, and that master has its
// two replicas online.
func settled(sentinels []*redisNode) error {
	var addr, epoch string
	for _, s := range sentinels {
		v, err := s.do("SENTINEL", "MASTER", "fl")
		if err != nil {
			return err
		}
		kv, _ := v.([]any)
		m := make(map[string]string)
		for i := 0; i+1 < len(kv); i += 2 {
			m[fmt.Sprint(kv[i])] = fmt.Sprint(kv[i+1])
		}
		a := m["ip"] + ":" + m["port"]
		if m["flags"] != "master" {
			return fmt.Errorf("%s: master %s flags %q", s.name, a, m["flags"])
		}
		if addr == "" {
			addr, epoch = a, m["config-epoch"]
		} else if a != addr || m["config-epoch"] != epoch {
			return fmt.Errorf("%s names %s (epoch %s), another %s (epoch %s)", s.name, a, m["config-epoch"], addr, epoch)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return err
	}
	if online := strings.Count(info, "state=online"); !strings.Contains(info, "role:master") || online != 2 {
		return fmt.Errorf("master %s: %d replicas online", addr, online)
	}
	return nil
}

// masterOf returns the master address Sentinel s names.
func masterOf(s *redisNode) (string, error) {
	v, err := s.do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "fl")
	if err != nil {
		return "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return "", fmt.Errorf("unexpected reply %v", v)
	}
	return fmt.Sprintf("%v:%v", a[0], a[1]), nil
}

// S5: the server is killed and restarted: at once without persistence, after
// more than the longest TTL without persistence, and at once with
// appendfsync always.
func testS5(t *testing.T) {
	const ttl = 300 * time.Millisecond
	r := newRig(t, nil, func(_ int, addr string) workerConfig {
		c := defaults(addr, ttl)
		c.Hold = 20 * time.Millisecond
		return c
	})
	if !r.c.awaitAcquired(0, 5, 10*time.Second) {
		t.Fatalf("no acquisitions")
	}
	type phase struct {
		name     string
		from, to time.Duration
		victims  []event
	}
	var phases []*phase
	runPhase := func(name string, node *redisNode, rounds int, down time.Duration) {
		ph := &phase{name: name, from: time.Since(r.c.t0)}
		for range rounds {
			v, ok := r.c.pickSection(anySection, 2*ttl, nil, 10*time.Second)
			if !ok {
				t.Fatalf("%s: nobody held the lock within 10s", name)
			}
			time.Sleep(30 * time.Millisecond)
			node.kill()
			time.Sleep(down)
			node.restart()
			if _, ok := r.c.awaitDone(v, 10*time.Second); !ok {
				t.Fatalf("%s: the holder's attempt did not end", name)
			}
			r.c.awaitAcquired(r.c.mark(), 3, 10*time.Second)
			ph.victims = append(ph.victims, v)
		}
		ph.to = time.Since(r.c.t0)
		phases = append(phases, ph)
	}
	runPhase("immediate restart, no persistence", r.node, 3, 0)
	runPhase("restart after TTL+200ms, no persistence", r.node, 2, ttl+200*time.Millisecond)
	aof := startRedis(t, "redis-aof", "--appendonly", "yes", "--appendfsync", "always")
	for _, p := range r.proxies {
		p.retarget(aof.addr)
	}
	r.c.awaitAcquired(r.c.mark(), 5, 10*time.Second)
	runPhase("immediate restart, appendfsync always", aof, 3, 0)

	f, secs := finish(t, r.c, "S5")
	var notes []string
	for i, ph := range phases {
		var dbl, lost int
		for _, x := range secs {
			if x.Acq == nil || x.Acq.T < ph.from || x.Acq.T > ph.to {
				continue
			}
			for _, y := range secs {
				if y.Acq != nil && y.W != x.W && y.Fence < x.Fence && y.beliefEnd() > x.Fence {
					dbl++
					break
				}
			}
		}
		for _, v := range ph.victims {
			if s := sectionOf(secs, v); s.Cancel != nil && s.Cancel.Lost {
				lost++
			}
		}
		notes = append(notes, fmt.Sprintf("%s: %d rounds, holder lost the lease in %d, double grants %d",
			ph.name, len(ph.victims), lost, dbl))
		if i > 0 && dbl != 0 {
			t.Errorf("%s: %d double grants, want 0", ph.name, dbl)
		}
	}
	report(t, "S5 restart", f, notes...)
	assertSafe(t, f)
}

// slowRate is a clock rate that loses frac of ttl's drift allowance over the
// lease's TTL: inside the allowance for frac < 1.
func slowRate(ttl time.Duration, frac float64) float64 {
	drift := ttl/100 + 2*time.Millisecond
	return float64(ttl-drift) / (float64(ttl-drift) + frac*float64(drift))
}

// S6: the lock's local clock runs slow. Inside the drift allowance (the
// clock loses half of TTL/100+2ms over a TTL) every lease's deadline, in real
// time, comes before the server's expiry, and no holder still believes it
// holds the lock when it is granted again; beyond it (5% slow) the deadline
// comes after the server's expiry.
//
// Every section holds for 3×TTL with Options.MaxHold at TTL/10, so the
// watchdog never renews and every lease ends at its local deadline; the work
// then takes 50ms to stop (it writes nothing meanwhile), so the lock is
// released only after the server's expiry and each handover pits the
// deadline against the expiry.
//
// Inside the allowance the deadline leaves only about 3.5ms before the
// expiry, so the unfenced overlaps (counted where the coordinator receives
// the section's end, one round trip after the worker reported the
// cancellation) are reported but not asserted: CI measured one where the
// cancellation came 0.4ms before the next grant and its report arrived after
// it. What the allowance promises is asserted: the deadline precedes the
// expiry (exact, whatever the load) and no grant is made while the previous
// holder believes it holds (as the worker's own clock dates both).
func testS6(t *testing.T, inside bool) {
	const ttl = 500 * time.Millisecond
	drift := ttl/100 + 2*time.Millisecond
	rate := 0.95
	if inside {
		rate = slowRate(ttl, 0.5)
	}
	r := newRig(t, nil, func(_ int, addr string) workerConfig {
		c := defaults(addr, ttl)
		c.Hold = 3 * ttl
		c.Wait = 3 * ttl
		c.MaxHold = ttl / 10
		c.StopDelay = 50 * time.Millisecond
		c.ClockRate = rate
		return c
	})
	if !r.c.awaitAcquired(0, 10, 30*time.Second) {
		t.Errorf("10 acquisitions not reached within 30s")
	}
	f, _ := finish(t, r.c, "S6")
	late := time.Duration((1/rate - 1) * float64(ttl-drift))
	report(t, fmt.Sprintf("S6 clock ×%.4f", rate), f, fmt.Sprintf(
		"clock rate %.5f: the local deadline comes %s late in real time, against a drift allowance of %s; "+
			"cancelled at least %s before the server's expiry (%d after it); overlaps %d; cancellations after the next grant %d",
		rate, ms(late), ms(drift), ms(f.ExpiryMin), f.ExpiryLate, f.Overlaps, f.LateCancels))
	assertSafe(t, f)
	if !inside {
		return
	}
	for _, l := range f.losses {
		if s := l.sec; s.Acq != nil && s.Acq.Deadline >= s.at()+ttl.Microseconds() {
			t.Errorf("worker %d fence %d: the lease's deadline is %s after the server's expiry with the clock drift inside the allowance, want before",
				s.W, s.Fence, ms(time.Duration(s.Acq.Deadline-s.at())*time.Microsecond-ttl))
		}
	}
	if f.DoubleGrants != 0 {
		t.Errorf("%d grants while the previous holder still believed it held the lock, with the clock drift inside the allowance, want 0:\n%s",
			f.DoubleGrants, describeLosses(f))
	}
}

// S6, renewals: a healthy network, leases that need renewing, and a lock
// clock inside the drift allowance (0.7% slow) that has been running slow for
// a minute, so it lags real time by about 0.4s. Nothing is lost in reality:
// every lease should be renewed until its work ends.
func testS6Renewals(t *testing.T) {
	const ttl = 300 * time.Millisecond
	rate := slowRate(ttl, 0.5)
	r := newRig(t, nil, func(_ int, addr string) workerConfig {
		c := defaults(addr, ttl)
		c.Hold = 2 * ttl
		c.ClockRate = rate
		c.ClockSince = time.Minute
		return c
	})
	if !r.c.awaitAcquired(0, 6, 20*time.Second) {
		t.Errorf("6 acquisitions not reached within 20s")
	}
	f, _ := finish(t, r.c, "S6r")
	lag := time.Duration((1 - rate) * float64(time.Minute))
	report(t, fmt.Sprintf("S6 renewals, clock ×%.4f", rate), f, fmt.Sprintf(
		"clock rate %.5f, lagging real time by %s: %d of %d leases lost on a healthy network",
		rate, ms(lag), f.Lost, f.Acquired))
	assertSafe(t, f)
	if f.Lost != 0 {
		t.Errorf("%d of %d leases lost on a healthy network with the lock's clock %.2f%% slow (inside the drift allowance), want 0;"+
			" the renewals failed with:\n%s", f.Lost, f.Acquired, 100*(1-rate), describeLosses(f))
	}
}
