package fencesql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/fencelock/fencelock/fencesql"
)

// The real databases the tests use besides an SQLite file: the local
// PostgreSQL and MariaDB, database test. Each is skipped when it does not
// answer, unless FENCELOCK_REQUIRE_POSTGRES=1 or FENCELOCK_REQUIRE_MYSQL=1
// (CI sets both) turns the skip into a failure.
const (
	postgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	mysqlDSN    = "root@tcp(127.0.0.1:3306)/test"
)

// database is one database a test runs against.
type database struct {
	name    string
	dialect fencesql.Dialect
	driver  string
	dsn     string
	db      *sql.DB
}

// eachDatabase runs f in a subtest per database, skipping (or failing) the
// ones that do not answer.
func eachDatabase(t *testing.T, f func(t *testing.T, d database)) {
	t.Helper()
	for _, name := range []string{"sqlite", "postgres", "mariadb"} {
		t.Run(name, func(t *testing.T) {
			var d database
			switch name {
			case "sqlite":
				d = sqliteDB(t)
			case "postgres":
				d = openReal(t, "postgres", fencesql.Postgres, "pgx", postgresDSN, "FENCELOCK_REQUIRE_POSTGRES")
			case "mariadb":
				d = openReal(t, "mariadb", fencesql.MySQL, "mysql", mysqlDSN, "FENCELOCK_REQUIRE_MYSQL")
			}
			f(t, d)
		})
	}
}

// sqliteDB opens an SQLite file in a temporary directory. A writer waits
// up to 20s for another's write lock (busy_timeout); WAL lets readers go on
// meanwhile.
func sqliteDB(t *testing.T) database {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "test.db") + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(wal)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return database{name: "sqlite", dialect: fencesql.SQLite, driver: "sqlite", dsn: dsn, db: db}
}

func openReal(t *testing.T, name string, d fencesql.Dialect, driver, dsn, env string) database {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
	}
	if err != nil {
		if db != nil {
			_ = db.Close()
		}
		if os.Getenv(env) == "1" {
			t.Fatalf("%s not reachable at %s and %s=1: %v", name, dsn, env, err)
		}
		t.Skipf("%s not reachable at %s (%v); start it or set %s=1 to fail instead of skipping", name, dsn, err, env)
	}
	t.Cleanup(func() { _ = db.Close() })
	return database{name: name, dialect: d, driver: driver, dsn: dsn, db: db}
}

// tableName returns a table name no other test or run uses.
func tableName(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "fencesql_" + hex.EncodeToString(b)
}

// newGuard returns a Guard on fresh tables, created, and dropped when the
// test ends (with any tables named in extra).
func newGuard(t *testing.T, d database, extra ...string) (*fencesql.Guard, string) {
	t.Helper()
	table := tableName(t)
	g, err := fencesql.NewGuard(d.dialect, table)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.CreateTable(t.Context(), d.db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, tb := range append([]string{table, table + "_keys"}, extra...) {
			if _, err := d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+tb); err != nil {
				t.Errorf("drop %s: %v", tb, err)
			}
		}
	})
	return g, table
}

// q rewrites the ? placeholders of query into $1, $2, ... for PostgreSQL.
func (d database) q(query string) string {
	if d.dialect != fencesql.Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// recordedFence reads the guard table's fence for resource, 0 if none.
func (d database) recordedFence(t *testing.T, table, resource string) int64 {
	t.Helper()
	var f int64
	err := d.db.QueryRowContext(t.Context(), d.q("SELECT fence FROM "+table+" WHERE resource = ?"), resource).Scan(&f)
	if err != nil && err != sql.ErrNoRows {
		t.Fatal(err)
	}
	return f
}

// countingExecer counts the statements sent through it. It has no
// QueryRowContext, as an adapter over pgx would not.
type countingExecer struct {
	x fencesql.Execer
	n atomic.Int64
}

func (c *countingExecer) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.n.Add(1)
	return c.x.ExecContext(ctx, query, args...)
}
