package docscheck

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// postgresURL is the local PostgreSQL database the tests use.
const postgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// holderMain makes a program of the Quick start: one holder of the day's
// lock, in a process of its own. Its arguments are the Redis address, the
// database URL and the day. It connects, says "ready" on stdout, and runs
// the Quick start's code when it reads a line from stdin.
// computeSettlement says "computing" and returns the total it then reads
// from stdin, so that the test decides when each holder writes; the holder
// says "returned" and RunWithLock's error when the Quick start's code ends.
const holderMain = `package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/fencesql"
)

var (
	_ = errors.Is
	_ = fencelock.New
	_ = fencesql.NewGuard
)

var stdin = bufio.NewReader(os.Stdin)

func computeSettlement(ctx context.Context, day string) (int64, error) {
	fmt.Println("computing")
	line, err := stdin.ReadString('\n')
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(line), 10, 64)
}

func main() {
	redisClient := redis.NewClient(&redis.Options{Addr: os.Args[1]})
	defer redisClient.Close()
	db, err := sql.Open("pgx", os.Args[2])
	if err != nil {
		fmt.Println("returned", err)
		return
	}
	defer db.Close()
	ctx := context.Background()
	if err := redisClient.Ping(ctx).Err(); err != nil {
		fmt.Println("returned", err)
		return
	}
	if err := db.PingContext(ctx); err != nil {
		fmt.Println("returned", err)
		return
	}
	fmt.Println("ready")
	if _, err := stdin.ReadString('\n'); err != nil {
		fmt.Println("returned", err)
		return
	}
	fmt.Println("returned", quickStart(ctx, redisClient, db, os.Args[3]))
}

// quickStart is the Quick start's code. err is its result, so that the
// code's err = locker.RunWithLock(...) is what quickStart returns.
func quickStart(ctx context.Context, redisClient redis.UniversalClient, db *sql.DB, day string) (err error) {
%s
	return err
}
`

// TestQuickStartSettlesOnce runs README.md's Quick start as it stands (its
// Go block and its CREATE TABLE, extracted, not retyped) in two holders of
// the day's lock, two processes, with a forced release between them:
// holder A takes the lock and computes; the lock is deleted, as a forced
// release (`fencelock release --force`) deletes it; holder B takes it and
// computes too.
// Then each writes, in both orders. When A writes first, no newer fence is
// recorded yet, so the guard accepts it; B must then find the day settled.
// Either way the day is settled once: a trigger counts the updates that set
// the row done.
//
// A writes within the Quick start's renewal interval (10s, TTL/3 of the
// default options) after it took the lock: its watchdog notices the forced
// release only at its next renewal, and the old holder of a forced release
// in a real service writes in that time too. Both processes are started and
// connected before A takes the lock, so that the interval holds only the
// deletion, B's acquisition and A's transaction.
func TestQuickStartSettlesOnce(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	code, createSQL := quickStart(t, filepath.Join(root, "README.md"), root)
	dsn := realPostgres(t)
	srv := redistest.Start(t)
	bin := buildHolder(t, goTool, root, code)
	rdb := srv.Client(nil)

	for i, tc := range []struct {
		name       string
		staleFirst bool
	}{
		{"stale holder writes first", true},
		{"new holder writes first", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			day := fmt.Sprintf("2026-11-%02d", 10+i)
			stderr := &lockedWriter{w: t.Output()}
			q := newQuickStartDB(t, dsn, createSQL, day)
			a := startHolder(t, bin, "A", 100, srv.Addr, q.dsn, day, stderr)
			b := startHolder(t, bin, "B", 200, srv.Addr, q.dsn, day, stderr)
			a.await(t, "ready")
			b.await(t, "ready")
			a.send(t, "start")
			a.await(t, "computing")

			// The forced release: the lock is gone, A does not know it yet.
			n, err := rdb.Del(t.Context(), "lock:{settlement:"+day+"}").Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, n, "A's lock deleted")

			b.send(t, "start")
			b.await(t, "computing")

			first, second := b, a
			if tc.staleFirst {
				first, second = a, b
			}
			first.send(t, strconv.FormatInt(first.total, 10))
			t.Logf("%s (first): %s", first.name, first.await(t, "returned"))
			second.send(t, strconv.FormatInt(second.total, 10))
			t.Logf("%s (second): %s", second.name, second.await(t, "returned"))
			a.wait(t)
			b.wait(t)

			settled := q.settled(t)
			assert.Equal(t, []int64{first.total}, settled,
				"the totals of the updates that settled %s: the first writer's alone", day)
		})
	}
}

// quickStart returns the Go code of README.md's Quick start (its first Go
// block) with a //line directive, and its SQL (the CREATE TABLE block).
func quickStart(t *testing.T, readme, root string) (code, createSQL string) {
	t.Helper()
	all, err := blocks(readme, root)
	require.NoError(t, err)
	for _, b := range all {
		if b.section != "Quick start" {
			continue
		}
		switch {
		case b.lang == "go" && code == "":
			code = fmt.Sprintf("//line %s:%d\n%s", b.file, b.line, b.code)
		case b.lang == "sql" && strings.Contains(b.code, "CREATE TABLE settlements"):
			createSQL = b.code
		}
	}
	require.NotEmpty(t, code, "README.md's Quick start has no ```go block")
	require.NotEmpty(t, createSQL, "README.md's Quick start has no ```sql block creating settlements")
	return code, createSQL
}

// buildHolder builds holderMain around code into a binary in a temporary
// directory, through an overlay, so that nothing is written to the tree.
func buildHolder(t *testing.T, goTool, root, code string) string {
	t.Helper()
	tmp := t.TempDir()
	src := filepath.Join(tmp, "main.go")
	require.NoError(t, os.WriteFile(src, fmt.Appendf(nil, holderMain, code), 0o644))
	overlay, err := json.Marshal(map[string]any{"Replace": map[string]string{
		filepath.Join(root, "internal", "docscheck", "gen", "quickstart", "main.go"): src,
	}})
	require.NoError(t, err)
	overlayFile := filepath.Join(tmp, "overlay.json")
	require.NoError(t, os.WriteFile(overlayFile, overlay, 0o644))
	bin := filepath.Join(tmp, "holder")
	cmd := exec.Command(goTool, "build", "-overlay="+overlayFile, "-o", bin, "./internal/docscheck/gen/quickstart")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "README.md's Quick start does not build as a program:\n%s", out)
	return bin
}

// realPostgres returns postgresURL if the database answers there; otherwise
// it skips t, or fails it when FENCELOCK_REQUIRE_POSTGRES=1.
func realPostgres(t *testing.T) string {
	t.Helper()
	db, err := sql.Open("pgx", postgresURL)
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		_ = db.Close()
	}
	if err != nil {
		if os.Getenv("FENCELOCK_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("PostgreSQL not reachable and FENCELOCK_REQUIRE_POSTGRES=1: %v", err)
		}
		t.Skipf("PostgreSQL not reachable (%v); start it or set FENCELOCK_REQUIRE_POSTGRES=1 to fail instead of skipping", err)
	}
	return postgresURL
}

// quickStartDB is a schema of its own in the test database, holding the
// Quick start's tables (the names are the README's) and a log of the
// updates that settled a day.
type quickStartDB struct {
	db     *sql.DB
	schema string
	dsn    string // the database URL whose search_path is the schema
}

// newQuickStartDB creates the schema, runs createSQL (the README's CREATE
// TABLE) in it, adds the log's trigger, and inserts the day's row, pending.
// The schema is dropped when t ends.
func newQuickStartDB(t *testing.T, dsn, createSQL, day string) *quickStartDB {
	t.Helper()
	ctx := t.Context()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	q := &quickStartDB{db: db, schema: fmt.Sprintf("quickstart_%d_%d", os.Getpid(), time.Now().UnixNano())}
	q.dsn = dsn + "&search_path=" + q.schema
	_, err = db.ExecContext(ctx, `CREATE SCHEMA `+q.schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.ExecContext(context.WithoutCancel(ctx), `DROP SCHEMA `+q.schema+` CASCADE`)
		assert.NoError(t, err)
		assert.NoError(t, db.Close())
	})

	// One connection, on the schema, for the README's CREATE TABLE.
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	for _, stmt := range []string{
		`SET search_path TO ` + q.schema,
		createSQL,
		`CREATE TABLE settled_log (settle_date DATE NOT NULL, total BIGINT)`,
		`CREATE FUNCTION log_settled() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO ` + q.schema + `.settled_log VALUES (NEW.settle_date, NEW.total);
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER settled AFTER UPDATE ON settlements
		FOR EACH ROW WHEN (NEW.status = 'done') EXECUTE FUNCTION log_settled()`,
	} {
		_, err := conn.ExecContext(ctx, stmt)
		require.NoError(t, err, "%s", stmt)
	}
	// The day's row exists, pending, before it is settled.
	_, err = conn.ExecContext(ctx, `INSERT INTO settlements (settle_date) VALUES ($1)`, day)
	require.NoError(t, err)
	return q
}

// settled returns the totals of the updates that settled a day, in order.
func (q *quickStartDB) settled(t *testing.T) []int64 {
	t.Helper()
	rows, err := q.db.QueryContext(t.Context(), `SELECT total FROM `+q.schema+`.settled_log`)
	require.NoError(t, err)
	defer rows.Close()
	var totals []int64
	for rows.Next() {
		var total int64
		require.NoError(t, rows.Scan(&total))
		totals = append(totals, total)
	}
	require.NoError(t, rows.Err())
	return totals
}

// holder is one process running the Quick start.
type holder struct {
	name  string
	total int64 // what its computeSettlement returns
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, closed at its end
}

// startHolder starts a holder named name, whose computeSettlement will
// return total. It is killed, if need be, and waited for when t ends.
func startHolder(t *testing.T, bin, name string, total int64, redisAddr, dsn, day string, stderr io.Writer) *holder {
	t.Helper()
	h := &holder{name: name, total: total, lines: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	h.cmd = exec.CommandContext(ctx, bin, redisAddr, dsn, day)
	h.cmd.Stderr = stderr
	var err error
	h.stdin, err = h.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := h.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, h.cmd.Start())
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		cancel() // kills it if it is still running
		for range h.lines {
		}
		_ = h.cmd.Wait() // an error if wait waited already
	})
	return h
}

// await returns the first line the holder prints that starts with prefix,
// failing t if it ends first.
func (h *holder) await(t *testing.T, prefix string) string {
	t.Helper()
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				require.FailNow(t, "holder ended", "holder %s ended before printing %q", h.name, prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
			if strings.HasPrefix(line, "returned") {
				require.FailNow(t, "holder returned", "holder %s, waiting for %q: %s", h.name, prefix, line)
			}
		case <-t.Context().Done():
			require.FailNow(t, "test ended", "holder %s, waiting for %q", h.name, prefix)
		}
	}
}

// send sends a line to the holder: "start" to run the Quick start, its total
// to let its computeSettlement return, after which it writes.
func (h *holder) send(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(h.stdin, line+"\n")
	require.NoError(t, err)
}

// wait waits for the holder's process to end, and checks it succeeded.
func (h *holder) wait(t *testing.T) {
	t.Helper()
	for range h.lines {
	}
	require.NoError(t, h.cmd.Wait(), "holder %s", h.name)
}

// lockedWriter is a writer safe for concurrent use: the holders' stderr is
// copied to t's output by os/exec's goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer // guarded by mu
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
