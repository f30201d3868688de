// Command settlement shows fencelock doing its job, and shows the failure a
// lock alone cannot prevent being caught by a fencing token.
//
// A settlement service runs as three pods whose schedulers all fire at 00:05
// to settle the same day. The story, with three real OS processes:
//
//  1. All three call RunWithLock("settlement:<date>") at once. One acquires
//     the lock; the other two get ErrNotObtained and skip.
//  2. The winner computes the total and is about to write it when it is
//     frozen (SIGSTOP, standing in for a long GC pause or a suspended VM) for
//     longer than the lock's TTL. Its watchdog is frozen with it, so the lock
//     expires.
//  3. A catch-up run on another pod finds the day not settled, takes the
//     lock with a larger fencing token and writes the settlement.
//  4. The frozen pod resumes (SIGCONT) and its write, already in flight,
//     reaches the database. The database rejects it: its fencing token is
//     older than the one the fence guard (package fencesql) recorded for
//     the day, so its transaction rolls back. RunWithLock reports ErrLost.
//  5. A pod whose scheduler fires late acquires the free lock, but the row
//     says the day is done, so it does not settle it a second time.
//
// The write's transaction starts with the guard, then settles the day only
// if its row is still pending (UPDATE ... AND status = 'pending'): a pod that
// found the day pending before a stale pod's write landed, which the guard
// lets through when no newer fence was recorded yet, does not settle it
// again.
//
// Run it with nothing but Go installed:
//
//	go run ./examples/settlement
//
// It starts an embedded miniredis on a loopback port and an SQLite file in a
// temporary directory. REDIS_ADDR (host:port or redis:// URL) switches to a
// real Redis, DATABASE_URL (postgres:// URL) to PostgreSQL. The run uses its
// own table and lock key prefix and removes them at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

func main() {
	os.Exit(command.Main())
}

// command is the settlement command, and its pods (runPod). Ctrl-C or
// SIGTERM cancels run's context; run then kills and reaps its pods and
// removes its table and keys before returning.
var command = demo.Command{
	Name: "settlement",
	Run: func(ctx context.Context) error {
		_, err := run(ctx, Config{
			RedisAddr:   os.Getenv("REDIS_ADDR"),
			DatabaseURL: os.Getenv("DATABASE_URL"),
		})
		return err
	},
	Child: demo.ChildMain(runPod),
}

// Config configures one run of the story.
type Config struct {
	RedisAddr   string        // REDIS_ADDR; empty starts an embedded miniredis
	DatabaseURL string        // DATABASE_URL; empty uses an embedded SQLite file
	TTL         time.Duration // the lock's TTL; default 1s, short to keep the story fast
	Out         io.Writer     // the timeline; default os.Stdout
	Stderr      io.Writer     // the pods' standard error; default os.Stderr
}

// Outcome is what one scheduler firing ended with.
type Outcome string

// The outcomes of a firing.
const (
	SkippedBusy Outcome = "skipped: lock busy"          // RunWithLock returned ErrNotObtained
	Settled     Outcome = "settled"                     // its write was accepted
	Rejected    Outcome = "write rejected: stale fence" // its write reached the database and was refused
	SkippedDone Outcome = "skipped: already settled"    // it held the lock and found the day done
	Failed      Outcome = "failed"                      // anything else; see Err
)

// Firing is one run of a pod's settlement job.
type Firing struct {
	Pod     string  `json:"pod"`
	At      string  `json:"at"`    // when the scheduler fired, in the story's clock ("00:05")
	Fence   int64   `json:"fence"` // the fencing token it held; 0 if it did not get the lock
	Outcome Outcome `json:"outcome"`
	Lost    bool    `json:"lost"`  // RunWithLock's error matched fencelock.ErrLost
	Stale   bool    `json:"stale"` // RunWithLock's error matched fencesql.ErrStale: its write was refused
	Err     string  `json:"err,omitempty"`
}

// Row is one row of the settlements table.
type Row struct {
	Date       string
	Status     string
	TotalCents int64
	Fence      int64
	SettledBy  string
}

// Result is what a run of the story did.
type Result struct {
	Date    string
	Table   string   // the run's table, dropped at the end of the run
	Fences  string   // the run's fence guard table (and Fences+"_keys"), dropped at the end of the run
	Keys    []string // the run's Redis keys, deleted at the end of the run
	Paused  string   // the pod that was frozen while holding the lock
	Firings []Firing // the three 00:05 firings in pod order, then the 00:06 and 00:07 ones
	Rows    []Row    // the settlements table at the end
}

// run tells the story: it starts the servers (or connects to the real ones),
// creates the table, runs the pods as child processes of this executable,
// and returns what happened. Every pod it started has been killed if need be
// and waited for when it returns, on every path.
func run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.TTL == 0 {
		cfg.TTL = time.Second
	}
	// A bound on the whole story, so a pod that misbehaves cannot hang it.
	// It starts five pod processes, in three steps: on a busy machine each
	// step took 10s (30s in all, the bound once).
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute+10*cfg.TTL)
	defer cancel()

	st, err := demo.Start(ctx, cfg.Out, demo.Servers{RedisAddr: cfg.RedisAddr, DatabaseURL: cfg.DatabaseURL})
	if err != nil {
		return res, err
	}
	defer st.Close(&err)
	tl, db := st.Timeline, st.DB

	table := "settlements_" + st.ID
	res.Table, res.Fences = table, "fences_"+st.ID
	st.DropAtEnd(table, res.Fences, res.Fences+"_keys")
	q := newQueries(db, table, res.Fences)
	if _, err := db.ExecContext(ctx, q.create); err != nil {
		return res, fmt.Errorf("create table %s: %w", table, err)
	}
	if _, err := db.NewGuard(ctx, res.Fences); err != nil {
		return res, err
	}

	// The day before today is settled. Its lock is per day.
	res.Date = time.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	lockName := "settlement:" + res.Date
	res.Keys = st.LockKeys(lockName)

	tl.Printf("parent", "redis: %s", st.Redis.Desc)
	tl.Printf("parent", "database: %s, table %s, fence guard %s", db.Desc, table, res.Fences)
	tl.Printf("parent", "settling %s under lock %q, TTL %v (renewed every %v while held)",
		res.Date, lockName, cfg.TTL, (cfg.TTL / 3).Round(time.Millisecond))

	s := &story{
		tl:    tl,
		procs: demo.NewProcs[Firing](tl, cfg.Stderr),
		base: podConfig{
			Redis: st.Redis.Addr, Driver: db.Driver, DSN: db.DSN, Table: table, Fences: res.Fences,
			KeyPrefix: st.KeyPrefix, Date: res.Date, TTL: cfg.TTL,
		},
	}
	defer s.procs.StopAll()

	if err := s.tell(ctx, &res); err != nil {
		return res, err
	}

	res.Rows, err = q.rows(ctx, db)
	if err != nil {
		return res, err
	}
	for _, r := range res.Rows {
		tl.Printf("parent", "table %s, row %s: status %s, total %s, fence %d, written by %s",
			table, r.Date, r.Status, dollars(r.TotalCents), r.Fence, r.SettledBy)
	}
	for _, f := range res.Firings {
		if f.Outcome == Rejected {
			tl.Printf("parent", "settled once: the lock could not stop %s's stale write, its fence %d did",
				f.Pod, f.Fence)
		}
	}
	return res, nil
}

// story is the parent's side of a run: the pods it started, which run
// kills and waits for when it returns.
type story struct {
	tl    *demo.Timeline
	procs *demo.Procs[Firing]
	base  podConfig // what every pod is told; start adds the pod's own part
}

// start starts a pod process running this executable in the pod role
// (runPod), with the story's configuration changed by edit (if not nil). The
// pod connects to Redis and the database, reports "ready" and waits for
// "go".
func (s *story) start(name, at string, edit func(*podConfig)) (*demo.Proc[Firing], error) {
	cfg := s.base
	cfg.Pod, cfg.At = name, at
	if edit != nil {
		edit(&cfg)
	}
	return s.procs.Start(name, cfg)
}

// tell runs the pods through the story and records their firings in res.
func (s *story) tell(ctx context.Context, res *Result) error {
	ttl := s.base.TTL

	// 00:05: the three schedulers fire together. The winner, if any, stops
	// right before its write and waits for the parent (Hold), so that the
	// parent can freeze it at exactly that point.
	names := []string{"pod-1", "pod-2", "pod-3"}
	tl := s.tl
	tl.Printf("parent", "00:05 the schedulers of %s fire together", strings.Join(names, ", "))
	var first []*demo.Proc[Firing]
	for _, name := range names {
		p, err := s.start(name, "00:05", func(c *podConfig) { c.Hold = true })
		if err != nil {
			return err
		}
		first = append(first, p)
	}
	if err := s.procs.FireTogether(ctx, first...); err != nil {
		return err
	}
	// Each pod either acquires the lock or ends its run (busy).
	res.Firings = make([]Firing, len(first))
	winnerAt := -1
	var losers []*demo.Proc[Firing]
	for i, p := range first {
		ev, err := p.Await(ctx, "acquired", "result")
		if err != nil {
			return err
		}
		if ev.Kind == "acquired" {
			if winnerAt >= 0 {
				return fmt.Errorf("both %s and %s acquired the lock", first[winnerAt].Name, p.Name)
			}
			winnerAt = i
			continue
		}
		if res.Firings[i], err = p.Finish(ctx, ev); err != nil {
			return err
		}
		losers = append(losers, p)
	}
	if winnerAt < 0 || len(losers) != 2 {
		return errors.New("expected exactly one pod to acquire the lock at 00:05")
	}
	winner := first[winnerAt]
	res.Paused = winner.Name

	// The winner is about to write. Freeze it there.
	if _, err := winner.Await(ctx, "hold"); err != nil {
		return err
	}
	if err := pausePod(winner.Process()); err != nil {
		return fmt.Errorf("pause %s: %w", winner.Name, err)
	}
	paused := time.Now()
	tl.Printf("parent", "%s %s (pid %d) right before its write: its watchdog cannot renew the lock, which expires within %v",
		pauseMethod, winner.Name, winner.Process().Pid, ttl)

	// 00:06: a catch-up run finds the day not settled and waits for the
	// lock, which it gets once the frozen pod's lock has expired.
	catchUp := losers[0]
	tl.Printf("parent", "00:06 %s's catch-up run: %s is not settled yet, so it waits for the lock (WithWait %v)",
		catchUp.Name, res.Date, 5*ttl)
	p, err := s.start(catchUp.Name, "00:06", func(c *podConfig) { c.Wait = 5 * ttl })
	if err != nil {
		return err
	}
	if err := s.procs.FireTogether(ctx, p); err != nil {
		return err
	}
	catchUpFiring, err := p.Result(ctx)
	if err != nil {
		return err
	}

	// Resume the frozen pod, then let it go on with its write. The go-ahead
	// is sent only now because SIGSTOP takes effect asynchronously: kill
	// returns before every thread of the pod has stopped, and a go-ahead
	// sent right after it was seen (on a busy machine) to be read and the
	// write sent to the database before the pod stopped.
	if err := resumePod(winner.Process()); err != nil {
		return fmt.Errorf("resume %s: %w", winner.Name, err)
	}
	tl.Printf("parent", "%s %s after %.2fs: its lock expired while it was frozen; it carries on with its write",
		resumeMethod, winner.Name, time.Since(paused).Seconds())
	if err := winner.Send("write"); err != nil {
		return err
	}
	if res.Firings[winnerAt], err = winner.Result(ctx); err != nil {
		return err
	}
	res.Firings = append(res.Firings, catchUpFiring)

	// 00:07: the last pod's scheduler fires late. The lock is free; only the
	// row keeps it from settling the day again.
	late := losers[1]
	tl.Printf("parent", "00:07 %s's scheduler fires late", late.Name)
	p, err = s.start(late.Name, "00:07", nil)
	if err != nil {
		return err
	}
	if err := s.procs.FireTogether(ctx, p); err != nil {
		return err
	}
	lateFiring, err := p.Result(ctx)
	if err != nil {
		return err
	}
	res.Firings = append(res.Firings, lateFiring)
	return nil
}

// dollars formats cents as dollars.
func dollars(cents int64) string {
	return fmt.Sprintf("$%d.%02d", cents/100, cents%100)
}
