// Command orders shows fencelock keeping a duplicated notification from
// shipping an order twice.
//
// A payment provider delivers "payment completed" for order 42 twice, to two
// instances of the order service at the same moment (at-least-once delivery
// does that). Both call RunWithLock("order:42", ..., WithWait(5s),
// WithFailOpen(true)): one gets the lock, picks and packs the order and marks
// it shipped; the other waits for the lock, then finds the order shipped and
// acknowledges the duplicate.
// The lock saves the second instance the work. What makes "ships once"
// hold even if a holder lost its lock without knowing it is the shipping
// transaction: the fence guard (package fencesql) refuses a holder older
// than one that wrote the order, and the writes are conditional:
//
//	guard.Advance(ctx, tx, "order:42", lease.Fence())
//	UPDATE orders SET status = 'shipped' WHERE id = ? AND status = 'paid'
//	INSERT INTO shipments ... ON CONFLICT (order_id) DO NOTHING
//
// Shipping is safe to run twice for that reason, so the instances fail open
// (WithFailOpen(true)): when Redis is down they run the work anyway, on a
// degraded lease with no lock and no fence, and let the database decide. A
// degraded run's fence 0 is not a fence (Advance returns ErrNoFence), so it
// writes through the two conditional writes alone, which hold without a
// lock.
//
// With REDIS_ADDR pointing at nothing, both instances retry Redis for their
// 5s wait, then run degraded at the same time: one ships, the other's update
// matches no row and it acknowledges the duplicate.
//
// Run it with nothing but Go installed, and with a Redis that is down:
//
//	go run ./examples/orders
//	REDIS_ADDR=127.0.0.1:1 go run ./examples/orders
//
// It starts an embedded miniredis on a loopback port and an SQLite file in a
// temporary directory. REDIS_ADDR (host:port or redis:// URL) switches to a
// real Redis, DATABASE_URL (postgres:// URL) to PostgreSQL. The run uses its
// own tables and lock key prefix and removes them at the end.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/fencesql"
)

func main() {
	os.Exit(command.Main())
}

// command is the orders command.
var command = demo.Command{
	Name: "orders",
	Run: func(ctx context.Context) error {
		// go-redis logs each failed dial of its pools, dozens a second
		// while Redis is down; the timeline shows the outage once per
		// instance, as fencelock logs it.
		redis.SetLogger(quietLogger{})
		_, err := run(ctx, Config{
			RedisAddr:   os.Getenv("REDIS_ADDR"),
			DatabaseURL: os.Getenv("DATABASE_URL"),
		})
		return err
	},
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// Config configures one run of the story.
type Config struct {
	RedisAddr   string        // REDIS_ADDR; empty starts an embedded miniredis
	DatabaseURL string        // DATABASE_URL; empty uses an embedded SQLite file
	Pack        time.Duration // how long picking and packing takes; default 300ms
	Out         io.Writer     // the timeline; default os.Stdout
}

// Handling is what one instance did with its notification.
type Handling struct {
	Instance string
	Fence    int64         // the fencing token it held; 0 if it did not get the lock or ran degraded
	Degraded bool          // it ran without the lock: Redis was unavailable (fail-open)
	Waited   time.Duration // how long it waited for the lock, or for Redis before running degraded
	Found    string        // the order's status when it looked, under the lock unless degraded
	Shipped  bool          // this instance shipped the order
	Err      error
}

// Shipment is one row of the shipments table.
type Shipment struct {
	OrderID   int64
	ShippedBy string
	Fence     int64
}

// Result is what a run of the story did.
type Result struct {
	OrderID   int64
	Status    string // the order's status at the end
	Fence     int64  // the fence the guard recorded for the order at the end; 0 if none
	Handlings []Handling
	Shipments []Shipment
	Tables    []string // the run's tables, dropped at the end of the run
	Keys      []string // the run's Redis keys, deleted at the end of the run if Redis answers
}

const orderID = 42

// run tells the story: two instances, as goroutines with a Redis client and
// a database pool each, handle the same notification at the same moment.
func run(ctx context.Context, cfg Config) (res Result, err error) {
	if cfg.Pack == 0 {
		cfg.Pack = 300 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	// A Redis that does not answer is an outage, not a bad address: the
	// instances fail open, so the story goes on without Redis.
	st, err := demo.Start(ctx, cfg.Out, demo.Servers{RedisAddr: cfg.RedisAddr, DatabaseURL: cfg.DatabaseURL, RedisMayBeDown: true})
	if err != nil {
		return res, err
	}
	defer st.Close(&err)
	tl, db := st.Timeline, st.DB

	q := newQueries(db, st.ID)
	res.OrderID, res.Tables = orderID, st.DropAtEnd(q.orders, q.shipments, q.fences, q.fences+"_keys")
	if err := q.createTables(ctx, db); err != nil {
		return res, err
	}
	lockName := fmt.Sprintf("order:%d", orderID)
	res.Keys = st.LockKeys(lockName)
	if _, err := db.ExecContext(ctx, q.insertOrder, orderID); err != nil {
		return res, fmt.Errorf("create order: %w", err)
	}

	if st.RedisDown != nil {
		tl.Printf("parent", "redis: %s; the instances will fail open", st.Redis.Desc)
	} else {
		tl.Printf("parent", "redis: %s", st.Redis.Desc)
	}
	tl.Printf("parent", "database: %s, tables %s and %s, fence guard %s", db.Desc, q.orders, q.shipments, q.fences)
	tl.Printf("parent", "order %d is paid; its \"payment completed\" notification arrives twice, at two instances at once",
		orderID)

	// Each instance has its own Redis client and database pool, as separate
	// processes would.
	names := []string{"instance-a", "instance-b"}
	instances := make([]*instance, 0, len(names))
	defer func() {
		for _, in := range instances {
			in.close()
		}
	}()
	for _, name := range names {
		in, err := newInstance(ctx, name, st.Redis.Addr, db, q, st.KeyPrefix, cfg.Pack, tl)
		if err != nil {
			return res, err
		}
		instances = append(instances, in)
	}

	res.Handlings = make([]Handling, len(instances))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, in := range instances {
		wg.Go(func() {
			<-start
			res.Handlings[i] = in.handle(ctx, lockName)
		})
	}
	close(start) // both notifications arrive now
	wg.Wait()

	for _, h := range res.Handlings {
		if h.Err != nil {
			return res, fmt.Errorf("%s: %w", h.Instance, h.Err)
		}
	}
	if err := db.QueryRowContext(ctx, q.selectStatus, orderID).Scan(&res.Status); err != nil {
		return res, fmt.Errorf("read order: %w", err)
	}
	if err := db.QueryRowContext(ctx, q.selectFence, lockName).Scan(&res.Fence); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return res, fmt.Errorf("read the order's fence: %w", err)
	}
	if res.Shipments, err = q.allShipments(ctx, db); err != nil {
		return res, err
	}
	for _, s := range res.Shipments {
		tl.Printf("parent", "order %d: status %s, fence %d; shipped once, by %s", orderID, res.Status, res.Fence, s.ShippedBy)
	}
	if len(res.Shipments) != 1 {
		tl.Printf("parent", "order %d: status %s, %d shipments", orderID, res.Status, len(res.Shipments))
	}
	return res, nil
}

// instance is one instance of the order service.
type instance struct {
	name   string
	locker *fencelock.Locker
	db     *demo.DB
	q      queries
	pack   time.Duration
	tl     *demo.Timeline
	close  func()
}

func newInstance(ctx context.Context, name, redisAddr string, shared *demo.DB, q queries,
	prefix string, pack time.Duration, tl *demo.Timeline) (*instance, error) {
	// No PING first: when Redis does not answer, the instance fails open.
	rdb, err := demo.RedisClient(redisAddr)
	if err != nil {
		return nil, err
	}
	db, err := demo.Connect(ctx, shared.Driver, shared.DSN)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	locker, err := fencelock.New(rdb, &fencelock.Options{
		KeyPrefix: prefix,
		// A fail-open run is logged at Error level, with its cause: the
		// timeline shows it.
		Logger: tl.Logger(name, slog.LevelWarn),
	})
	if err != nil {
		_ = db.Close()
		_ = rdb.Close()
		return nil, err
	}
	return &instance{
		name: name, locker: locker, db: db, q: q, pack: pack, tl: tl,
		close: func() { _ = locker.Close(); _ = db.Close(); _ = rdb.Close() },
	}, nil
}

// handle handles a "payment completed" notification for the order: under the
// order's lock, ship it unless it has been shipped already. When Redis is
// unavailable it runs and lets the database decide: shipping is guarded by
// the order's status and the shipments key, which hold without a lock.
func (in *instance) handle(ctx context.Context, lockName string) Handling {
	h := Handling{Instance: in.name}
	const wait = 5 * time.Second
	in.tl.Printf(in.name, "payment completed for order %d: RunWithLock(%q, WithWait(%v), WithFailOpen(true))",
		orderID, lockName, wait)
	begin := time.Now()
	err := in.locker.RunWithLock(ctx, lockName, func(ctx context.Context, lease *fencelock.Lease) error {
		h.Fence, h.Degraded, h.Waited = lease.Fence(), lease.Degraded(), time.Since(begin)
		got := fmt.Sprintf("acquired the lock, fence %d", h.Fence)
		switch {
		case h.Degraded:
			got = fmt.Sprintf("redis unavailable for %.2fs (logged above): running degraded, without the lock and without a fence",
				h.Waited.Seconds())
		case h.Waited > 50*time.Millisecond:
			got = fmt.Sprintf("acquired the lock after waiting %.2fs, fence %d", h.Waited.Seconds(), h.Fence)
		}
		if err := in.db.QueryRowContext(ctx, in.q.selectStatus, orderID).Scan(&h.Found); err != nil {
			return fmt.Errorf("read order: %w", err)
		}
		if h.Found != "paid" {
			in.tl.Printf(in.name, "%s; order %d is already %s: acknowledge the duplicate notification",
				got, orderID, h.Found)
			return nil
		}
		in.tl.Printf(in.name, "%s; order %d is paid: picking and packing", got, orderID)
		select {
		case <-time.After(in.pack):
		case <-ctx.Done(): // the lease was lost (or the run cancelled): stop here
			return context.Cause(ctx)
		}
		shipped, err := ship(ctx, in.db, in.q, orderID, in.name, h.Fence)
		if err != nil {
			return err
		}
		h.Shipped = shipped
		if h.Degraded {
			if shipped {
				in.tl.Printf(in.name, "conditional update matched the paid order: shipped, shipment recorded without a fence")
			} else {
				// Expected without the lock: the other instance ran the
				// same work meanwhile and shipped first.
				in.tl.Printf(in.name, "conditional update matched no row: shipped meanwhile, nothing written: "+
					"acknowledge the duplicate notification")
			}
			return nil
		}
		if shipped {
			in.tl.Printf(in.name, "conditional update matched the paid order: shipped, shipment recorded with fence %d", h.Fence)
		} else {
			// Only possible if this instance lost its lock while packing and
			// another one shipped the order meanwhile.
			in.tl.Printf(in.name, "a newer holder wrote the order, or it shipped already: nothing written")
		}
		return nil
	}, fencelock.WithWait(wait), fencelock.WithFailOpen(true))
	if err != nil {
		if errors.Is(err, fencelock.ErrNotObtained) {
			err = fmt.Errorf("the lock stayed busy for %v: %w", wait, err)
		}
		in.tl.Printf(in.name, "failed: %v", err)
		h.Err = err
	}
	return h
}

// ship marks the order shipped and records its shipment, in one
// transaction, if the order is still paid, has no shipment, and no holder
// with a newer fence has written it. It reports whether it did. Fence 0
// (a degraded run: no lock, no fence) skips the fence guard: the order's
// status and the shipments key decide, whoever else runs the same work
// meanwhile.
func ship(ctx context.Context, db *demo.DB, q queries, id int64, by string, fence int64) (shipped bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("ship order %d: %w", id, err)
	}
	defer func() {
		if !shipped {
			_ = tx.Rollback()
		}
	}()
	err = q.guard.Advance(ctx, tx, fmt.Sprintf("order:%d", id), fence)
	switch {
	case errors.Is(err, fencesql.ErrNoFence): // degraded: the writes below decide
	case errors.Is(err, fencesql.ErrStale): // this holder lost its lock to a newer one, which wrote
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ship order %d: %w", id, err)
	}
	res, err := tx.ExecContext(ctx, q.markShipped, id)
	if err != nil {
		return false, fmt.Errorf("ship order %d: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	// The shipment's primary key is the order: even a write that got past
	// the update could not record a second shipment (the insert inserts
	// nothing, and the update is rolled back).
	if res, err = tx.ExecContext(ctx, q.insertShipment, id, by, fence); err != nil {
		return false, fmt.Errorf("record shipment of order %d: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("ship order %d: %w", id, err)
	}
	return true, nil
}

// queries are the story's statements, written with ? and rebound once for
// the database's placeholder style, and its fence guard.
type queries struct {
	orders, shipments, fences string // table names
	create                    []string
	guard                     *fencesql.Guard // set by createTables
	insertOrder, selectStatus, selectFence,
	markShipped, insertShipment, selectShipments string
}

func newQueries(db *demo.DB, runID string) queries {
	orders, shipments, fences := "orders_"+runID, "shipments_"+runID, "fences_"+runID
	return queries{
		orders: orders, shipments: shipments, fences: fences,
		create: []string{
			`CREATE TABLE ` + orders + ` (
				id          BIGINT PRIMARY KEY,
				status      TEXT NOT NULL)   -- 'paid', then 'shipped'`,
			`CREATE TABLE ` + shipments + ` (
				order_id    BIGINT PRIMARY KEY, -- one shipment per order
				shipped_by  TEXT NOT NULL,
				fence_token BIGINT NOT NULL)    -- the fence it shipped under, for the record; 0: degraded`,
		},
		insertOrder:  db.Rebind(`INSERT INTO ` + orders + ` (id, status) VALUES (?, 'paid')`),
		selectStatus: db.Rebind(`SELECT status FROM ` + orders + ` WHERE id = ?`),
		// The guard's table (see fencesql's package documentation).
		selectFence: db.Rebind(`SELECT fence FROM ` + fences + ` WHERE resource = ?`),
		// The conditional writes, after the guard's Advance: they match
		// only a paid order without a shipment. SQLite (3.24 and later)
		// and PostgreSQL both take this ON CONFLICT.
		markShipped: db.Rebind(`UPDATE ` + orders + ` SET status = 'shipped' WHERE id = ? AND status = 'paid'`),
		insertShipment: db.Rebind(`INSERT INTO ` + shipments + ` (order_id, shipped_by, fence_token) VALUES (?, ?, ?)
			ON CONFLICT (order_id) DO NOTHING`),
		selectShipments: `SELECT order_id, shipped_by, fence_token FROM ` + shipments + ` ORDER BY order_id`,
	}
}

// createTables creates the story's tables and its fence guard's.
func (q *queries) createTables(ctx context.Context, db *demo.DB) error {
	for _, stmt := range q.create {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("create tables: %w", err)
		}
	}
	var err error
	q.guard, err = db.NewGuard(ctx, q.fences)
	return err
}

// allShipments reads the shipments table.
func (q queries) allShipments(ctx context.Context, db *demo.DB) ([]Shipment, error) {
	rows, err := db.QueryContext(ctx, q.selectShipments)
	if err != nil {
		return nil, fmt.Errorf("read shipments: %w", err)
	}
	defer rows.Close()
	var all []Shipment
	for rows.Next() {
		var s Shipment
		if err := rows.Scan(&s.OrderID, &s.ShippedBy, &s.Fence); err != nil {
			return nil, fmt.Errorf("read shipments: %w", err)
		}
		all = append(all, s)
	}
	return all, rows.Err()
}
