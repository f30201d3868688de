package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/examples/internal/demotest"
	"github.com/fencelock/fencelock/fencesql"
)

func TestMain(m *testing.M) {
	demotest.Main(m, command)
}

// TestStory runs the story against each combination of embedded and real
// servers and checks what happened: every transfer moved its money once.
func TestStory(t *testing.T) {
	setups := []demotest.Setup{demotest.Embedded, demotest.WithRedis, demotest.WithPostgres}
	demotest.Run(t, setups, func(t *testing.T, redisAddr, databaseURL string) {
		cfg := Config{RedisAddr: redisAddr, DatabaseURL: databaseURL, Out: demotest.Output(t)}
		cfg.Stderr = cfg.Out
		res, err := run(t.Context(), cfg)
		require.NoError(t, err)
		checkStory(t, res)
		demotest.KeysGone(t, redisAddr, res.Keys)
		demotest.TablesGone(t, databaseURL, res.Tables...)
	})
}

// checkStory checks the outcomes, the ledger and the balances.
func checkStory(t *testing.T, res Result) {
	t.Helper()
	require.Len(t, res.Outcomes, 8)
	for _, o := range res.Outcomes {
		assert.Equal(t, Moved, o.Outcome, "%s: %s", o.ID, o.Err)
		assert.Positive(t, o.FromFence, o.ID)
		assert.Positive(t, o.ToFence, o.ID)
	}
	require.Len(t, res.Ledger, 8, "every transfer in the ledger, once")
	// Every transfer can pay whatever the order, so the end is known.
	want := []Account{{ID: "alice", Balance: 100_00}, {ID: "bob", Balance: 85_00}, {ID: "carol", Balance: 135_00}, {ID: "dave", Balance: 80_00}}
	require.Len(t, res.Accounts, len(want))
	last := map[string]int64{}
	for _, e := range res.Ledger {
		last[e.From] = max(last[e.From], e.FromFence)
		last[e.To] = max(last[e.To], e.ToFence)
	}
	for i, a := range res.Accounts {
		assert.Equal(t, want[i].ID, a.ID)
		assert.Equal(t, dollars(want[i].Balance), dollars(a.Balance), a.ID)
		assert.Equal(t, last[a.ID], a.Fence, "%s's row carries the fence of its last transfer", a.ID)
	}
	require.NoError(t, check(res))
}

// check must catch a lost transfer.
func TestCheck(t *testing.T) {
	res := Result{
		Accounts: []Account{{ID: "alice", Balance: 75_00}, {ID: "bob", Balance: 100_00}, {ID: "carol", Balance: 100_00}, {ID: "dave", Balance: 100_00}},
		Ledger:   []Outcome{{Transfer: Transfer{ID: "t1", From: "alice", To: "bob", Amount: 25_00}}},
	}
	require.ErrorContains(t, check(res), "bob has $100.00, the ledger says $125.00")
	res.Accounts[1].Balance = 125_00
	require.NoError(t, check(res))
}

// TestCommand runs the command as `go run ./examples/transfer` does, on the
// embedded servers, and checks what it prints.
func TestCommand(t *testing.T) {
	out := demotest.RunCommand(t)
	assert.Equal(t, 8, strings.Count(out, ": moved $"))
	assert.Regexp(t, `worker-\d +t\d: locked \w+ \(fence \d+\) and \w+ \(fence \d+\)`, out)
	assert.Contains(t, out, "the balances add up to $400.00, as they opened with $400.00")
	assert.Contains(t, out, "no money lost or made")
}

// TestStaleHolder runs two transfers from alice in the test process, with
// the fences of two holders of her lock: a worker paused right before its
// transaction (beforeTx) for longer than the TTL, whose leases have fence 1,
// and the worker that took her lock over meanwhile, whose leases have
// fence 2. Their transactions run in both orders. Either way no money is
// lost or made; when the newer holder writes first, the stale one's
// transfer is refused with fencesql.ErrStale and writes nothing.
func TestStaleHolder(t *testing.T) {
	stale := Transfer{ID: "t1", From: "alice", To: "bob", Amount: 25_00}
	newer := Transfer{ID: "t2", From: "alice", To: "carol", Amount: 30_00}
	demotest.Run(t, []demotest.Setup{demotest.Embedded, demotest.WithPostgres}, func(t *testing.T, _, databaseURL string) {
		t.Run("stale writes first", func(t *testing.T) {
			st := newStaleSetup(t, databaseURL)
			staleDone := st.pausedMove(t, st.stale, stale, 1)
			newerDone := st.pausedMove(t, st.newer, newer, 2)
			// The newer holder has read whatever it reads before its
			// transaction. The stale holder's transaction runs first:
			// the database knows of no newer fence yet, so it lands.
			close(st.release[st.stale])
			s := <-staleDone
			require.NoError(t, s.err)
			assert.Equal(t, Moved, s.o.Outcome)
			close(st.release[st.newer])
			n := <-newerDone
			require.NoError(t, n.err)
			assert.Equal(t, Moved, n.o.Outcome)
			st.checkMoney(t, 2)
		})
		t.Run("newer writes first", func(t *testing.T) {
			st := newStaleSetup(t, databaseURL)
			staleDone := st.pausedMove(t, st.stale, stale, 1)
			close(st.release[st.newer])
			n := <-st.move(t, st.newer, newer, 2)
			require.NoError(t, n.err)
			assert.Equal(t, Moved, n.o.Outcome)
			close(st.release[st.stale])
			s := <-staleDone
			var refused *fencesql.StaleError
			require.ErrorAs(t, s.err, &refused, "the stale holder's transfer")
			assert.Equal(t, fencesql.StaleError{Resource: "account:alice", Fence: 1, Recorded: 2}, *refused)
			st.checkMoney(t, 1)
		})
	})
}

// staleSetup is a run's tables and the two workers of TestStaleHolder.
type staleSetup struct {
	db           *demo.DB
	q            queries
	stale, newer *worker
	reached      map[*worker]chan struct{} // closed by the worker's beforeTx
	release      map[*worker]chan struct{} // closed by the test to let it go on
}

func newStaleSetup(t *testing.T, databaseURL string) *staleSetup {
	t.Helper()
	ctx := t.Context()
	db, err := demo.OpenDB(ctx, databaseURL)
	require.NoError(t, err)
	id := demo.RunID()
	st := &staleSetup{db: db, q: newQueries(db, "accounts_"+id, "ledger_"+id),
		reached: map[*worker]chan struct{}{}, release: map[*worker]chan struct{}{}}
	fences := "fences_" + id
	t.Cleanup(func() {
		assert.NoError(t, db.DropTables(ctx, st.q.accounts, st.q.ledger, fences, fences+"_keys"))
		assert.NoError(t, db.Close())
	})
	guard, err := db.NewGuard(ctx, fences)
	require.NoError(t, err)
	for _, stmt := range st.q.create {
		_, err := db.ExecContext(ctx, stmt)
		require.NoError(t, err)
	}
	for _, a := range accounts {
		_, err := db.ExecContext(ctx, st.q.open, a, opening)
		require.NoError(t, err)
	}
	out := demotest.Output(t)
	newWorker := func(name string) *worker {
		w := &worker{cfg: workerConfig{Worker: name}, parent: demo.NewParent[Outcome](name, strings.NewReader(""), out),
			db: db, q: st.q, guard: guard}
		reached, release := make(chan struct{}), make(chan struct{})
		st.reached[w], st.release[w] = reached, release
		w.beforeTx = func() {
			close(reached)
			<-release
		}
		return w
	}
	st.stale, st.newer = newWorker("stale"), newWorker("newer")
	return st
}

// moved is what a worker's move returned.
type moved struct {
	o   Outcome
	err error
}

// move runs w's move of tr, with fence for both accounts, on a goroutine of
// its own, and returns where it sends what move returned.
func (st *staleSetup) move(t *testing.T, w *worker, tr Transfer, fence int64) <-chan moved {
	ctx := t.Context()
	done := make(chan moved, 1)
	go func() {
		o := Outcome{Transfer: tr, Worker: w.cfg.Worker, FromFence: fence, ToFence: fence}
		err := w.move(ctx, &o)
		done <- moved{o, err}
	}()
	return done
}

// pausedMove starts w's move of tr, as move does, and returns once it has
// reached beforeTx, where it waits for st.release[w].
func (st *staleSetup) pausedMove(t *testing.T, w *worker, tr Transfer, fence int64) <-chan moved {
	t.Helper()
	done := st.move(t, w, tr, fence)
	select {
	case <-st.reached[w]:
		return done
	case m := <-done:
		require.FailNow(t, "the transfer ended before its transaction", "%s: %+v, %v", tr.ID, m.o, m.err)
		return nil
	}
}

// checkMoney checks that the ledger has transfers rows and that the balances
// are what it says, adding up to what the accounts opened with.
func (st *staleSetup) checkMoney(t *testing.T, transfers int) {
	t.Helper()
	var res Result
	var err error
	res.Accounts, err = st.q.balances(t.Context(), st.db)
	require.NoError(t, err)
	res.Ledger, err = st.q.entries(t.Context(), st.db)
	require.NoError(t, err)
	assert.Len(t, res.Ledger, transfers)
	var total int64
	for _, a := range res.Accounts {
		total += a.Balance
	}
	assert.Equal(t, dollars(opening*int64(len(accounts))), dollars(total), "the balances add up to what they opened with")
	assert.NoError(t, check(res), "accounts %+v", res.Accounts)
}

// waitForLockWaiter waits until a PostgreSQL backend waits for a lock while
// running a statement containing substr.
func waitForLockWaiter(t *testing.T, st *staleSetup, substr string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := st.db.QueryRowContext(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND position($1 in query) > 0`, substr).Scan(&n)
		require.NoError(t, err)
		return n > 0
	}, 10*time.Second, 5*time.Millisecond, "a backend waiting on a lock in %q", substr)
}

// TestStaleHolderConcurrent (PostgreSQL): the newer holder's transaction
// starts while the stale holder's is still open, after its Advance and
// before its commit (held there by a table lock on the ledger). The newer
// one waits at its Advance and reads the balances after the stale one
// committed: no money is lost. A transfer that read them before its fences
// fails it. This is the interleaving the fences-first order exists for;
// TestStaleHolder runs the two transactions one after the other.
func TestStaleHolderConcurrent(t *testing.T) {
	url := demotest.RealPostgres(t)
	stale := Transfer{ID: "t1", From: "alice", To: "bob", Amount: 25_00}
	newer := Transfer{ID: "t2", From: "alice", To: "carol", Amount: 30_00}
	st := newStaleSetup(t, url)
	staleDone := st.pausedMove(t, st.stale, stale, 1)
	newerDone := st.pausedMove(t, st.newer, newer, 2)

	// Hold the stale holder's transaction open at its ledger insert.
	blocker, err := st.db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback() }()
	_, err = blocker.ExecContext(t.Context(), "LOCK TABLE "+st.q.ledger+" IN EXCLUSIVE MODE")
	require.NoError(t, err)

	close(st.release[st.stale])
	waitForLockWaiter(t, st, "INSERT INTO "+st.q.ledger)
	close(st.release[st.newer])
	waitForLockWaiter(t, st, "(resource, fence)") // the newer one waits at its Advance
	require.NoError(t, blocker.Commit())

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, ch := range []<-chan moved{staleDone, newerDone} {
		select {
		case m := <-ch:
			require.NoError(t, m.err)
			require.Equal(t, Moved, m.o.Outcome)
		case <-ctx.Done():
			t.Fatal("a transfer did not end")
		}
	}
	st.checkMoney(t, 2)
}
