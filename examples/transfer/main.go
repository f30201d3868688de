// Command transfer shows fencelock's AcquireAll keeping concurrent money
// transfers from losing money: each transfer locks both of its accounts
// together, and fences its transaction with both leases' fences.
//
// Four accounts hold $100.00 each. Three processes of a payments service
// start eight transfers at the same moment (3, 3 and 2 of them), between
// overlapping pairs of accounts, in both directions (alice to bob, and bob
// to alice). Each transfer reads the two balances, checks the funds, and
// writes both new balances: a read-modify-write that, run concurrently
// without a lock, loses money (two transfers read the same balance, and the
// second write wipes out the first). Each runs it under
//
//	locker.RunWithLocks(ctx, []string{"account:" + from, "account:" + to}, work, fencelock.WithWait(d))
//
// which takes both locks in one script, all or none: a transfer never holds
// one account while it waits for the other, so two transfers in opposite
// directions cannot wait for each other for ever.
//
// The locks save work; they cannot keep a worker paused past their TTL (a
// long GC pause, a suspended VM) from resuming and writing as if it still
// held them. So each transfer's transaction starts, before it reads
// anything, with the fence guard (package fencesql), for both accounts in
// the same order:
//
//	guard.Advance(ctx, tx, "account:"+id, lease.Fence())
//
// A stale holder whose accounts a newer holder wrote first gets ErrStale
// there, and writes nothing. A newer holder that comes second waits there
// until the stale holder's transaction ends, and reads the balances it left:
// reading them before the fences, or outside the transaction, would let it
// compute its writes from balances about to change, and make or lose money.
// At the end the parent checks that the four balances still add up to
// $400.00 and that each is its opening balance plus the ledger's credits
// less its debits: no transfer was lost.
//
// Run it with nothing but Go installed:
//
//	go run ./examples/transfer
//
// It starts an embedded miniredis on a loopback port and an SQLite file in a
// temporary directory. REDIS_ADDR (host:port or redis:// URL) switches to a
// real Redis, DATABASE_URL (postgres:// URL) to PostgreSQL. The run uses its
// own tables (accounts, ledger, fence guard) and lock key prefix and removes
// them at the end.
package main

import (
	"context"
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

// command is the transfer command, and its workers (runWorker).
var command = demo.Command{
	Name: "transfer",
	Run: func(ctx context.Context) error {
		_, err := run(ctx, Config{RedisAddr: os.Getenv("REDIS_ADDR"), DatabaseURL: os.Getenv("DATABASE_URL")})
		return err
	},
	Child: demo.ChildMain(runWorker),
}

// Config configures one run of the story.
type Config struct {
	RedisAddr   string        // REDIS_ADDR; empty starts an embedded miniredis
	DatabaseURL string        // DATABASE_URL; empty uses an embedded SQLite file
	TTL         time.Duration // the locks' TTL; default 2s
	Out         io.Writer     // the timeline; default os.Stdout
	Stderr      io.Writer     // the workers' standard error; default os.Stderr
}

// Transfer is one transfer the story runs.
type Transfer struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount_cents"`
}

// The outcomes of a transfer.
const (
	Moved        = "moved"              // both writes landed
	Insufficient = "insufficient funds" // the source could not pay: nothing written
	Rejected     = "rejected"           // refused by the fence guard, a newer holder wrote first: nothing written
	Failed       = "failed"             // anything else; see Err
)

// Outcome is what one transfer ended with.
type Outcome struct {
	Transfer
	Worker    string `json:"worker"`
	Outcome   string `json:"outcome"`
	FromFence int64  `json:"from_fence"`
	ToFence   int64  `json:"to_fence"`
	Err       string `json:"err,omitempty"`
}

// Account is one row of the accounts table.
type Account struct {
	ID      string
	Balance int64 // cents
	Fence   int64
}

// Result is what a run of the story did.
type Result struct {
	Tables   []string  // dropped at the end of the run
	Keys     []string  // the locks' keys, deleted at the end of the run
	Outcomes []Outcome // one per transfer, by worker
	Accounts []Account // at the end
	Ledger   []Outcome // the ledger's rows, by transfer
}

// The story's accounts, their opening balance, and its transfers, by
// worker.
var (
	accounts = []string{"alice", "bob", "carol", "dave"}
	opening  = int64(100_00)
	plan     = map[string][]Transfer{
		"worker-1": {{"t1", "alice", "bob", 25_00}, {"t4", "bob", "alice", 30_00}, {"t7", "carol", "dave", 10_00}},
		"worker-2": {{"t2", "bob", "carol", 40_00}, {"t5", "alice", "carol", 20_00}, {"t8", "bob", "dave", 5_00}},
		"worker-3": {{"t3", "carol", "alice", 15_00}, {"t6", "dave", "bob", 35_00}},
	}
	workers = []string{"worker-1", "worker-2", "worker-3"}
)

// run tells the story and returns what happened. Every worker it started
// has been waited for (killed if need be) when it returns.
func run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.TTL == 0 {
		cfg.TTL = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	st, err := demo.Start(ctx, cfg.Out, demo.Servers{RedisAddr: cfg.RedisAddr, DatabaseURL: cfg.DatabaseURL})
	if err != nil {
		return res, err
	}
	defer st.Close(&err)
	tl, db := st.Timeline, st.DB

	q := newQueries(db, "accounts_"+st.ID, "ledger_"+st.ID)
	fences := "fences_" + st.ID
	res.Tables = st.DropAtEnd(q.accounts, q.ledger, fences, fences+"_keys")
	for _, stmt := range q.create {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return res, fmt.Errorf("create tables: %w", err)
		}
	}
	if _, err := db.NewGuard(ctx, fences); err != nil {
		return res, err
	}
	for _, a := range accounts {
		if _, err := db.ExecContext(ctx, q.open, a, opening); err != nil {
			return res, fmt.Errorf("open account %s: %w", a, err)
		}
	}
	for _, a := range accounts {
		res.Keys = append(res.Keys, st.LockKeys("account:"+a)...)
	}

	tl.Printf("parent", "redis: %s", st.Redis.Desc)
	tl.Printf("parent", "database: %s, tables %s", db.Desc, strings.Join(res.Tables, ", "))
	tl.Printf("parent", "%s open with %s each; %d processes start 8 transfers at once, each locking its two accounts with AcquireAll (TTL %v)",
		strings.Join(accounts, ", "), dollars(opening), len(workers), cfg.TTL)

	base := workerConfig{Redis: st.Redis.Addr, Driver: db.Driver, DSN: db.DSN, Accounts: q.accounts, Ledger: q.ledger,
		Fences: fences, KeyPrefix: st.KeyPrefix, TTL: cfg.TTL}
	s := demo.NewProcs[Outcome](tl, cfg.Stderr)
	defer s.StopAll()
	var procs []*demo.Proc[Outcome]
	for _, name := range workers {
		c := base
		c.Worker, c.Transfers = name, plan[name]
		p, err := s.Start(name, c)
		if err != nil {
			return res, err
		}
		procs = append(procs, p)
	}
	if err := s.FireTogether(ctx, procs...); err != nil {
		return res, err
	}
	for _, p := range procs {
		outs, err := p.Results(ctx)
		if err != nil {
			return res, err
		}
		res.Outcomes = append(res.Outcomes, outs...)
	}

	if res.Accounts, err = q.balances(ctx, db); err != nil {
		return res, err
	}
	if res.Ledger, err = q.entries(ctx, db); err != nil {
		return res, err
	}
	var total int64
	for _, a := range res.Accounts {
		total += a.Balance
		tl.Printf("parent", "%s: %s (fence %d)", a.ID, dollars(a.Balance), a.Fence)
	}
	tl.Printf("parent", "%d transfers in the ledger; the balances add up to %s, as they opened with %s",
		len(res.Ledger), dollars(total), dollars(opening*int64(len(accounts))))
	if err := check(res); err != nil {
		return res, err
	}
	tl.Printf("parent", "no money lost or made: every balance is its opening balance plus its credits less its debits")
	return res, nil
}

// check checks that the accounts are what the ledger says, and that no
// money was lost or made.
func check(res Result) error {
	want := map[string]int64{}
	for _, a := range accounts {
		want[a] = opening
	}
	for _, e := range res.Ledger {
		want[e.From] -= e.Amount
		want[e.To] += e.Amount
	}
	var total int64
	for _, a := range res.Accounts {
		total += a.Balance
		if a.Balance != want[a.ID] {
			return fmt.Errorf("%s has %s, the ledger says %s: a transfer was lost", a.ID, dollars(a.Balance), dollars(want[a.ID]))
		}
	}
	if total != opening*int64(len(accounts)) {
		return fmt.Errorf("the balances add up to %s", dollars(total))
	}
	return nil
}

// dollars formats cents as dollars.
func dollars(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s$%d.%02d", sign, cents/100, cents%100)
}
