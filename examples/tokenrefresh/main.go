// Command tokenrefresh shows fencelock keeping the instances of a service
// that share an access token from all refreshing it at once and revoking
// each other's tokens.
//
// Four instances call an external API (here a server on loopback) with an
// access token they share through a token store (a database table). The
// API's authorization endpoint issues a token that expires after a short
// time, counts the tokens it issues, and revokes the previous token each
// time it issues one, as many providers do (one active token per client).
//
// When the token is about to expire, every instance notices at once. With
// the lock, each calls RunWithLock("token:quotes", ..., WithWait(5s)): one
// gets the lock, asks the API for a new token and stores it; the others
// wait for the lock, find the new token in the store and reuse it. One token
// is issued per expiry, and no call is refused. The store's write is fenced:
// it runs in a transaction behind the fence guard (package fencesql),
//
//	guard.Advance(ctx, tx, "token:quotes", lease.Fence())
//	UPDATE tokens SET access_token = ?, ... WHERE api = ?
//
// so that a refresher that lost its lock without knowing it (a long pause)
// cannot overwrite a newer token with an older one.
//
// Then the same instances run again with the lock turned off: at each
// expiry all four ask for a token, each new token revokes the one before,
// and the instances' calls with the revoked tokens are refused (401), which
// sends them to refresh again.
//
// Run it with nothing but Go installed:
//
//	go run ./examples/tokenrefresh
//
// It starts an embedded miniredis on a loopback port and an SQLite file in a
// temporary directory. REDIS_ADDR (host:port or redis:// URL) switches to a
// real Redis, DATABASE_URL (postgres:// URL) to PostgreSQL. The run uses its
// own table and lock key prefix and removes them at the end.
//
// The instances are goroutines, as in the orders example: the story is four
// callers meeting at one expiry, and needs no process to be paused. Each has
// its own Redis client, database pool and HTTP client, as separate processes
// would. They call the API in step, every 50ms, so that they notice the
// expiry at the same moment, as busy instances do. The story keeps its own
// time, the ticks': the API counts a token's lifetime, and judges it, at
// the time of the instances' tick, so that a machine too busy to keep up
// runs the story slower, not differently.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/fencesql"
)

func main() {
	os.Exit(command.Main())
}

// command is the tokenrefresh command.
var command = demo.Command{
	Name: "tokenrefresh",
	Run: func(ctx context.Context) error {
		_, err := run(ctx, Config{
			RedisAddr:   os.Getenv("REDIS_ADDR"),
			DatabaseURL: os.Getenv("DATABASE_URL"),
		})
		return err
	},
}

// Config configures one run of the story.
type Config struct {
	RedisAddr   string        // REDIS_ADDR; empty starts an embedded miniredis
	DatabaseURL string        // DATABASE_URL; empty uses an embedded SQLite file
	Lifetime    time.Duration // how long a token lives; default 400ms
	Duration    time.Duration // how long each of the two runs lasts; default 1.2s
	Out         io.Writer     // the timeline; default os.Stdout
}

// The story's fixed parts.
const (
	apiName      = "quotes"
	lockName     = "token:" + apiName
	callEvery    = 50 * time.Millisecond // each instance calls the API this often
	issueLatency = 25 * time.Millisecond // how long the API takes to issue a token
	waitForLock  = 5 * time.Second
)

var instanceNames = []string{"instance-a", "instance-b", "instance-c", "instance-d"}

// Refresh is one instance's visit to the token store for a new token.
type Refresh struct {
	Instance string
	Tick     int           // the tick (the instances' turn of calls) it happened in
	Why      string        // "no token", "expiring" or "refused"
	Token    string        // the token it used afterwards
	Issued   bool          // it asked the API for Token (otherwise it reused a stored one)
	Fence    int64         // the lock's fencing token; 0 without the lock
	Waited   time.Duration // how long it waited for the lock
}

// RunResult is what one run of the instances did.
type RunResult struct {
	Locked    bool
	Expiries  int // ticks in which the instances found the token missing or about to expire
	API       APIStats
	Refreshes []Refresh
}

// Result is what the story did: the run with the lock, then the one without.
type Result struct {
	Locked, Unlocked RunResult
	Table            string   // the token store, dropped at the end of the run
	Fences           string   // the fence guard's table (and Fences+"_keys"), dropped at the end of the run
	Keys             []string // the run's Redis keys, deleted at the end of the run
}

// setup is what both runs share.
type setup struct {
	cfg Config
	st  *demo.Stage
	tl  *demo.Timeline
	db  *demo.DB
	q   queries
}

// run tells the story and returns what happened.
func run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.Lifetime == 0 {
		cfg.Lifetime = 400 * time.Millisecond
	}
	if cfg.Duration == 0 {
		cfg.Duration = 1200 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+2*cfg.Duration)
	defer cancel()

	st, err := demo.Start(ctx, cfg.Out, demo.Servers{RedisAddr: cfg.RedisAddr, DatabaseURL: cfg.DatabaseURL})
	if err != nil {
		return res, err
	}
	defer st.Close(&err)
	s := &setup{cfg: cfg, st: st, tl: st.Timeline, db: st.DB}

	s.q = newQueries(s.db, "tokens_"+st.ID, "fences_"+st.ID)
	res.Table, res.Fences = s.q.table, s.q.fences
	st.DropAtEnd(res.Table, res.Fences, res.Fences+"_keys")
	if err := s.q.createTables(ctx, s.db); err != nil {
		return res, err
	}
	if _, err := s.db.ExecContext(ctx, s.q.insert, apiName); err != nil {
		return res, fmt.Errorf("create the token row: %w", err)
	}
	res.Keys = st.LockKeys(lockName)

	s.tl.Printf("parent", "redis: %s", st.Redis.Desc)
	s.tl.Printf("parent", "token store: %s, table %s, fence guard %s", s.db.Desc, s.q.table, s.q.fences)
	s.tl.Printf("parent", "%d instances call the %s API every %v; a token lives %v, and issuing one revokes the one before",
		len(instanceNames), apiName, callEvery, cfg.Lifetime)
	s.tl.Printf("parent", "an instance refreshes the token when less than %v of it is left", margin(cfg.Lifetime))

	s.tl.Printf("parent", "run 1: refresh under the lock %q, the others wait for it (WithWait)", lockName)
	if res.Locked, err = s.runInstances(ctx, true); err != nil {
		return res, err
	}
	s.summarize(res.Locked)

	s.tl.Printf("parent", "run 2: the same instances with the lock turned off")
	if res.Unlocked, err = s.runInstances(ctx, false); err != nil {
		return res, err
	}
	s.summarize(res.Unlocked)
	s.tl.Printf("parent", "tokens issued: %d with the lock, %d without; API calls refused: %d with the lock, %d without",
		res.Locked.API.Issued, res.Unlocked.API.Issued, res.Locked.API.Failed(), res.Unlocked.API.Failed())
	return res, nil
}

// margin is how long before a token expires the instances refresh it, so
// that a call made just before the expiry does not arrive just after it.
func margin(lifetime time.Duration) time.Duration { return lifetime / 4 }

func (s *setup) summarize(r RunResult) {
	with := "with the lock"
	if !r.Locked {
		with = "without the lock"
	}
	s.tl.Printf("parent", "%s: %d expiries, %d tokens issued, %d API calls, %v",
		with, r.Expiries, r.API.Issued, r.API.Calls, r.API)
}

// runInstances runs the four instances against a fresh token API for
// cfg.Duration, with or without the lock, and returns what they did.
func (s *setup) runInstances(ctx context.Context, locked bool) (res RunResult, err error) {
	res.Locked = locked
	if _, err := s.db.ExecContext(ctx, s.q.reset, apiName); err != nil {
		return res, fmt.Errorf("empty the token store: %w", err)
	}
	api, err := startTokenAPI(s.cfg.Lifetime, issueLatency)
	if err != nil {
		return res, err
	}
	defer api.Close()

	rec := &recorder{expiries: make(map[int]string), active: make(map[int]bool)}
	var instances []*instance
	defer func() {
		for _, in := range instances {
			in.close()
		}
	}()
	for _, name := range instanceNames {
		in, err := s.newInstance(ctx, name, api.URL, locked, rec)
		if err != nil {
			return res, err
		}
		instances = append(instances, in)
	}

	// The instances call the API in step: tick n is at start + n*callEvery,
	// which is the API's time and the instances' during the tick (see
	// tokenAPI), however long the tick's calls take. A round starts at a tick in which they find the token missing or
	// expiring and lasts while they keep refreshing. Without the lock, only
	// the first expiry (round 1) is told line by line, the others in one
	// line each.
	var (
		start  = time.Now()
		errs   = make([]error, len(instances))
		round  int      // the round going on, or the next one
		open   bool     // a round is going on
		before APIStats // the API's counts when it started
		why    string   // what started it
	)
	quiet := func(round int) bool { return !locked && round != 1 }
	endRound := func() {
		if !open {
			return
		}
		if quiet(round) {
			after := api.stats()
			s.tl.Printf("instances", "%s: the API issued %d tokens (tok-%d to tok-%d), %d calls refused",
				why, after.Issued-before.Issued, before.Issued+1, after.Issued, after.Failed()-before.Failed())
		}
		open = false
		round++
	}
	for n := 0; time.Duration(n)*callEvery <= s.cfg.Duration; n++ {
		at := start.Add(time.Duration(n) * callEvery)
		t := time.NewTimer(time.Until(at))
		select {
		case <-ctx.Done():
			t.Stop()
			return res, context.Cause(ctx)
		case <-t.C:
		}
		api.setTime(at)
		stats := api.stats()
		rec.setQuiet(quiet(round))
		var wg sync.WaitGroup
		for i, in := range instances {
			wg.Go(func() { errs[i] = in.tick(ctx, n, at) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		switch expiry, active := rec.roundAt(n); {
		case expiry != "":
			endRound()
			open, before, why = true, stats, expiry
		case !active:
			endRound()
		}
	}
	endRound()
	res.Expiries, res.Refreshes = len(rec.expiries), rec.refreshes
	res.API = api.stats()
	return res, nil
}

// recorder collects what the instances did; safe for concurrent use.
type recorder struct {
	mu        sync.Mutex
	expiries  map[int]string // guarded by mu; ticks in which instances found the token missing or expiring: "no token", "tok-3 expiring"
	active    map[int]bool   // guarded by mu; ticks in which an instance refreshed
	refreshes []Refresh      // guarded by mu
	quiet     bool           // guarded by mu; the instances print nothing
}

func (r *recorder) setQuiet(q bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.quiet = q
}

func (r *recorder) isQuiet() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.quiet
}

// roundAt returns what started a round in tick ("" if nothing did), and
// whether any instance refreshed in it.
func (r *recorder) roundAt(tick int) (expiry string, active bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expiries[tick], r.active[tick]
}

func (r *recorder) expiry(tick int, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expiries[tick] = what
}

func (r *recorder) refresh(f Refresh) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshes = append(r.refreshes, f)
	r.active[f.Tick] = true
}

// instance is one instance of the service.
type instance struct {
	name     string
	locker   *fencelock.Locker // nil: the lock is turned off
	db       *demo.DB
	q        queries
	api      *apiClient
	lifetime time.Duration
	tl       *demo.Timeline
	rec      *recorder
	close    func()

	// Only the goroutine running tick touches these.
	token   string    // the token it uses
	expires time.Time // when it expires
}

func (s *setup) newInstance(ctx context.Context, name, apiURL string, locked bool, rec *recorder) (*instance, error) {
	db, err := demo.Connect(ctx, s.db.Driver, s.db.DSN)
	if err != nil {
		return nil, err
	}
	in := &instance{
		name: name, db: db, q: s.q, api: newAPIClient(apiURL), lifetime: s.cfg.Lifetime, tl: s.tl, rec: rec,
	}
	in.close = func() { in.api.close(); _ = db.Close() }
	if !locked {
		return in, nil
	}
	rdb, err := demo.NewRedisClient(ctx, s.st.Redis.Addr)
	if err != nil {
		in.close()
		return nil, err
	}
	locker, err := fencelock.New(rdb, &fencelock.Options{KeyPrefix: s.st.KeyPrefix})
	if err != nil {
		_ = rdb.Close()
		in.close()
		return nil, err
	}
	in.locker = locker
	in.close = func() { _ = locker.Close(); _ = rdb.Close(); in.api.close(); _ = db.Close() }
	return in, nil
}

// say prints a line on the timeline, unless the recorder is quiet.
func (in *instance) say(format string, args ...any) {
	if !in.rec.isQuiet() {
		in.tl.Printf(in.name, format, args...)
	}
}

// tick is the instance's turn in tick n: refresh the token if it is missing or about
// to expire, call the API, and on a 401 refresh and try once more.
func (in *instance) tick(ctx context.Context, n int, at time.Time) error {
	switch {
	case in.token == "":
		in.rec.expiry(n, "no token")
		if err := in.refresh(ctx, n, at, "no token", ""); err != nil {
			return err
		}
	case !at.Before(in.expires.Add(-margin(in.lifetime))):
		in.rec.expiry(n, in.token+" expiring")
		if err := in.refresh(ctx, n, at, "expiring", ""); err != nil {
			return err
		}
	}
	err := in.api.quote(ctx, in.token)
	if !errors.Is(err, errRefused) {
		return err
	}
	in.say("API refused %s: %v", in.token, err)
	if err := in.refresh(ctx, n, at, "refused", in.token); err != nil {
		return err
	}
	if err := in.api.quote(ctx, in.token); errors.Is(err, errRefused) {
		in.say("API refused %s too: %v", in.token, err)
	} else if err != nil {
		return err
	}
	return nil
}

// refresh gets a token from the store, or a new one from the API when the
// store has none that is valid at the tick's time and not the one the API
// just refused: under the lock, waiting for it, or without.
func (in *instance) refresh(ctx context.Context, n int, at time.Time, why, refused string) error {
	f := Refresh{Instance: in.name, Tick: n, Why: why}
	if in.locker == nil {
		return in.refreshFromStore(ctx, at, refused, nil, f)
	}
	begin := time.Now()
	err := in.locker.RunWithLock(ctx, lockName, func(ctx context.Context, lease *fencelock.Lease) error {
		f.Waited, f.Fence = time.Since(begin), lease.Fence()
		return in.refreshFromStore(ctx, at, refused, lease, f)
	}, fencelock.WithWait(waitForLock))
	if err != nil {
		return fmt.Errorf("%s: refresh the token under %q: %w", in.name, lockName, err)
	}
	return nil
}

// refreshFromStore is refresh's critical section. With a lease, the
// store's write is fenced.
func (in *instance) refreshFromStore(ctx context.Context, at time.Time, refused string, lease *fencelock.Lease, f Refresh) error {
	what := f.Why
	if f.Why != "no token" {
		what = in.token + " " + f.Why
	}
	if lease != nil {
		what += fmt.Sprintf("; got %s after %dms (fence %d)", lockName, f.Waited.Milliseconds(), f.Fence)
	}
	stored, err := in.q.read(ctx, in.db, apiName)
	if err != nil {
		return fmt.Errorf("%s: %w", in.name, err)
	}
	if stored.Token != "" && stored.Token != refused && at.Before(stored.Expires.Add(-margin(in.lifetime))) {
		in.token, in.expires = stored.Token, stored.Expires
		f.Token = stored.Token
		in.rec.refresh(f)
		in.say("%s; the store has %s from %s: reusing it", what, stored.Token, stored.By)
		return nil
	}
	tok, expires, err := in.api.token(ctx, at)
	if err != nil {
		return fmt.Errorf("%s: %w", in.name, err)
	}
	if lease != nil {
		if err := in.q.storeFenced(ctx, in.db, apiName, tok, expires, in.name, lease.Fence()); err != nil {
			return fmt.Errorf("%s: %w", in.name, err)
		}
	} else if err := in.q.store(ctx, in.db, apiName, tok, expires, in.name); err != nil {
		return fmt.Errorf("%s: %w", in.name, err)
	}
	in.token, in.expires = tok, expires
	f.Token, f.Issued = tok, true
	in.rec.refresh(f)
	if lease != nil {
		in.say("%s; no usable token in the store: the API issued %s, stored it (fenced write)", what, tok)
	} else {
		in.say("%s; no usable token in the store: the API issued %s, stored it", what, tok)
	}
	return nil
}

// stored is the token store's row for an API.
type stored struct {
	Token   string
	Expires time.Time
	By      string
}

// queries are the token store's statements, written with ? and rebound once
// for the database's placeholder style, and its fence guard.
type queries struct {
	table, fences                            string          // table names
	guard                                    *fencesql.Guard // set by createTables
	create, insert, reset, selectRow, update string
}

func newQueries(db *demo.DB, table, fences string) queries {
	return queries{
		table: table, fences: fences,
		create: `CREATE TABLE ` + table + ` (
			api          TEXT PRIMARY KEY,
			access_token TEXT NOT NULL,
			expires_at   BIGINT NOT NULL, -- Unix milliseconds
			stored_by    TEXT NOT NULL)`,
		insert:    db.Rebind(`INSERT INTO ` + table + ` (api, access_token, expires_at, stored_by) VALUES (?, '', 0, '')`),
		reset:     db.Rebind(`UPDATE ` + table + ` SET access_token = '', expires_at = 0, stored_by = '' WHERE api = ?`),
		selectRow: db.Rebind(`SELECT access_token, expires_at, stored_by FROM ` + table + ` WHERE api = ?`),
		// The write, fenced by the guard's Advance in its transaction
		// under the lock, and the last writer's without it.
		update: db.Rebind(`UPDATE ` + table + ` SET access_token = ?, expires_at = ?, stored_by = ? WHERE api = ?`),
	}
}

// createTables creates the token store and its fence guard's tables.
func (q *queries) createTables(ctx context.Context, db *demo.DB) error {
	if _, err := db.ExecContext(ctx, q.create); err != nil {
		return fmt.Errorf("create table %s: %w", q.table, err)
	}
	var err error
	q.guard, err = db.NewGuard(ctx, q.fences)
	return err
}

func (q queries) read(ctx context.Context, db *demo.DB, api string) (stored, error) {
	var s stored
	var ms int64
	if err := db.QueryRowContext(ctx, q.selectRow, api).Scan(&s.Token, &ms, &s.By); err != nil {
		return s, fmt.Errorf("read the token store: %w", err)
	}
	s.Expires = time.UnixMilli(ms)
	return s, nil
}

// storeFenced stores tok, in one transaction with the guard's Advance for
// the API's lock, unless a holder with a newer fence has stored one: then
// it returns an error matching fencesql.ErrStale, and stores nothing.
func (q queries) storeFenced(ctx context.Context, db *demo.DB, api, tok string, expires time.Time, by string, fence int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store the token: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := q.guard.Advance(ctx, tx, "token:"+api, fence); err != nil {
		return fmt.Errorf("token not stored: %w", err)
	}
	if _, err := tx.ExecContext(ctx, q.update, tok, expires.UnixMilli(), by, api); err != nil {
		return fmt.Errorf("store the token: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store the token: %w", err)
	}
	return nil
}

// store stores tok unconditionally: the run without the lock.
func (q queries) store(ctx context.Context, db *demo.DB, api, tok string, expires time.Time, by string) error {
	if _, err := db.ExecContext(ctx, q.update, tok, expires.UnixMilli(), by, api); err != nil {
		return fmt.Errorf("store the token: %w", err)
	}
	return nil
}
