package demo

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	_ "modernc.org/sqlite"             // registers the "sqlite" driver (pure Go, no cgo)

	"github.com/fencelock/fencelock/fencesql"
)

// DB is the SQL database an example keeps its tables in: an embedded SQLite
// file, or the PostgreSQL that DATABASE_URL names.
type DB struct {
	*sql.DB

	// Driver and DSN open the same database again, also from a child
	// process: see Connect.
	Driver string
	DSN    string
	// Desc describes the database for the timeline, without credentials.
	Desc string

	dir string // temporary directory of the embedded SQLite file, removed by Close
}

// OpenDB opens the PostgreSQL that databaseURL (DATABASE_URL) names, or
// creates an SQLite file in a new temporary directory when it is empty.
// Close closes it and removes that directory.
func OpenDB(ctx context.Context, databaseURL string) (*DB, error) {
	if databaseURL != "" {
		if !strings.HasPrefix(databaseURL, "postgres://") && !strings.HasPrefix(databaseURL, "postgresql://") {
			return nil, fmt.Errorf("DATABASE_URL must be a postgres:// or postgresql:// URL; unset it to use the embedded SQLite")
		}
		// pgx masks the password in its parse errors.
		if _, err := pgx.ParseConfig(databaseURL); err != nil {
			return nil, fmt.Errorf("DATABASE_URL: %w", err)
		}
		db, err := Connect(ctx, "pgx", databaseURL)
		if err != nil {
			return nil, err
		}
		var host, name string
		if err := db.QueryRowContext(ctx, "SELECT COALESCE(inet_server_addr()::text, 'local socket'), current_database()").Scan(&host, &name); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("postgresql: %w", err)
		}
		db.Desc = fmt.Sprintf("PostgreSQL database %s at %s (DATABASE_URL)", name, host)
		return db, nil
	}

	dir, err := os.MkdirTemp("", "fencelock-example-")
	if err != nil {
		return nil, fmt.Errorf("embedded sqlite: %w", err)
	}
	path := filepath.Join(dir, "example.db")
	// Several processes share the file. WAL lets readers and the writer
	// proceed together; busy_timeout makes a writer wait for the write lock
	// instead of failing with SQLITE_BUSY; BEGIN IMMEDIATE takes that lock at
	// the start of a transaction, so two transactions never deadlock
	// upgrading from read to write.
	dsn := path + "?_journal_mode=WAL&_busy_timeout=5000&_txlock=immediate"
	db, err := Connect(ctx, "sqlite", dsn)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	db.Desc = "embedded SQLite " + path
	db.dir = dir
	return db, nil
}

// Connect opens the database driver and dsn name and checks that it answers.
// The examples' child processes use it with the Driver and DSN of the DB
// their parent opened.
func Connect(ctx context.Context, driver, dsn string) (*DB, error) {
	name := map[string]string{"pgx": "postgresql", "sqlite": "sqlite"}[driver]
	if name == "" {
		return nil, fmt.Errorf("unknown database driver %q", driver)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("%s does not answer: %w", name, err)
	}
	return &DB{DB: db, Driver: driver, DSN: dsn, Desc: name}, nil
}

// Close closes the database and removes the embedded SQLite file.
func (db *DB) Close() error {
	err := db.DB.Close()
	if db.dir != "" {
		if rerr := os.RemoveAll(db.dir); err == nil {
			err = rerr
		}
	}
	return err
}

// Dialect returns the fencesql dialect of the database: Postgres or SQLite.
func (db *DB) Dialect() fencesql.Dialect {
	if db.Driver == "pgx" {
		return fencesql.Postgres
	}
	return fencesql.SQLite
}

// NewGuard returns a fencesql Guard in the run's table (with its keys
// table, table+"_keys"), created. Drop both at the end with DropTables.
func (db *DB) NewGuard(ctx context.Context, table string) (*fencesql.Guard, error) {
	g, err := fencesql.NewGuard(db.Dialect(), table)
	if err != nil {
		return nil, err
	}
	if err := g.CreateTable(ctx, db); err != nil {
		return nil, err
	}
	return g, nil
}

// Rebind rewrites the ? placeholders of query into the $1, $2, ... that
// PostgreSQL expects; SQLite takes ? as written. A ? inside a quoted string
// or identifier is left alone. The examples write every statement with ?
// and rebind it once, when they build their queries.
func (db *DB) Rebind(query string) string {
	if db.Driver != "pgx" {
		return query
	}
	var b strings.Builder
	n := 0
	var quote rune // the quote character we are inside of, or 0
	for _, r := range query {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '?':
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// DropTables drops tables on a context that outlives ctx's cancellation, so
// that an interrupted run against a shared PostgreSQL still removes them.
func (db *DB) DropTables(ctx context.Context, tables ...string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, t := range tables {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			return fmt.Errorf("drop table %s: %w", t, err)
		}
	}
	return nil
}
