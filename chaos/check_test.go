package chaos

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// A section is one attempt of one worker, assembled from its events.
type section struct {
	W, Seq int
	Fence  int64
	Acq    *event // acquired (nil: the lock was not obtained)
	Begin  *event // ubegin
	FWrite *event // fwrite
	End    *event // uend
	Cancel *event // cancel
	Done   *event // done
}

// at is the wall time (µs) of the grant, on the host clock the workers'
// wall times are read from: one node's fence is its server's TIME at the
// grant; a Redlock fence counts up by one, and its worker reports the TIME
// at which the q-th node granted it instead.
func (s *section) at() int64 {
	if s.Acq != nil && s.Acq.Granted > 0 {
		return s.Acq.Granted
	}
	return s.Fence
}

// beliefEnd is the wall time (µs) at which the holder stopped believing it
// held the lock: its context was cancelled or its work returned.
func (s *section) beliefEnd() int64 {
	end := int64(1<<63 - 1)
	if s.Cancel != nil {
		end = s.Cancel.Wall
	}
	if s.Done != nil {
		if s.Done.WorkEnd > 0 {
			end = min(end, s.Done.WorkEnd)
		} else {
			end = min(end, s.Done.Wall)
		}
	}
	return end
}

// A loss is a lease whose work context was cancelled with ErrLost.
type loss struct {
	sec         *section
	lag         time.Duration // from the lease's local deadline to the cancellation (worker's clock)
	next        *section      // the next grant of the lock, if any
	margin      time.Duration // from the cancellation to the next grant (positive: before it)
	expiry      time.Duration // from the cancellation to the server's expiry of a lease never renewed (positive: before it)
	renewed     bool          // the lease was renewed at least once (expiry unknown)
	writesAfter int           // writes of the lost lease that reached a resource after the next grant
	afterCancel int           // writes of the lost lease that reached a resource after its cancellation was reported
}

// figures is what one scenario measured.
type figures struct {
	Attempts, Acquired int
	Span               time.Duration
	Throughput         float64 // acquisitions per second

	Overlaps    int // pairs of unfenced critical sections that intersect
	Writes      int // unfenced read-modify-write updates made
	LostUpdates int // of those, overwritten by a concurrent one

	FencedWrites   int
	StaleRejected  int // fenced writes rejected: a greater fence had been accepted
	StaleAccepted  int // resource's log: accepted writes whose fence was not the greatest (must be 0)
	StaleAckWorker int // workers' view: acknowledged writes not greater than one acknowledged before (must be 0)
	AckLost        int // acknowledged writes missing from the resource's final state (must be 0)
	Linearizable   porcupine.CheckResult
	Visualization  string // path of porcupine's HTML, written when not linearizable

	DupFences        int           // fences issued to more than one acquisition (must be 0)
	FencesIncreasing bool          // fences increase in the order the acquisitions were reported
	DoubleGrants     int           // grants made while an earlier holder still believed it held the lock
	doubles          [][2]*section // each double grant: the earlier holder and the grant

	Lost        int // leases whose work context was cancelled with ErrLost
	LostRun     int // RunWithLock calls that returned ErrLost
	LateCancels int // losses cancelled only after the lock was granted again
	WritesAfter int // writes of lost leases that reached a resource after the next grant
	AfterCancel int // writes of lost leases that reached a resource after their cancellation was reported
	LagMax      time.Duration
	MarginMin   time.Duration // over the losses followed by a grant
	ExpiryMin   time.Duration // over the losses never renewed: from the cancellation to the server's expiry
	ExpiryLate  int           // losses never renewed that were cancelled after the server's expiry
	losses      []loss

	MaxGap       time.Duration // longest time with no holder
	MaxHandover  time.Duration // longest time from a holder's work returning to the next grant
	AfterRelease int64         // renewals sent for a lease after its Release (must be 0)

	Unavailable, NotObtained int // RunWithLock calls that got no lease: ErrUnavailable, ErrNotObtained (a lost lease's error may wrap an ErrUnavailable: not counted)

	// Redlock only.
	Repairs, Repaired   int   // repairs sent to nodes that had lost a held lock, and those that put it back
	RepairsAfterRelease int64 // repairs sent for a lease after its Release (each worker's count; the largest)
}

// analyze assembles the events into sections and computes the figures.
// name names porcupine's visualization file if one is written.
func analyze(events []event, counter, highest int64, ttl time.Duration, name string) (figures, []*section) {
	var f figures
	byKey := make(map[[2]int]*section)
	var secs []*section
	get := func(ev event) *section {
		k := [2]int{ev.W, ev.Seq}
		s := byKey[k]
		if s == nil {
			s = &section{W: ev.W, Seq: ev.Seq}
			byKey[k] = s
			secs = append(secs, s)
		}
		return s
	}
	var acqOrder []*section
	for i := range events {
		ev := &events[i]
		switch ev.Op {
		case "acquired":
			s := get(*ev)
			s.Acq, s.Fence = ev, ev.Fence
			acqOrder = append(acqOrder, s)
		case "ubegin":
			get(*ev).Begin = ev
		case "fwrite":
			get(*ev).FWrite = ev
		case "uend":
			get(*ev).End = ev
		case "cancel":
			get(*ev).Cancel = ev
		case "done":
			get(*ev).Done = ev
			f.Repairs += ev.Repairs
			f.Repaired += ev.Repaired
		case "next", "bye":
			f.AfterRelease = max(f.AfterRelease, ev.AfterRelease)
			f.RepairsAfterRelease = max(f.RepairsAfterRelease, ev.RepairsAfterRelease)
		}
	}

	var first, last time.Duration = -1, 0
	for _, s := range secs {
		if s.Done != nil {
			f.Attempts++
			last = max(last, s.Done.T)
			if s.Done.Lost {
				f.LostRun++
			}
			if s.Acq == nil && s.Done.Unavailable {
				f.Unavailable++
			}
			if s.Acq == nil && s.Done.NotObtained {
				f.NotObtained++
			}
		}
		if s.Acq != nil {
			f.Acquired++
			if first < 0 || s.Acq.T < first {
				first = s.Acq.T
			}
		}
	}
	if first >= 0 && last > first {
		f.Span = last - first
		f.Throughput = float64(f.Acquired) / f.Span.Seconds()
	}

	// Unfenced resource: overlapping sections and lost updates.
	type span struct{ from, to time.Duration }
	var spans []span
	for _, s := range secs {
		if s.Begin == nil {
			continue
		}
		to := time.Duration(1<<63 - 1)
		switch {
		case s.End != nil:
			to = s.End.T
		case s.Done != nil:
			to = s.Done.T
		}
		spans = append(spans, span{s.Begin.T, to})
		if s.End != nil && s.End.Wrote {
			f.Writes++
		}
	}
	for i := range spans {
		for j := i + 1; j < len(spans); j++ {
			if spans[i].from < spans[j].to && spans[j].from < spans[i].to {
				f.Overlaps++
			}
		}
	}
	f.LostUpdates = f.Writes - int(counter)

	// Fenced resource, as the resource logged it.
	var top int64
	for _, ev := range events {
		if ev.Op != "fwrite" {
			continue
		}
		f.FencedWrites++
		switch {
		case ev.Accepted && ev.Fence <= top:
			f.StaleAccepted++
		case ev.Accepted:
			top = ev.Fence
		default:
			f.StaleRejected++
		}
	}
	// ... and as the workers saw it.
	type op struct {
		w           int
		fence       int64
		call, ret   time.Duration
		acked, seen bool
	}
	var ops []op
	var maxAcked int64
	for _, s := range secs {
		if s.FWrite == nil {
			continue
		}
		o := op{w: s.W, fence: s.Fence, call: s.FWrite.T, ret: s.FWrite.RT, acked: s.FWrite.Accepted}
		if s.End != nil && s.End.FWrote {
			o.ret, o.acked, o.seen = s.End.T, s.End.Acked, true
			if o.acked && !s.FWrite.Accepted {
				f.AckLost++ // acknowledged, but the resource did not keep it
			}
		}
		if o.acked {
			maxAcked = max(maxAcked, o.fence)
		}
		ops = append(ops, o)
	}
	if maxAcked > highest {
		f.AckLost++
	}
	for _, o := range ops {
		if !o.acked {
			continue
		}
		for _, p := range ops {
			if p.acked && p.ret < o.call && p.fence >= o.fence {
				f.StaleAckWorker++
				break
			}
		}
	}
	history := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		history = append(history, porcupine.Operation{ClientId: o.w, Input: o.fence, Output: o.acked,
			Call: int64(o.call), Return: int64(o.ret)})
	}
	res, info := porcupine.CheckOperationsVerbose(fencedRegister, history, 30*time.Second)
	f.Linearizable = res
	if res != porcupine.Ok {
		f.Visualization = filepath.Join(artifactDir(), name+"-porcupine.html")
		if err := porcupine.VisualizePath(fencedRegister, info, f.Visualization); err != nil {
			f.Visualization = "(not written: " + err.Error() + ")"
		}
	}

	// Fences.
	seen := make(map[int64]int)
	f.FencesIncreasing = true
	for i, s := range acqOrder {
		seen[s.Fence]++
		if i > 0 && s.Fence <= acqOrder[i-1].Fence {
			f.FencesIncreasing = false
		}
	}
	for _, n := range seen {
		if n > 1 {
			f.DupFences += n - 1
		}
	}
	byFence := slices.Clone(acqOrder)
	slices.SortFunc(byFence, func(a, b *section) int { return cmp.Compare(a.Fence, b.Fence) })
	for i, x := range byFence {
		for _, y := range byFence[:i] {
			if y.W != x.W && y.beliefEnd() > x.at() {
				f.DoubleGrants++
				f.doubles = append(f.doubles, [2]*section{y, x})
				break
			}
		}
	}

	// Losses: how long after the local deadline the work was told, and
	// whether before the lock was granted to someone else.
	f.MarginMin = time.Duration(1<<63 - 1)
	for i, s := range byFence {
		if s.Cancel == nil || !s.Cancel.Lost {
			continue
		}
		l := loss{sec: s, lag: time.Duration(s.Cancel.LagUS) * time.Microsecond}
		// A lease never renewed expires on the server TTL after the
		// acquire script ran (at).
		l.renewed = s.Done == nil || s.Done.RenewOK > 0
		l.expiry = time.Duration(s.at()-s.Cancel.Wall)*time.Microsecond + ttl
		if !l.renewed {
			if f.ExpiryLate == 0 && f.ExpiryMin == 0 || l.expiry < f.ExpiryMin {
				f.ExpiryMin = l.expiry
			}
			if l.expiry <= 0 {
				f.ExpiryLate++
			}
		}
		f.Lost++
		f.LagMax = max(f.LagMax, l.lag)
		for _, ev := range []*event{s.FWrite, s.End} {
			if ev != nil && (ev.Op == "fwrite" || ev.Wrote) && ev.T > s.Cancel.T {
				l.afterCancel++
			}
		}
		f.AfterCancel += l.afterCancel
		if i+1 < len(byFence) {
			l.next = byFence[i+1]
			l.margin = time.Duration(l.next.at()-s.Cancel.Wall) * time.Microsecond
			f.MarginMin = min(f.MarginMin, l.margin)
			if l.margin <= 0 {
				f.LateCancels++
			}
			for _, ev := range []*event{s.FWrite, s.End} {
				if ev != nil && (ev.Op == "fwrite" || ev.Wrote) && ev.TWall > l.next.at() {
					l.writesAfter++
				}
			}
			f.WritesAfter += l.writesAfter
		}
		f.losses = append(f.losses, l)
	}
	if f.MarginMin == time.Duration(1<<63-1) {
		f.MarginMin = 0
	}

	// Liveness: the longest time with no holder, and the handovers.
	type hold struct{ from, to time.Duration }
	var holds []hold
	for _, s := range secs {
		if s.Acq == nil {
			continue
		}
		to := time.Duration(1<<63 - 1)
		switch {
		case s.Cancel != nil:
			to = s.Cancel.T
		case s.Done != nil:
			to = s.Done.T
		}
		holds = append(holds, hold{s.Acq.T, to})
	}
	slices.SortFunc(holds, func(a, b hold) int { return cmp.Compare(a.from, b.from) })
	var reach time.Duration
	for i, h := range holds {
		if i > 0 && h.from > reach {
			f.MaxGap = max(f.MaxGap, h.from-reach)
		}
		reach = max(reach, h.to)
	}
	for i := 1; i < len(byFence); i++ {
		y, x := byFence[i-1], byFence[i]
		if y.Done != nil && y.Cancel == nil && !y.Done.Lost && y.Done.WorkEnd > 0 {
			f.MaxHandover = max(f.MaxHandover, time.Duration(x.at()-y.Done.WorkEnd)*time.Microsecond)
		}
	}
	return f, secs
}

// fencedRegister is the fenced resource's model: a register holding the
// greatest fence accepted, which accepts a write iff its fence is greater.
var fencedRegister = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		cur, fence, accepted := state.(int64), input.(int64), output.(bool)
		if fence > cur {
			return accepted, fence
		}
		return !accepted, cur
	},
	DescribeOperation: func(input, output any) string {
		verdict := "rejected"
		if output.(bool) {
			verdict = "accepted"
		}
		return fmt.Sprintf("write(%d) -> %s", input.(int64), verdict)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("greatest=%d", state.(int64)) },
}

var (
	artifactOnce sync.Once
	artifactPath string
)

// artifactDir is where failure artifacts go: $FENCELOCK_CHAOS_ARTIFACTS, or
// a directory created under the system's temporary directory. It outlives
// the test, so that the files can be opened afterwards.
func artifactDir() string {
	artifactOnce.Do(func() {
		artifactPath = os.Getenv("FENCELOCK_CHAOS_ARTIFACTS")
		if artifactPath == "" {
			artifactPath, _ = os.MkdirTemp("", "fencelock-chaos-")
		}
		_ = os.MkdirAll(artifactPath, 0o755)
	})
	return artifactPath
}

// The table every scenario prints a row of.
const tableHeader = "| scenario | acq/tries | thr/s | overlaps | lost upd | fenced ok/stale rej | stale acc (res/wrk) | ack lost | lin | dup fences | double grants | lost (ctx/run) | lag max | late cancels | margin min | writes after regrant | max gap | max handover | renew after release |"

const tableRule = "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

func (f figures) row(name string) string {
	return fmt.Sprintf("| %s | %d/%d | %.0f | %d | %d/%d | %d/%d | %d/%d | %d | %s | %d | %d | %d/%d | %s | %d | %s | %d | %s | %s | %d |",
		name, f.Acquired, f.Attempts, f.Throughput, f.Overlaps, f.LostUpdates, f.Writes,
		f.FencedWrites-f.StaleRejected, f.StaleRejected, f.StaleAccepted, f.StaleAckWorker, f.AckLost,
		f.Linearizable, f.DupFences, f.DoubleGrants, f.Lost, f.LostRun, ms(f.LagMax), f.LateCancels,
		ms(f.MarginMin), f.WritesAfter, ms(f.MaxGap), ms(f.MaxHandover), f.AfterRelease)
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

// describeDoubles lists the first double grants: who still believed it held
// the lock, and for how long after the other grant.
func describeDoubles(f figures) string {
	var b strings.Builder
	for i, d := range f.doubles {
		if i == 5 {
			fmt.Fprintf(&b, "  ... and %d more double grants\n", len(f.doubles)-i)
			break
		}
		y, x := d[0], d[1]
		fmt.Fprintf(&b, "  double grant: at %s worker %d (fence %d) got the lock while worker %d (fence %d) still believed it held it, for another %s",
			time.UnixMicro(x.at()).Format("15:04:05.000"), x.W, x.Fence, y.W, y.Fence, ms(time.Duration(y.beliefEnd()-x.at())*time.Microsecond))
		if y.Done != nil && y.Done.Err != "" {
			fmt.Fprintf(&b, " (its RunWithLock: %s)", strings.ReplaceAll(y.Done.Err, "\n", "; "))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// describeLosses lists each loss: which lease, how late after its deadline
// it was told, and how long before (+) or after (-) the next grant.
func describeLosses(f figures) string {
	var b strings.Builder
	for _, l := range f.losses {
		fmt.Fprintf(&b, "  lost: worker %d fence %d: cancelled %s after its deadline (%s)", l.sec.W, l.sec.Fence, ms(l.lag), l.sec.Cancel.Cause)
		if !l.renewed {
			fmt.Fprintf(&b, "; %s before the server's expiry", ms(l.expiry))
		}
		if l.next != nil {
			fmt.Fprintf(&b, "; next grant to worker %d %s after the cancellation; %d writes after that grant",
				l.next.W, ms(l.margin), l.writesAfter)
		}
		if l.afterCancel > 0 {
			fmt.Fprintf(&b, "; %d writes after the cancellation", l.afterCancel)
		}
		if d := l.sec.Done; d != nil {
			fmt.Fprintf(&b, "; renewals ok %d, failed %d", d.RenewOK, d.RenewFail)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
