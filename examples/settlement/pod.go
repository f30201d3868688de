package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/fencesql"
)

// podConfig is what the parent tells a pod.
type podConfig struct {
	Pod       string        `json:"pod"`        // the pod's name: pod-1, pod-2, pod-3
	At        string        `json:"at"`         // when its scheduler fired, in the story's clock
	Redis     string        `json:"redis"`      // address for demo.NewRedisClient
	Driver    string        `json:"driver"`     // database driver and DSN for demo.Connect
	DSN       string        `json:"dsn"`        //
	Table     string        `json:"table"`      // the settlements table of this run
	Fences    string        `json:"fences"`     // the fence guard's table of this run
	KeyPrefix string        `json:"key_prefix"` // fencelock.Options.KeyPrefix of this run
	Date      string        `json:"date"`       // the day to settle
	TTL       time.Duration `json:"ttl"`        // the lock's TTL
	Wait      time.Duration `json:"wait"`       // WithWait; 0 tries once
	// Hold makes the pod, if it gets to write, stop right before the write
	// and wait for the parent's "write" line, so the parent can freeze it
	// at that point and nowhere else.
	Hold bool `json:"hold"`
}

// pod is one process of the settlement service.
type pod struct {
	cfg    podConfig
	parent *demo.Parent[Firing] // the parent's commands, and events to it
	locker *fencelock.Locker
	db     *demo.DB
	q      queries
	guard  *fencesql.Guard
	pause  selfPause

	// beforeWrite, if not nil, is called right before settleTx, where Hold
	// freezes the story's pod. Tests stand in there for a pause of the pod
	// long enough for its lease to be taken over.
	beforeWrite func()
}

// runPod runs one scheduler firing of a pod, as a child process of the
// parent (demo.ChildMain). Outcomes of the story, including a rejected
// write, are reported to the parent as events; an error means the pod
// could not run at all.
func runPod(ctx context.Context, parent *demo.Parent[Firing], cfg podConfig) error {
	p := &pod{cfg: cfg, parent: parent}
	return p.run(ctx)
}

func (p *pod) run(ctx context.Context) error {
	rdb, err := demo.NewRedisClient(ctx, p.cfg.Redis)
	if err != nil {
		return err
	}
	defer rdb.Close()
	p.pause = newSelfPause(rdb)
	if p.db, err = demo.Connect(ctx, p.cfg.Driver, p.cfg.DSN); err != nil {
		return err
	}
	defer p.db.Close()
	p.q = newQueries(p.db, p.cfg.Table, p.cfg.Fences)
	if p.guard, err = fencesql.NewGuard(p.db.Dialect(), p.cfg.Fences); err != nil {
		return err
	}
	p.locker, err = fencelock.New(rdb, &fencelock.Options{KeyPrefix: p.cfg.KeyPrefix, TTL: p.cfg.TTL,
		Owner: fmt.Sprintf("%s (pid %d)", p.cfg.Pod, os.Getpid())})
	if err != nil {
		return err
	}
	defer p.locker.Close()

	if err := p.parent.Ready(); err != nil {
		return err
	}
	p.parent.Result(p.fire(ctx))
	return nil
}

// fire is the settlement job as the scheduler runs it: under the day's lock,
// settle the day unless it is settled already.
func (p *pod) fire(ctx context.Context) Firing {
	f := Firing{Pod: p.cfg.Pod, At: p.cfg.At}
	var opts []fencelock.Option
	if p.cfg.Wait > 0 {
		opts = append(opts, fencelock.WithWait(p.cfg.Wait))
	}
	start := time.Now()
	err := p.locker.RunWithLock(ctx, "settlement:"+p.cfg.Date, func(ctx context.Context, lease *fencelock.Lease) error {
		f.Fence = lease.Fence()
		waited := ""
		if d := time.Since(start); d > 100*time.Millisecond {
			waited = fmt.Sprintf(" after waiting %.1fs", d.Seconds())
		}
		p.parent.Emit("acquired", "acquired the lock%s, fence %d", waited, f.Fence)
		return p.settle(ctx, lease.Fence(), &f)
	}, opts...)

	switch {
	case err == nil:
	case errors.Is(err, fencelock.ErrNotObtained):
		f.Outcome = SkippedBusy
		p.parent.Say("lock busy, another pod is settling %s: skip (%v)", p.cfg.Date, err)
	case errors.Is(err, fencelock.ErrLost):
		// The lease was lost while the work ran: mutual exclusion may have
		// been broken. Here it was, and the fence kept the data right.
		f.Lost = true
		f.Stale = errors.Is(err, fencesql.ErrStale)
		f.Err = err.Error()
		p.parent.Say("RunWithLock returned ErrLost: %v", err)
	default:
		f.Outcome, f.Err = Failed, err.Error()
		p.parent.Say("settlement failed: %v", err)
	}
	return f
}

// settle settles the day with the lease's fence, unless it is done already.
func (p *pod) settle(ctx context.Context, fence int64, f *Firing) error {
	date := p.cfg.Date
	// The day's row exists before anyone settles it, pending with fence 0.
	// Whoever comes first creates it; the primary key makes that happen once.
	if _, err := p.db.ExecContext(ctx, p.q.seed, date); err != nil {
		return fmt.Errorf("seed %s: %w", date, err)
	}
	row, err := p.q.row(ctx, p.db, date)
	if err != nil {
		return err
	}
	// The lock keeps two pods from settling at once, not a late pod from
	// settling again once the lock is free. The row does that: here, so as
	// not to compute the total for nothing, and in settleTx, which decides.
	if row.Status == "done" {
		f.Outcome = SkippedDone
		p.parent.Say("%s is already settled (status done, fence %d, by %s): skip", date, row.Fence, row.SettledBy)
		return nil
	}

	total, err := computeTotal(ctx, date)
	if err != nil {
		return err
	}
	p.parent.Say("%s is %s: computed total %s", date, row.Status, dollars(total))

	writeCtx := ctx
	if p.cfg.Hold {
		// The last check a careful holder can make: is the lease still
		// ours? It is. Whatever happens between this check and the write
		// landing, no lock can stop: the pause hits right here.
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		p.parent.Emit("hold", "ready-to-write fence=%d", fence)
		p.pause.start()
		err := p.parent.WaitFor("write")
		p.pause.end()
		if err != nil {
			return err
		}
		// When the pod resumes, its watchdog sees that the lease's deadline
		// has passed and cancels ctx with ErrLost. The write was already
		// in flight when the pause hit (on the wire, in the driver's
		// buffer): cancelling ctx cannot call it back. The demo models that
		// by sending it on a context the watchdog cannot cancel. What
		// keeps the data right is the fence guard in its transaction.
		writeCtx = context.WithoutCancel(ctx)
	}

	if p.beforeWrite != nil {
		p.beforeWrite()
	}
	err = settleTx(writeCtx, p.db, p.guard, p.q, date, p.cfg.Pod, fence, total)
	var stale *fencesql.StaleError
	switch {
	case err == nil:
		f.Outcome = Settled
		p.parent.Say("write ACCEPTED with fence %d: %s done, total %s", fence, date, dollars(total))
		return nil
	case errors.Is(err, errSettled):
		f.Outcome = SkippedDone
		if row, err = p.q.row(writeCtx, p.db, date); err != nil {
			return err
		}
		p.parent.Say("%s was settled meanwhile (status %s, fence %d, by %s): nothing written",
			date, row.Status, row.Fence, row.SettledBy)
		return nil
	case !errors.As(err, &stale):
		return err
	}

	f.Outcome = Rejected
	row, err = p.q.row(writeCtx, p.db, date)
	if err != nil {
		return err
	}
	p.parent.Say("write REJECTED with fence %d: the row already has fence %d (status %s, by %s), so mine is stale",
		fence, stale.Recorded, row.Status, row.SettledBy)
	return fmt.Errorf("settlement write rejected: %w", stale)
}

// errSettled is settleTx's error when the day's row is no longer pending.
var errSettled = errors.New("already settled")

// settleTx is the fenced write: in one transaction, the guard records
// fence for the day unless a newer fence is recorded, and the day's row is
// marked done if it is still pending. A stale holder gets a
// *fencesql.StaleError, a holder that finds the day settled errSettled;
// either way its transaction rolls back whole.
func settleTx(ctx context.Context, db *demo.DB, g *fencesql.Guard, q queries, date, by string, fence, total int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("settle %s: %w", date, err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := g.Advance(ctx, tx, "settlement:"+date, fence); err != nil {
		return err
	}
	// The status settle read before the transaction may be out of date: a
	// stale holder, paused before the lock passed to this one, may have
	// settled the day since (its write landed, as no newer fence was
	// recorded yet). Advance has ordered this transaction after any other
	// holder's, so the status is checked again here, by the update itself.
	r, err := tx.ExecContext(ctx, q.settle, total, by, date)
	if err != nil {
		return fmt.Errorf("settle %s: %w", date, err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return fmt.Errorf("settle %s: %w", date, err)
	}
	if n != 1 {
		return errSettled
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("settle %s: %w", date, err)
	}
	return nil
}

// computeTotal stands in for the real work: adding up the day's payments.
func computeTotal(ctx context.Context, date string) (int64, error) {
	_ = date // a real service would query the day's payments
	if err := ctx.Err(); err != nil {
		return 0, context.Cause(ctx)
	}
	var total int64
	for _, cents := range []int64{1999, 4550, 12000, 780} {
		total += cents
	}
	return total, nil
}

// queries are the settlements table's statements, written with ? and
// rebound once for the database's placeholder style. The table has no
// fence column: the fence guard, in the same transaction, keeps the fence.
type queries struct {
	create, seed, settle, selectRow, selectAll, selectFence string
}

func newQueries(db *demo.DB, table, fences string) queries {
	return queries{
		create: `CREATE TABLE ` + table + ` (
			settle_date DATE PRIMARY KEY,   -- one row per day: settle once
			status      TEXT NOT NULL,      -- 'pending' or 'done'
			total_cents BIGINT NOT NULL,
			settled_by  TEXT NOT NULL)`,
		seed: db.Rebind(`INSERT INTO ` + table + ` (settle_date, status, total_cents, settled_by)
			VALUES (?, 'pending', 0, '') ON CONFLICT (settle_date) DO NOTHING`),
		// The write of settleTx, after the guard's Advance: it changes
		// no row once the day is done.
		settle: db.Rebind(`UPDATE ` + table + ` SET status = 'done', total_cents = ?, settled_by = ?
			WHERE settle_date = ? AND status = 'pending'`),
		selectRow: db.Rebind(`SELECT CAST(settle_date AS TEXT), status, total_cents, settled_by
			FROM ` + table + ` WHERE settle_date = ?`),
		selectAll: `SELECT CAST(settle_date AS TEXT), status, total_cents, settled_by
			FROM ` + table + ` ORDER BY settle_date`,
		// The guard's table (see fencesql's package documentation), for
		// the timeline: the fence of the last accepted write.
		selectFence: db.Rebind(`SELECT fence FROM ` + fences + ` WHERE resource = ?`),
	}
}

// row reads the day's row, with the fence the guard recorded for the day.
func (q queries) row(ctx context.Context, db *demo.DB, date string) (Row, error) {
	var r Row
	err := db.QueryRowContext(ctx, q.selectRow, date).Scan(&r.Date, &r.Status, &r.TotalCents, &r.SettledBy)
	if err != nil {
		return Row{}, fmt.Errorf("read %s: %w", date, err)
	}
	if r.Fence, err = q.fence(ctx, db, r.Date); err != nil {
		return Row{}, err
	}
	return r, nil
}

// fence reads the fence the guard recorded for the day, 0 if none.
func (q queries) fence(ctx context.Context, db *demo.DB, date string) (int64, error) {
	var f int64
	err := db.QueryRowContext(ctx, q.selectFence, "settlement:"+date).Scan(&f)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("read the fence of %s: %w", date, err)
	}
	return f, nil
}

// rows reads the whole table.
func (q queries) rows(ctx context.Context, db *demo.DB) ([]Row, error) {
	rows, err := db.QueryContext(ctx, q.selectAll)
	if err != nil {
		return nil, fmt.Errorf("read settlements: %w", err)
	}
	defer rows.Close()
	var all []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.Date, &r.Status, &r.TotalCents, &r.SettledBy); err != nil {
			return nil, fmt.Errorf("read settlements: %w", err)
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read settlements: %w", err)
	}
	_ = rows.Close()
	for i := range all {
		var err error
		if all[i].Fence, err = q.fence(ctx, db, all[i].Date); err != nil {
			return nil, err
		}
	}
	return all, nil
}
