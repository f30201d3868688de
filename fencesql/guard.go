package fencesql

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"unicode/utf8"
)

// An Execer runs a statement: *sql.DB, *sql.Tx and *sql.Conn are Execers,
// and so is a small adapter over pgx (see the package example).
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

var (
	_ Execer = (*sql.DB)(nil)
	_ Execer = (*sql.Tx)(nil)
	_ Execer = (*sql.Conn)(nil)
)

// rowQueryer is what Advance also uses, when an Execer has it, to name the
// recorded fence in a StaleError: *sql.DB, *sql.Tx and *sql.Conn.
type rowQueryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// maxTable is the longest table name NewGuard takes, so that the names
// derived from it (table+"_keys_created") fit every dialect's limit.
const maxTable = 48

// maxValue is the longest resource or key, in bytes: MySQL's column is
// VARBINARY(255), and no dialect truncates a value silently.
const maxValue = 255

// A Guard records fences and idempotency keys in two tables, table and
// table+"_keys", with statements built once by NewGuard. It is safe for
// concurrent use, and holds no connection: each call runs on the Execer it
// is given.
type Guard struct {
	dialect Dialect
	table   string
	sql     statements
}

// NewGuard returns a Guard for the tables table and table+"_keys" in
// dialect d. table must be a plain identifier of at most 48
// characters (letters, digits and underscores, not starting with a digit);
// it is quoted in the SQL, so it keeps its case. Otherwise the error
// matches ErrInvalid.
func NewGuard(d Dialect, table string) (*Guard, error) {
	if d != Postgres && d != SQLite && d != MySQL {
		return nil, fmt.Errorf("%w: unknown dialect %v", ErrInvalid, d)
	}
	if !isIdentifier(table) {
		return nil, fmt.Errorf("%w: table %q is not a plain identifier of at most %d characters", ErrInvalid, table, maxTable)
	}
	return &Guard{dialect: d, table: table, sql: d.statements(table)}, nil
}

func isIdentifier(s string) bool {
	if s == "" || len(s) > maxTable || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// CreateTable creates the Guard's two tables and the keys' index, those
// that do not exist yet; it is idempotent. Run it outside a transaction
// (MySQL commits around DDL). Each statement is tried a second time if it
// fails, for the race of concurrent first calls on PostgreSQL; after a
// failure some of the tables may exist.
func (g *Guard) CreateTable(ctx context.Context, x Execer) error {
	for _, stmt := range g.sql.create {
		if _, err := x.ExecContext(ctx, stmt); err != nil {
			if _, err := x.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("fencesql: create %s: %w", g.table, err)
			}
		}
	}
	return nil
}

// checkValue checks a resource or key before any SQL is sent.
func checkValue(what, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: empty %s", ErrInvalid, what)
	case len(v) > maxValue:
		return fmt.Errorf("%w: %s of %d bytes, more than %d", ErrInvalid, what, len(v), maxValue)
	case !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s %q is not UTF-8 text without NUL", ErrInvalid, what, v)
	}
	return nil
}
