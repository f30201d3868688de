package fencesql

import (
	"database/sql"
	"fmt"
)

// A Dialect is the SQL a Guard speaks: the placeholders, the upsert and the
// database clock differ between databases.
type Dialect int

// The dialects. The zero Dialect is none of them, and NewGuard rejects it.
const (
	// Postgres is PostgreSQL 9.5 or later (INSERT ... ON CONFLICT), through
	// database/sql (pgx's stdlib, lib/pq) or pgx's native API through an
	// adapter; placeholders $1, $2.
	Postgres Dialect = iota + 1
	// SQLite is SQLite 3.24 or later (upsert); placeholders ?.
	SQLite
	// MySQL is MySQL and MariaDB with InnoDB tables; placeholders ?. The
	// driver must report LastInsertId (go-sql-driver/mysql does), with or
	// without its clientFoundRows option. Advance and Once report through
	// LAST_INSERT_ID(expr), so they set the session's LAST_INSERT_ID():
	// read an insert's id before calling them, or use the driver's
	// LastInsertId of that insert.
	MySQL
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "Postgres"
	case SQLite:
		return "SQLite"
	case MySQL:
		return "MySQL"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// statements are a Guard's SQL, built once by NewGuard. Values are always
// bound parameters; only the validated table name is spliced in.
type statements struct {
	create  []string // CreateTable's, in order
	advance string   // $1 resource, $2 fence
	read    string   // $1 resource; returns the recorded fence
	once    string   // $1 key
	prune   string   // $1 age in microseconds; deletes older keys
}

// statements returns the SQL for table, a valid identifier, and its keys
// table, table+"_keys".
func (d Dialect) statements(table string) statements {
	keys := table + "_keys"
	switch d {
	case Postgres:
		t, k := `"`+table+`"`, `"`+keys+`"`
		// The statement's start, in microseconds since the epoch: now()
		// would be the transaction's, and a key recorded late in a long
		// transaction would be pruned early by that much.
		now := `(extract(epoch FROM statement_timestamp()) * 1000000)::bigint`
		return statements{
			create: []string{
				`CREATE TABLE IF NOT EXISTS ` + t + ` (resource TEXT PRIMARY KEY, fence BIGINT NOT NULL)`,
				`CREATE TABLE IF NOT EXISTS ` + k + ` (idem_key TEXT PRIMARY KEY, created_us BIGINT NOT NULL)`,
				`CREATE INDEX IF NOT EXISTS "` + keys + `_created" ON ` + k + ` (created_us)`,
			},
			// ON CONFLICT DO UPDATE locks the row even when its WHERE is
			// false: a competing holder waits for this transaction's end,
			// then compares with what it committed. 0 rows: stale.
			advance: `INSERT INTO ` + t + ` AS g (resource, fence) VALUES ($1, $2) ` +
				`ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence WHERE g.fence <= EXCLUDED.fence`,
			read:  `SELECT fence FROM ` + t + ` WHERE resource = $1`,
			once:  `INSERT INTO ` + k + ` (idem_key, created_us) VALUES ($1, ` + now + `) ON CONFLICT (idem_key) DO NOTHING`,
			prune: `DELETE FROM ` + k + ` WHERE created_us < ` + now + ` - $1`,
		}
	case SQLite:
		t, k := `"`+table+`"`, `"`+keys+`"`
		// julianday works on every SQLite with upsert (unixepoch needs
		// 3.38); its resolution is tens of microseconds.
		now := `CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)`
		return statements{
			create: []string{
				`CREATE TABLE IF NOT EXISTS ` + t + ` (resource TEXT NOT NULL PRIMARY KEY, fence INTEGER NOT NULL)`,
				`CREATE TABLE IF NOT EXISTS ` + k + ` (idem_key TEXT NOT NULL PRIMARY KEY, created_us INTEGER NOT NULL)`,
				`CREATE INDEX IF NOT EXISTS "` + keys + `_created" ON ` + k + ` (created_us)`,
			},
			// A writer holds the database's write lock until it ends, so
			// competing holders serialise on the whole database. 0 rows:
			// stale. The alias keeps excluded the upsert's row even in a
			// table named excluded (SQLite resolves a table name first).
			advance: `INSERT INTO ` + t + ` AS g (resource, fence) VALUES (?, ?) ` +
				`ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence WHERE g.fence <= excluded.fence`,
			read:  `SELECT fence FROM ` + t + ` WHERE resource = ?`,
			once:  `INSERT INTO ` + k + ` (idem_key, created_us) VALUES (?, ` + now + `) ON CONFLICT (idem_key) DO NOTHING`,
			prune: `DELETE FROM ` + k + ` WHERE created_us < ` + now + ` - ?`,
		}
	case MySQL:
		t, k := "`"+table+"`", "`"+keys+"`"
		// UTC on both sides: independent of the session's time zone.
		now := `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`
		return statements{
			// VARBINARY: compared byte for byte, where the default
			// collations ignore case and trailing spaces.
			create: []string{
				"CREATE TABLE IF NOT EXISTS " + t + " (resource VARBINARY(255) NOT NULL PRIMARY KEY, fence BIGINT NOT NULL) ENGINE=InnoDB",
				"CREATE TABLE IF NOT EXISTS " + k + " (idem_key VARBINARY(255) NOT NULL PRIMARY KEY, created_us BIGINT NOT NULL, " +
					"INDEX `" + keys + "_created` (created_us)) ENGINE=InnoDB",
			},
			// The affected-rows count cannot tell an equal fence from a
			// stale one (0 or 1 for both, by clientFoundRows), so the
			// statement reports the fence recorded after it through
			// LAST_INSERT_ID(expr), which the server returns as the
			// statement's insert id: 0 for an insert (no AUTO_INCREMENT
			// column), otherwise the greater of the two fences. The update
			// locks the row: a competing holder waits for this
			// transaction's end.
			advance: "INSERT INTO " + t + " (resource, fence) VALUES (?, ?) " +
				"ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence, VALUES(fence)))",
			read: "SELECT fence FROM " + t + " WHERE resource = ?",
			// The same way: insert id 0 for a new key, 1 for a duplicate,
			// whose row is left as it was (whatever its time: a time of 0
			// as the insert id would read as a new key).
			once: "INSERT INTO " + k + " (idem_key, created_us) VALUES (?, " + now + ") " +
				"ON DUPLICATE KEY UPDATE created_us = IF(LAST_INSERT_ID(1), created_us, created_us)",
			prune: "DELETE FROM " + k + " WHERE created_us < " + now + " - ?",
		}
	}
	panic("fencesql: unknown dialect " + d.String()) // NewGuard checks d first
}

// advanced decodes the result of the advance statement for fence: whether
// it was recorded, and if not the greater fence recorded (0 if unknown).
func (d Dialect) advanced(res sql.Result, fence int64) (ok bool, recorded int64, err error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, 0, err
	}
	if d != MySQL {
		switch n {
		case 1:
			return true, 0, nil
		case 0:
			return false, 0, nil
		}
		return false, 0, fmt.Errorf("%d rows affected, want 0 or 1", n)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, 0, err
	}
	switch {
	case id == 0 && n == 1: // inserted
		return true, 0, nil
	case id == fence:
		return true, 0, nil
	case id > fence:
		return false, id, nil
	}
	return false, 0, fmt.Errorf("insert id %d with %d rows affected, want 0 or the recorded fence (is LastInsertId supported?)", id, n)
}

// inserted decodes the result of the once statement: whether the key was
// new.
func (d Dialect) inserted(res sql.Result) (bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if d != MySQL {
		switch n {
		case 1:
			return true, nil
		case 0:
			return false, nil
		}
		return false, fmt.Errorf("%d rows affected, want 0 or 1", n)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, err
	}
	switch {
	case id == 0 && n == 1:
		return true, nil
	case id > 0:
		return false, nil
	}
	return false, fmt.Errorf("insert id %d with %d rows affected, want 0 for a new key or 1 for a recorded one (is LastInsertId supported?)", id, n)
}
