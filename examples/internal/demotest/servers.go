package demotest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// A Setup is one combination of embedded and real servers that a test runs
// a story on.
type Setup struct {
	Name            string
	Redis, Database func(t testing.TB) string // RealRedis, RealPostgres; nil: the embedded one
}

// The setups.
var (
	Embedded             = Setup{Name: "embedded"}
	WithRedis            = Setup{Name: "real redis", Redis: RealRedis}
	WithPostgres         = Setup{Name: "postgres", Database: RealPostgres}
	WithRedisAndPostgres = Setup{Name: "real redis and postgres", Redis: RealRedis, Database: RealPostgres}
)

// Run runs f as a subtest of t on each of setups, with the REDIS_ADDR and
// DATABASE_URL of its servers: empty for the embedded ones. A setup whose
// real server does not answer is skipped, as RealRedis and RealPostgres say.
func Run(t *testing.T, setups []Setup, f func(t *testing.T, redisAddr, databaseURL string)) {
	for _, s := range setups {
		t.Run(s.Name, func(t *testing.T) {
			var redisAddr, databaseURL string
			if s.Redis != nil {
				redisAddr = s.Redis(t)
			}
			if s.Database != nil {
				databaseURL = s.Database(t)
			}
			f(t, redisAddr, databaseURL)
		})
	}
}

// KeysGone checks that none of keys is left in the Redis at addr, a real
// one; with addr empty, the embedded Redis is gone with them, and it checks
// nothing.
func KeysGone(t *testing.T, addr string, keys []string) {
	t.Helper()
	if addr == "" {
		return
	}
	require.NotEmpty(t, keys)
	c, err := demo.NewRedisClient(t.Context(), addr)
	require.NoError(t, err)
	defer c.Close()
	n, err := c.Exists(t.Context(), keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "keys left behind of %v", keys)
}

// TablesGone checks that none of tables is left in the PostgreSQL at url;
// with url empty, the embedded SQLite file is gone with them, and it checks
// nothing.
func TablesGone(t *testing.T, url string, tables ...string) {
	t.Helper()
	if url == "" {
		return
	}
	require.NotEmpty(t, tables)
	db, err := demo.Connect(t.Context(), "pgx", url)
	require.NoError(t, err)
	defer db.Close()
	for _, table := range tables {
		var found bool
		require.NoError(t, db.QueryRowContext(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&found))
		assert.False(t, found, "table %s left behind", table)
	}
}
