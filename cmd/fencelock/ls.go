package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/glob"
	"github.com/fencelock/fencelock/internal/keys"
)

var lsCommand = &command{
	name:     "ls",
	synopsis: "[flags] [PATTERN]",
	list:     "[PATTERN]",
	short:    "the locks held, with owner, TTL left and fence",
	help: `Lists the locks held whose name matches PATTERN, a Redis glob (* ? [abc]
\x), default *: ls 'settlement:*'. It finds them with SCAN (never KEYS),
on every master of a Cluster, and reads each with Locker.Inspect: owner,
TTL left, fence, waiters. Fence counters and token markers are not locks
and are not listed. Waiters are the subscribers of the lock's wake-up
channel. A running watch counts as one waiter. The semaphores of matching
names (fencelock.Semaphore) with holders follow, one line per holder.

On a terminal it prints a table; otherwise one lock a line, tab-separated,
without a header: name, owner, TTL in milliseconds (-1: no expiry), fence,
waiters; then one line per semaphore holder, the same five fields and
"semaphore <held>/<permits>". When no lock and no semaphore is held, it
says so on stderr. It exits 0 when no lock is held, too.

Read-write locks (RWLock) in use follow, one holder a line: the same five
fields (waiters: the writers waiting), and a sixth, shared or exclusive.

Flags:

	--json             one JSON document: {"prefix", "pattern", "locks": [...],
	                   "semaphores": [...], "rwlocks": [...]}, each as in
	                   inspect --json.
`,
}

func init() { lsCommand.run = runLs }

func runLs(ctx context.Context, e *env, args []string) error {
	var cf connFlags
	fs := newFlagSet("ls", &cf)
	asJSON := fs.Bool("json", false, "")
	pos, err := parse(e, lsCommand, fs, args)
	if err != nil {
		return err
	}
	pattern := "*"
	switch len(pos) {
	case 0:
	case 1:
		pattern = pos[0]
		if err := checkName("ls", "PATTERN", pattern); err != nil {
			return err
		}
	default:
		return usagef("ls: one PATTERN only, got %d arguments: %q", len(pos), pos)
	}
	s, err := cf.open(e, "ls", nil)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()

	names, err := s.scan(ctx, pattern)
	if err != nil {
		return redisError("ls", &cf, err)
	}
	infos, errs := inspectAll(ctx, s.locker, names)
	rwlocks, rwErrs := lsRWLocks(ctx, s, pattern)
	errs = append(errs, rwErrs...)
	if ctx.Err() != nil {
		return redisError("ls", &cf, ctx.Err())
	}
	var held []fencelock.LockInfo
	for _, info := range infos {
		if info.Held { // not expired or released since the scan
			held = append(held, info)
		}
	}
	sems, semErrs, err := s.semaphores(ctx, pattern)
	if err != nil {
		return redisError("ls", &cf, err)
	}
	errs = append(errs, semErrs...)
	if err := printLs(e, s, pattern, *asJSON, lsFound{held, sems, rwlocks, len(errs)}); err != nil {
		return err
	}
	for _, err := range errs {
		e.warn("ls: %s", trimPrefix(err))
	}
	if len(errs) > 0 {
		return failf("ls: %s not read", plural(len(errs), "lock"))
	}
	return nil
}

// printTable prints the locks as a table for people.
func printTable(w io.Writer, locks []fencelock.LockInfo, match string) {
	if len(locks) == 0 {
		fmt.Fprintf(w, "no lock held matching %s\n", match)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tOWNER\tTTL\tFENCE\tWAITERS")
	for _, info := range locks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", info.Name, fmtOwner(info.Owner), fmtTTL(info.TTL), info.Fence, info.Waiters)
	}
	_ = tw.Flush()
}

// scan returns the names of the lock keys that match pattern, sorted, from
// SCAN on every master.
func (s *session) scan(ctx context.Context, pattern string) ([]string, error) {
	return s.scanMatching(ctx, glob.Escape(s.prefix)+"{"+pattern+"}", s.nameOf)
}

// scanMatching returns the names that nameOf finds in the keys matching
// match, sorted, from SCAN on every master.
func (s *session) scanMatching(ctx context.Context, match string, nameOf func(key string) (string, bool)) ([]string, error) {
	var (
		mu    sync.Mutex // ForEachMaster calls concurrently
		names = map[string]struct{}{}
	)
	scanNode := func(ctx context.Context, c *redis.Client, node string) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, match, 1000).Result()
			if err != nil {
				return fmt.Errorf("SCAN%s: %w", node, err)
			}
			mu.Lock()
			for _, k := range keys {
				if name, ok := nameOf(k); ok {
					names[name] = struct{}{} // SCAN may return a key twice
				}
			}
			mu.Unlock()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return scanNode(ctx, c, " on "+c.Options().Addr)
		})
	case *redis.Client:
		err = scanNode(ctx, c, "")
	default:
		err = fmt.Errorf("cannot scan a %T", s.client)
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// nameOf returns the lock name of a lock key, KeyPrefix+"{"+name+"}";
// false for a fence counter (":fence"), a token marker (":t:<token>"), a
// line of fair or Redlock waiters (":q", ":qi") or a key that is not the
// library's.
func (s *session) nameOf(key string) (string, bool) { return keys.NameOf(s.prefix, key) }

// inspectAll inspects the named locks, a few at a time, and returns their
// infos in order (a zero one where it failed) and the errors.
func inspectAll(ctx context.Context, l *fencelock.Locker, names []string) ([]fencelock.LockInfo, []error) {
	return inspectEach(names, func(name string) (fencelock.LockInfo, error) { return l.Inspect(ctx, name) })
}

// inspectEach calls inspect for each name, a few at a time, and returns
// the results in order (a zero one where it failed) and the errors.
func inspectEach[T any](names []string, inspect func(name string) (T, error)) ([]T, []error) {
	const parallel = 8
	infos := make([]T, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i, name := range names {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			infos[i], errs[i] = inspect(name)
		})
	}
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return infos, failed
}

// lsFound is what ls read: the locks held, the semaphores, the read-write
// locks, and how many names it could not read.
type lsFound struct {
	held    []fencelock.LockInfo
	sems    []fencelock.SemaphoreInfo
	rwlocks []fencelock.RWLockInfo
	unread  int
}

// printLs writes what ls found as JSON, as tables on a terminal, or as
// tab-separated lines for scripts.
func printLs(e *env, s *session, pattern string, asJSON bool, f lsFound) error {
	switch {
	case asJSON:
		out := struct {
			Prefix     string       `json:"prefix"`
			Pattern    string       `json:"pattern"`
			Locks      []lockJSON   `json:"locks"`
			Semaphores []semJSON    `json:"semaphores"`
			RWLocks    []rwlockJSON `json:"rwlocks"`
		}{Prefix: s.prefix, Pattern: pattern, Locks: make([]lockJSON, 0, len(f.held)),
			Semaphores: make([]semJSON, 0, len(f.sems)), RWLocks: []rwlockJSON{}}
		for _, info := range f.held {
			out.Locks = append(out.Locks, toJSON(s.key(info.Name), info))
		}
		for _, info := range f.sems {
			out.Semaphores = append(out.Semaphores, semToJSON(s.key(info.Name)+semSuffix, info))
		}
		for _, info := range f.rwlocks {
			out.RWLocks = append(out.RWLocks, rwToJSON(s.rwKey(info.Name), info))
		}
		return writeJSON(e.stdout, out)
	case e.tty:
		if len(f.held) > 0 || len(f.sems) == 0 && len(f.rwlocks) == 0 {
			printTable(e.stdout, f.held, s.key(pattern))
		}
		if len(f.sems) > 0 {
			if len(f.held) > 0 {
				fmt.Fprintln(e.stdout)
			}
			printSemaphoreTable(e.stdout, f.sems)
		}
		printRWTable(e.stdout, f.rwlocks)
	default:
		for _, info := range f.held {
			fmt.Fprintf(e.stdout, "%s\t%s\t%d\t%d\t%d\n", info.Name, info.Owner, ttlMillis(info.TTL), info.Fence, info.Waiters)
		}
		printSemaphoreLines(e.stdout, f.sems)
		printRWLines(e.stdout, f.rwlocks)
		if len(f.held) == 0 && len(f.sems) == 0 && len(f.rwlocks) == 0 && f.unread == 0 {
			// On stderr: stdout, which scripts read, stays empty.
			e.warn("ls: no lock held matching %s", s.key(pattern))
		}
	}
	return nil
}
