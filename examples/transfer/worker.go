package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/fencesql"
)

// workerConfig is what the parent tells a worker.
type workerConfig struct {
	Worker    string        `json:"worker"`
	Transfers []Transfer    `json:"transfers"`  // run at once, each on a goroutine of its own
	Redis     string        `json:"redis"`      // address for demo.NewRedisClient
	Driver    string        `json:"driver"`     // database driver and DSN for demo.Connect
	DSN       string        `json:"dsn"`        //
	Accounts  string        `json:"accounts"`   // the run's tables
	Ledger    string        `json:"ledger"`     //
	Fences    string        `json:"fences"`     // the fence guard's table of this run
	KeyPrefix string        `json:"key_prefix"` // fencelock.Options.KeyPrefix of this run
	TTL       time.Duration `json:"ttl"`        // the locks' TTL
}

// runWorker runs a worker's transfers, as a child process of the parent
// (demo.ChildMain), and reports their outcomes to it.
func runWorker(ctx context.Context, parent *demo.Parent[Outcome], cfg workerConfig) error {
	w := &worker{cfg: cfg, parent: parent}
	return w.run(ctx)
}

// worker is one process of the payments service.
type worker struct {
	cfg    workerConfig
	parent *demo.Parent[Outcome] // the parent's go-ahead, and events to it
	locker *fencelock.Locker
	db     *demo.DB
	q      queries
	guard  *fencesql.Guard

	// beforeTx, if not nil, is called right before a transfer's
	// transaction begins. Tests stand in there for a pause of the worker
	// long enough for its leases to be taken over.
	beforeTx func()
}

func (w *worker) run(ctx context.Context) error {
	rdb, err := demo.NewRedisClient(ctx, w.cfg.Redis)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if w.db, err = demo.Connect(ctx, w.cfg.Driver, w.cfg.DSN); err != nil {
		return err
	}
	defer w.db.Close()
	w.q = newQueries(w.db, w.cfg.Accounts, w.cfg.Ledger)
	if w.guard, err = fencesql.NewGuard(w.db.Dialect(), w.cfg.Fences); err != nil {
		return err
	}
	w.locker, err = fencelock.New(rdb, &fencelock.Options{KeyPrefix: w.cfg.KeyPrefix, TTL: w.cfg.TTL,
		Owner: fmt.Sprintf("%s (pid %d)", w.cfg.Worker, os.Getpid())})
	if err != nil {
		return err
	}
	defer w.locker.Close()

	if err := w.parent.Ready(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, t := range w.cfg.Transfers {
		wg.Go(func() {
			w.parent.Result(w.transfer(ctx, t))
		})
	}
	wg.Wait()
	return nil
}

// transfer moves t's amount under the locks of both accounts, in a
// transaction fenced with both leases' fences (move).
func (w *worker) transfer(ctx context.Context, t Transfer) Outcome {
	o := Outcome{Transfer: t, Worker: w.cfg.Worker}
	start := time.Now()
	names := []string{"account:" + t.From, "account:" + t.To}
	err := w.locker.RunWithLocks(ctx, names, func(ctx context.Context, leases []*fencelock.Lease) error {
		o.FromFence, o.ToFence = leases[0].Fence(), leases[1].Fence()
		w.parent.Say("%s: locked %s (fence %d) and %s (fence %d) after %v", t.ID, t.From, o.FromFence, t.To, o.ToFence,
			time.Since(start).Round(time.Millisecond))
		return w.move(ctx, &o)
	}, fencelock.WithWait(20*time.Second))
	var stale *fencesql.StaleError
	switch {
	case errors.As(err, &stale):
		o.Outcome, o.Err = Rejected, err.Error()
		w.parent.Say("%s: refused, %s has fence %d recorded, newer than mine (%d): nothing moved",
			t.ID, stale.Resource, stale.Recorded, stale.Fence)
	case err != nil:
		o.Outcome, o.Err = Failed, err.Error()
		w.parent.Say("%s: failed: %v", t.ID, err)
	}
	return o
}

// move moves o's amount from o.From to o.To in one transaction fenced with
// o.FromFence and o.ToFence, and sets o.Outcome unless it fails. A holder
// whose lease on either account was taken over by one that wrote first gets
// a *fencesql.StaleError, and nothing of the transfer lands.
func (w *worker) move(ctx context.Context, o *Outcome) error {
	t := o.Transfer
	if w.beforeTx != nil {
		w.beforeTx()
	}
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op

	// The fences first, before anything is read. A newer holder of either
	// lock that wrote first refuses this one here (ErrStale); one still
	// writing makes this transaction wait for its end, so the balances
	// read next are the last ones committed, not ones a stale holder is
	// about to overwrite. Every transfer takes its accounts in the same
	// order, so two never wait for each other.
	fences := map[string]int64{t.From: o.FromFence, t.To: o.ToFence}
	for _, id := range slices.Sorted(maps.Keys(fences)) {
		if err := w.guard.Advance(ctx, tx, "account:"+id, fences[id]); err != nil {
			return err
		}
	}
	fromBalance, err := w.q.balance(ctx, tx, t.From)
	if err != nil {
		return err
	}
	toBalance, err := w.q.balance(ctx, tx, t.To)
	if err != nil {
		return err
	}
	// What a real transfer checks here (limits, fraud rules) takes a
	// while: the window in which, without the locks, another transfer
	// would read the same balances and one of the two writes be lost.
	time.Sleep(20 * time.Millisecond)
	if fromBalance < t.Amount {
		o.Outcome = Insufficient
		w.parent.Say("%s: %s has %s, not %s: nothing moved", t.ID, t.From, dollars(fromBalance), dollars(t.Amount))
		return nil
	}

	for _, u := range []struct {
		id      string
		balance int64
	}{{t.From, fromBalance - t.Amount}, {t.To, toBalance + t.Amount}} {
		r, err := tx.ExecContext(ctx, w.q.write, u.balance, fences[u.id], u.id)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("write %s: %d rows written (%v)", u.id, n, err)
		}
	}
	if _, err := tx.ExecContext(ctx, w.q.record, t.ID, w.cfg.Worker, t.From, t.To, t.Amount, o.FromFence, o.ToFence); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	o.Outcome = Moved
	w.parent.Say("%s: moved %s from %s (now %s) to %s (now %s)", t.ID, dollars(t.Amount),
		t.From, dollars(fromBalance-t.Amount), t.To, dollars(toBalance+t.Amount))
	return nil
}
