package main

import "fmt"

// The diagrams, from GUARANTEES.md's "What each scenario showed" and the
// S4 paragraphs of its later runs.

var diagrams = []diagram{s1(), s3(), s4()}

// s1: the holder SIGSTOPped for 3×TTL (TTL 300 ms) after checking its
// context; the others are granted the lock 8 times during the pause.
func s1() diagram {
	const ttl, pauseAt, expiry = 300.0, 60.0, 360.0
	resume := pauseAt + 3*ttl
	var grants []span
	var writes []mark
	who := []string{"B", "C"}
	n := 0
	for t, w := expiry+2, (resume-expiry)/8; t+w < 1290; t += w {
		n++
		label := fmt.Sprintf("%s f+%d", who[n%2], n)
		if n > 8 {
			label = fmt.Sprintf("f+%d", n) // two digits: no room for the worker
		}
		grants = append(grants, span{t, t + w - 3, label, []string{"b", "c"}[n%2]})
		if n == 1 {
			writes = append(writes, mark{at: t + w - 12, kind: "ok", label: "B's and C's writes, f+1 … f+8, accepted"})
		} else if n <= 8 || t > resume+20 {
			writes = append(writes, mark{at: t + w - 12, kind: "ok"})
		}
	}
	writes = append(writes, mark{at: resume + 18, kind: "refused", label: "A's write with f: refused (f < f+8)"})
	return diagram{
		name:  "s1-sigstop",
		title: "S1: the holder paused past its TTL, its fenced write refused",
		caption: []string{
			"One of three rounds, TTL 300 ms. Worker A holds the lock with fence f, checks its context, and is SIGSTOPped for 3×TTL.",
			"Its key expires; B and C are granted the lock 8 times during the pause, each with a greater fence. On SIGCONT A writes anyway:",
			"the fenced register refuses it, the unfenced counter loses 8 increments, and A's context ends with ErrLost.",
		},
		from: 0, to: 1300, step: 100, unit: "ms",
		bands: []band{{expiry, resume, "8 grants while A is paused"}},
		lanes: []lane{
			{label: "worker A", spans: []span{
				{0, pauseAt, "f", "a"},
				{pauseAt, resume, "SIGSTOP: paused 900 ms = 3×TTL", "paused"},
			}, marks: []mark{
				{at: resume, label: "SIGCONT: writes, then ErrLost"},
			}},
			{label: "lock in Redis", spans: append([]span{{0, expiry, "A's key, fence f", "a"}}, grants...)},
			{label: "fenced register", marks: writes},
			{label: "unfenced counter", marks: []mark{
				{at: resume + 18, label: "A writes the value it read before the pause, +1: 8 increments lost", left: true},
			}},
		},
	}
}

// s3: a failover that loses the lock. The regrant and the time A still
// believed it held the lock are measured; when A took it is drawn by eye.
func s3() diagram {
	const regrant, lost = 37.0, 37.0 + 64.0
	return diagram{
		name:  "s3-failover",
		title: "S3: a failover regrants the lock while its holder still believes it holds it",
		caption: []string{
			"One of three rounds, TTL 300 ms. The replica's link is cut, A takes the lock on the master, the master is killed and the replica",
			"promoted at t = 0. The promoted replica grants B 35.7–38.5 ms later; A believes it holds for 62.6–65.1 ms more, until a renewal",
			"finds the lock not its own. B's fence is still greater: the replica lost the counter, but fences are floored by its TIME.",
			"Times before t = 0 are drawn by eye. With Options.Replicas: 1 (S3r) no failover regranted the lock.",
		},
		from: -150, to: 200, step: 50, unit: "ms",
		bands: []band{{regrant, lost, "double grant: 62.6–65.1 ms"}},
		lanes: []lane{
			{label: "master", spans: []span{{-150, 0, "master", "master"}}, marks: []mark{
				{at: -100, label: "A's lock written: fence f"},
				{at: 0, kind: "refused", label: "killed"},
			}},
			{label: "replica", spans: []span{
				{-150, 0, "link cut: never gets A's lock", "none"},
				{0, 200, "promoted, clients moved to it", "master"},
			}, marks: []mark{
				{at: regrant, label: "grants B: fence g > f (floored by TIME)"},
			}},
			{label: "worker A", spans: []span{
				{-100, regrant, "holds, fence f", "a"},
				{regrant, lost, "believes it holds", "bad"},
			}, marks: []mark{
				{at: lost, kind: "refused", label: "renewal: not its own, ErrLost"},
			}},
			{label: "worker B", spans: []span{{regrant, 200, "holds, fence g", "b"}}},
		},
	}
}

// s4: Sentinel, the round whose master is SIGSTOPped for 3 s, as in the runs
// that had a split brain (404f051, 206b5c0).
func s4() diagram {
	const promoted, resumed, demoted = 2.3, 3.0, 13.2
	var writes []mark
	for t := 3.4; t < 14.9; t += 0.7 {
		m := mark{at: t, kind: "ok"}
		if len(writes) == 0 {
			m.label = "writes accepted in fence order: 0 stale writes accepted"
		}
		writes = append(writes, m)
	}
	return diagram{
		name:  "s4-sentinel",
		title: "S4: Sentinel fails over from a paused master, which comes back a second master",
		caption: []string{
			"Sentinel: 1 master, 2 replicas, 3 sentinels, quorum 2, down-after-milliseconds 1000. At t = 0 the master is SIGSTOPped for 3 s.",
			"Sentinel promotes a replica after 2.2–2.4 s. The old master resumes at 3 s and stays a master for 10.2 s until Sentinel demotes it.",
			"In some runs clients used it (78 double grants at 404f051, 82 at 206b5c0): both masters granted the lock, unfenced sections",
			"overlapped, and the fence kept the fenced register right (fences are floored by server TIME).",
		},
		from: 0, to: 15, step: 1, unit: "s",
		bands: []band{{resumed, demoted, "two masters: a split brain in some runs"}},
		lanes: []lane{
			{label: "old master", spans: []span{
				{0, resumed, "SIGSTOP 3 s", "paused"},
				{resumed, demoted, "resumed: still a master, 10.2 s", "bad"},
				{demoted, 15, "replica", "master"},
			}},
			{label: "sentinels", spans: []span{{1, promoted, "failover", "master"}}, marks: []mark{
				{at: 1, label: "down after 1 s", left: true},
				{at: demoted, label: "demote the old master", left: true},
			}},
			{label: "new master", spans: []span{
				{0, promoted, "replica", "none"},
				{promoted, 15, "promoted: master", "master"},
			}},
			{label: "workers", spans: []span{
				{0, resumed, "no holder (≤ 3.0 s)", "none"},
				{resumed, demoted, "in some runs split between the two masters: both grant", "bad"},
				{demoted, 15, "one master", "b"},
			}},
			{label: "fenced register", marks: writes},
		},
	}
}
