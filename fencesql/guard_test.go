package fencesql_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fencelock/fencesql"
)

func TestNewGuardTableName(t *testing.T) {
	for _, table := range []string{"fences", "_x", "Fence_1", strings.Repeat("a", 48)} {
		if _, err := fencesql.NewGuard(fencesql.Postgres, table); err != nil {
			t.Errorf("NewGuard(%q): %v", table, err)
		}
	}
	for _, table := range []string{
		"", "1fences", "a-b", "a b", "a.b", "public.fences", `a"b`, "a`b", "a;DROP TABLE x", "fénces",
		strings.Repeat("a", 49), "a\x00",
	} {
		g, err := fencesql.NewGuard(fencesql.Postgres, table)
		if !errors.Is(err, fencesql.ErrInvalid) || g != nil {
			t.Errorf("NewGuard(%q) = %v, %v; want nil, ErrInvalid", table, g, err)
		}
	}
	for _, d := range []fencesql.Dialect{0, 4, -1} {
		if _, err := fencesql.NewGuard(d, "fences"); !errors.Is(err, fencesql.ErrInvalid) {
			t.Errorf("NewGuard(%v): %v, want ErrInvalid", d, err)
		}
	}
}

// TestBadInputSendsNoSQL: every refused argument is refused before a
// statement reaches the database.
func TestBadInputSendsNoSQL(t *testing.T) {
	d := sqliteDB(t)
	g, _ := newGuard(t, d)
	x := &countingExecer{x: d.db}
	ctx := t.Context()
	long := strings.Repeat("r", 256)
	for _, tt := range []struct {
		name string
		err  error
		want error
	}{
		{"advance empty resource", g.Advance(ctx, x, "", 1), fencesql.ErrInvalid},
		{"advance long resource", g.Advance(ctx, x, long, 1), fencesql.ErrInvalid},
		{"advance non-UTF-8 resource", g.Advance(ctx, x, "r\xff", 1), fencesql.ErrInvalid},
		{"advance resource with NUL", g.Advance(ctx, x, "r\x00", 1), fencesql.ErrInvalid},
		{"advance fence 0", g.Advance(ctx, x, "r", 0), fencesql.ErrNoFence},
		{"advance negative fence", g.Advance(ctx, x, "r", -3), fencesql.ErrInvalid},
		{"once empty key", g.Once(ctx, x, ""), fencesql.ErrInvalid},
		{"once long key", g.Once(ctx, x, long), fencesql.ErrInvalid},
		{"once non-UTF-8 key", g.Once(ctx, x, "\xc3"), fencesql.ErrInvalid},
		{"prune 0", prune(g, x, 0), fencesql.ErrInvalid},
		{"prune -1h", prune(g, x, -time.Hour), fencesql.ErrInvalid},
		{"prune 999ns", prune(g, x, 999), fencesql.ErrInvalid},
	} {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, tt.err, tt.want)
		}
	}
	if errors.Is(g.Advance(ctx, x, "r", 0), fencesql.ErrInvalid) {
		t.Error("fence 0 matches ErrInvalid: a degraded lease is not a caller's mistake")
	}
	if n := x.n.Load(); n != 0 {
		t.Errorf("%d statements sent for bad input, want 0", n)
	}
	// The longest valid values go through.
	if err := g.Advance(ctx, x, long[:255], 1); err != nil {
		t.Error(err)
	}
	if err := g.Once(ctx, x, long[:255]); err != nil {
		t.Error(err)
	}
	if n := x.n.Load(); n != 2 {
		t.Errorf("%d statements sent for 2 valid calls", n)
	}
}

func prune(g *fencesql.Guard, x fencesql.Execer, d time.Duration) error {
	_, err := g.Prune(context.Background(), x, d)
	return err
}

// TestAdvanceSequence: a fence is recorded if it is greater than or equal
// to the one recorded; a smaller one is refused with both named. The calls
// share one connection, so that nothing one statement leaves on it (MySQL's
// LAST_INSERT_ID) can pass for the next one's answer.
func TestAdvanceSequence(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		advanceSequence(t, d)
	})
}

func advanceSequence(t *testing.T, d database) {
	g, table := newGuard(t, d)
	ctx := t.Context()
	conn, err := d.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	steps := []struct {
		resource string
		fence    int64
		recorded int64 // the refusing fence; 0: accepted
	}{
		{"a", 7, 0},                          // new resource
		{"a", 7, 0},                          // the same lease writing again
		{"b", 3, 0},                          // new, after an equal fence on the same connection
		{"a", 6, 7},                          // stale
		{"b", 3, 0},                          // equal, after a stale answer
		{"a", 9, 0},                          // newer
		{"a", 8, 9},                          // stale
		{"c", 1, 0},                          // new, after a stale answer
		{"A", 2, 0},                          // resources are compared exactly: not "a"
		{"a ", 2, 0},                         // nor "a" with a space
		{"b", 2, 3},                          // stale
		{`o'brien"; DROP TABLE x; --`, 4, 0}, // a bound parameter, as written
		{"a", 1e15, 0},                       // large
	}
	for _, s := range steps {
		err := g.Advance(ctx, conn, s.resource, s.fence)
		if s.recorded == 0 {
			if err != nil {
				t.Fatalf("Advance(%q, %d): %v, want nil", s.resource, s.fence, err)
			}
			continue
		}
		var stale *fencesql.StaleError
		if !errors.As(err, &stale) || !errors.Is(err, fencesql.ErrStale) {
			t.Fatalf("Advance(%q, %d): %v, want a StaleError", s.resource, s.fence, err)
		}
		want := fencesql.StaleError{Resource: s.resource, Fence: s.fence, Recorded: s.recorded}
		if *stale != want {
			t.Errorf("Advance(%q, %d): %+v, want %+v", s.resource, s.fence, *stale, want)
		}
	}
	for r, want := range map[string]int64{"a": 1e15, "b": 3, "c": 1, "A": 2, "a ": 2, `o'brien"; DROP TABLE x; --`: 4} {
		if got := d.recordedFence(t, table, r); got != want {
			t.Errorf("recorded fence of %q: %d, want %d", r, got, want)
		}
	}
}

// TestAdvanceMySQLFoundRows: the MySQL dialect tells an equal fence from a
// stale one whether the driver counts rows found (clientFoundRows=true) or
// rows changed (the default).
func TestAdvanceMySQLFoundRows(t *testing.T) {
	d := openReal(t, "mariadb", fencesql.MySQL, "mysql", mysqlDSN+"?clientFoundRows=true", "FENCELOCK_REQUIRE_MYSQL")
	advanceSequence(t, d)
	g, _ := newGuard(t, d)
	onceSequence(t, d, g)
}

// TestStaleErrorUnnamed: through an Execer that cannot query, the
// StaleError still matches ErrStale; MySQL names the recorded fence anyway.
func TestStaleErrorUnnamed(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, _ := newGuard(t, d)
		x := &countingExecer{x: d.db}
		if err := g.Advance(t.Context(), x, "r", 10); err != nil {
			t.Fatal(err)
		}
		err := g.Advance(t.Context(), x, "r", 4)
		var stale *fencesql.StaleError
		if !errors.As(err, &stale) {
			t.Fatalf("%v, want a StaleError", err)
		}
		want := int64(0)
		if d.dialect == fencesql.MySQL {
			want = 10
		}
		if stale.Recorded != want {
			t.Errorf("Recorded %d, want %d", stale.Recorded, want)
		}
		if !strings.Contains(err.Error(), "4") {
			t.Errorf("%q does not name this holder's fence", err)
		}
		if x.n.Load() != 2 {
			t.Errorf("%d statements, want one per Advance", x.n.Load())
		}
	})
}

func TestStaleErrorText(t *testing.T) {
	for _, tt := range []struct {
		err  fencesql.StaleError
		want string
	}{
		{fencesql.StaleError{Resource: "settlement:2026-11-30", Fence: 9, Recorded: 12},
			`fencesql: stale fence: "settlement:2026-11-30" has fence 12 recorded, newer than this holder's 9`},
		{fencesql.StaleError{Resource: "r", Fence: 9},
			`fencesql: stale fence: "r" has a fence newer than this holder's 9 recorded`},
	} {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%q, want %q", got, tt.want)
		}
	}
}

// TestCreateTableIdempotent: CreateTable again, and from 8 goroutines at
// once on tables that do not exist yet, succeeds, and keeps what is
// recorded.
func TestCreateTableIdempotent(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		g, table := newGuard(t, d)
		if err := g.Advance(t.Context(), d.db, "r", 5); err != nil {
			t.Fatal(err)
		}
		if err := g.CreateTable(t.Context(), d.db); err != nil {
			t.Fatal(err)
		}
		if got := d.recordedFence(t, table, "r"); got != 5 {
			t.Errorf("recorded fence %d after a second CreateTable, want 5", got)
		}

		table2 := tableName(t)
		g2, err := fencesql.NewGuard(d.dialect, table2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, tb := range []string{table2, table2 + "_keys"} {
				_, _ = d.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb)
			}
		})
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = g2.CreateTable(t.Context(), d.db) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Errorf("concurrent CreateTable: %v", err)
		}
		if err := g2.Advance(t.Context(), d.db, "r", 1); err != nil {
			t.Error(err)
		}
	})
}

// TestAdvanceTableNamedExcluded: a guard table may be named excluded,
// which SQLite would otherwise take for the upsert's row in the table's
// place (every stale fence accepted).
func TestAdvanceTableNamedExcluded(t *testing.T) {
	eachDatabase(t, func(t *testing.T, d database) {
		ctx := t.Context()
		g, err := fencesql.NewGuard(d.dialect, "excluded")
		if err != nil {
			t.Fatal(err)
		}
		drop := func() {
			for _, tb := range []string{"excluded", "excluded_keys"} {
				if _, err := d.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+tb); err != nil {
					t.Errorf("drop %s: %v", tb, err)
				}
			}
		}
		drop()
		t.Cleanup(drop)
		if err := g.CreateTable(ctx, d.db); err != nil {
			t.Fatal(err)
		}
		for _, s := range []struct {
			fence int64
			stale bool
		}{{5, false}, {3, true}, {5, false}, {6, false}, {4, true}} {
			err := g.Advance(ctx, d.db, "r", s.fence)
			if errors.Is(err, fencesql.ErrStale) != s.stale || (err != nil && !s.stale) {
				t.Errorf("Advance(r, %d): %v, want stale %v", s.fence, err, s.stale)
			}
		}
		if got := d.recordedFence(t, "excluded", "r"); got != 6 {
			t.Errorf("recorded fence %d, want 6", got)
		}
	})
}
