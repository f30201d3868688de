package main

import (
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/examples/internal/demotest"
)

func TestMain(m *testing.M) {
	demotest.Main(m, command)
}

// TestStory runs the story against each combination of embedded and real
// servers and checks that the order shipped once.
func TestStory(t *testing.T) {
	setups := []demotest.Setup{demotest.Embedded, demotest.WithRedis, demotest.WithPostgres, demotest.WithRedisAndPostgres}
	demotest.Run(t, setups, func(t *testing.T, redisAddr, databaseURL string) {
		cfg := Config{RedisAddr: redisAddr, DatabaseURL: databaseURL, Out: demotest.Output(t)}
		res, err := run(t.Context(), cfg)
		require.NoError(t, err)
		checkStory(t, res)
		demotest.KeysGone(t, redisAddr, res.Keys)
		demotest.TablesGone(t, databaseURL, res.Tables...)
	})
}

func checkStory(t *testing.T, res Result) {
	t.Helper()
	require.Len(t, res.Handlings, 2)
	var shipper, duplicate Handling
	switch {
	case res.Handlings[0].Shipped && !res.Handlings[1].Shipped:
		shipper, duplicate = res.Handlings[0], res.Handlings[1]
	case res.Handlings[1].Shipped && !res.Handlings[0].Shipped:
		shipper, duplicate = res.Handlings[1], res.Handlings[0]
	default:
		t.Fatalf("want exactly one instance to ship, got %+v", res.Handlings)
	}
	assert.Equal(t, "paid", shipper.Found)
	assert.Equal(t, "shipped", duplicate.Found, "the second instance found the order shipped")
	assert.Greater(t, duplicate.Fence, shipper.Fence, "the second instance held the lock after the first")
	assert.Greater(t, duplicate.Waited, shipper.Waited, "the second instance waited for the lock")
	assert.NoError(t, shipper.Err)
	assert.NoError(t, duplicate.Err)
	assert.False(t, shipper.Degraded || duplicate.Degraded, "Redis answers: no degraded run")

	assert.Equal(t, "shipped", res.Status)
	assert.Equal(t, shipper.Fence, res.Fence)
	assert.Equal(t, []Shipment{{OrderID: orderID, ShippedBy: shipper.Instance, Fence: shipper.Fence}}, res.Shipments,
		"shipped once")
}

// TestStoryRedisDown runs the story with REDIS_ADDR pointing at a port where
// nothing listens: both instances fail open and run degraded, without a lock
// or a fence, and the conditional update and the shipments table's key still
// ship the order once.
func TestStoryRedisDown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		database func(t testing.TB) string
	}{
		{name: "sqlite"},
		{name: "postgres", database: demotest.RealPostgres},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{RedisAddr: closedAddr(t), Out: demotest.Output(t)}
			if tt.database != nil {
				cfg.DatabaseURL = tt.database(t)
			}
			begin := time.Now()
			res, err := run(t.Context(), cfg)
			elapsed := time.Since(begin)
			require.NoError(t, err)
			require.Len(t, res.Handlings, 2)
			shipped := 0
			for _, h := range res.Handlings {
				assert.True(t, h.Degraded, "%s ran degraded", h.Instance)
				assert.Zero(t, h.Fence, "%s: a degraded lease has no fence", h.Instance)
				assert.NoError(t, h.Err, "%s: the duplicate is acknowledged, not failed", h.Instance)
				if h.Shipped {
					shipped++
				}
			}
			assert.Equal(t, 1, shipped, "exactly one instance ships: %+v", res.Handlings)
			assert.Equal(t, "shipped", res.Status)
			require.Len(t, res.Shipments, 1, "shipped once")
			assert.Zero(t, res.Shipments[0].Fence, "a degraded shipment is recorded without a fence")
			// The instances wait out their WithWait(5s) retrying Redis,
			// then run: well within the story's 30s timeout.
			assert.Less(t, elapsed, 15*time.Second)
		})
	}
}

// closedAddr returns a loopback address where nothing listens: a port bound
// by a socket that does not listen, until the test ends, so that
// connections to it are refused and no other test's server can take the
// port meanwhile (as the root package's closedAddr does).
func closedAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// TestShipIsConditional checks the write on its own: it ships a paid order
// once, and never with a fence older than one the guard recorded for the
// order.
func TestShipIsConditional(t *testing.T) {
	ctx := t.Context()
	db, err := demo.OpenDB(ctx, "")
	require.NoError(t, err)
	defer db.Close()
	q := newQueries(db, "test")
	require.NoError(t, q.createTables(ctx, db))
	for _, id := range []int64{1, 2} {
		_, err := db.ExecContext(ctx, q.insertOrder, id)
		require.NoError(t, err)
	}
	// A holder of order 2's lock with fence 50 wrote it: the guard recorded 50.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, q.guard.Advance(ctx, tx, "order:2", 50))
	require.NoError(t, tx.Commit())

	tests := []struct {
		id    int64
		fence int64
		want  bool
	}{
		{id: 1, fence: 10, want: true},  // paid: ships
		{id: 1, fence: 20, want: false}, // shipped already, even with a newer fence
		{id: 2, fence: 40, want: false}, // paid, but the fence is older than the order's
		{id: 2, fence: 60, want: true},
	}
	for _, tt := range tests {
		got, err := ship(ctx, db, q, tt.id, "test", tt.fence)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "ship order %d with fence %d", tt.id, tt.fence)
	}
	shipments, err := q.allShipments(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, []Shipment{{1, "test", 10}, {2, "test", 60}}, shipments)
}

// TestShipDegraded checks the degraded write on its own: without a fence
// (0: the guard is skipped) it still ships a paid order once, guarded by
// the order's status and the shipments key.
func TestShipDegraded(t *testing.T) {
	ctx := t.Context()
	db, err := demo.OpenDB(ctx, "")
	require.NoError(t, err)
	defer db.Close()
	q := newQueries(db, "test")
	require.NoError(t, q.createTables(ctx, db))
	for _, id := range []int64{1, 2, 3} {
		_, err := db.ExecContext(ctx, q.insertOrder, id)
		require.NoError(t, err)
	}
	// Order 3 is paid but has a shipment: only the key guards it.
	_, err = db.ExecContext(ctx, "INSERT INTO shipments_test VALUES (3, 'other', 7)")
	require.NoError(t, err)

	tests := []struct {
		id   int64
		want bool
	}{
		{id: 1, want: true},  // paid: ships
		{id: 1, want: false}, // shipped already
		{id: 3, want: false}, // a shipment exists: nothing written
	}
	for _, tt := range tests {
		got, err := ship(ctx, db, q, tt.id, "degraded", 0)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, "ship order %d degraded", tt.id)
	}
	// A fenced write after a degraded one finds the order shipped.
	got, err := ship(ctx, db, q, 1, "test", 10)
	require.NoError(t, err)
	assert.False(t, got)

	var status string
	require.NoError(t, db.QueryRowContext(ctx, q.selectStatus, 3).Scan(&status))
	assert.Equal(t, "paid", status, "the update is rolled back with the insert")
	shipments, err := q.allShipments(ctx, db)
	require.NoError(t, err)
	assert.Equal(t, []Shipment{{1, "degraded", 0}, {3, "other", 7}}, shipments)
	var fences int
	require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM fences_test WHERE fence = 0").Scan(&fences))
	assert.Zero(t, fences, "a degraded run records no fence")
}

// TestCommand runs the command as `go run ./examples/orders` does.
func TestCommand(t *testing.T) {
	out := demotest.RunCommand(t)
	assert.Equal(t, 2, strings.Count(out, "payment completed for order 42"))
	assert.Equal(t, 1, strings.Count(out, "is paid: picking and packing"))
	assert.Equal(t, 1, strings.Count(out, "shipped, shipment recorded"))
	assert.Equal(t, 1, strings.Count(out, "is already shipped: acknowledge the duplicate notification"))
	assert.Contains(t, out, "shipped once, by instance-")
}

// TestCommandRedisDown runs the command with REDIS_ADDR pointing at a port
// where nothing listens: it ships the order once, degraded, and exits 0.
func TestCommandRedisDown(t *testing.T) {
	t.Parallel()
	out := demotest.RunCommand(t, "REDIS_ADDR="+closedAddr(t))
	assert.Equal(t, 2, strings.Count(out, "running without the lock (fail-open)"), "the cause, logged")
	assert.Equal(t, 2, strings.Count(out, "running degraded, without the lock and without a fence"))
	assert.Equal(t, 1, strings.Count(out, "shipped, shipment recorded without a fence"))
	assert.Equal(t, 1, strings.Count(out, "acknowledge the duplicate notification"))
	assert.Contains(t, out, "shipped once, by instance-")
	assert.Contains(t, out, "redis still does not answer: no clean-up of its keys")
}

// TestCommandBadInput checks that bad configuration ends the command with a
// clear message and exit code 1.
func TestCommandBadInput(t *testing.T) {
	tests := []struct{ env, want string }{
		{"REDIS_ADDR=localhost", `REDIS_ADDR "localhost": want host:port or a redis:// URL`},
		{"DATABASE_URL=sqlite:///tmp/x.db", "DATABASE_URL must be a postgres:// or postgresql:// URL"},
		{"DATABASE_URL=postgres://postgres:secret@127.0.0.1:1/test", "postgresql does not answer"},
	}
	for _, tt := range tests {
		t.Run(tt.env, func(t *testing.T) {
			demotest.BadInput(t, "orders", tt.env, tt.want)
		})
	}
}
