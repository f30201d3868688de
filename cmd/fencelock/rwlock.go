package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/glob"
	"github.com/fencelock/fencelock/internal/keys"
)

// Read-write locks (fencelock.RWLock) in ls and inspect: found by their
// writer key (<prefix>{<name>}:rw:w) or readers' index (:rw:r), read with
// RWLock.Inspect.

// rwlockJSON is one read-write lock in the JSON of ls and inspect. Fields
// are only ever added.
type rwlockJSON struct {
	Name           string       `json:"name"`
	Key            string       `json:"key"` // the prefix of its keys
	Writer         *holderJSON  `json:"writer"`
	Readers        []holderJSON `json:"readers"`
	WritersWaiting int          `json:"writers_waiting"`
	LastFence      int64        `json:"last_fence"`
}

func (s *session) rwKey(name string) string { return s.key(name) + keys.RW }

func rwToJSON(key string, info fencelock.RWLockInfo) rwlockJSON {
	out := rwlockJSON{Name: info.Name, Key: key, Readers: []holderJSON{}, WritersWaiting: info.WritersWaiting, LastFence: info.LastFence}
	if w := info.Writer; w != nil {
		out.Writer = &holderJSON{Owner: w.Owner, TTLMillis: ttlMillis(w.TTL), Fence: w.Fence}
	}
	for _, r := range info.Readers {
		out.Readers = append(out.Readers, holderJSON{Owner: r.Owner, TTLMillis: ttlMillis(r.TTL), Fence: r.Fence})
	}
	return out
}

// rwInUse reports whether a read-write lock is held, or a writer waits for
// it.
func rwInUse(info fencelock.RWLockInfo) bool {
	return info.Writer != nil || len(info.Readers) > 0 || info.WritersWaiting > 0
}

// scanRWLocks returns the names of the read-write locks that match
// pattern, sorted.
func (s *session) scanRWLocks(ctx context.Context, pattern string) ([]string, error) {
	return s.scanMatching(ctx, glob.Escape(s.prefix)+"{"+pattern+"}:rw:[wr]", s.rwNameOf)
}

// rwNameOf returns the name of a read-write lock's writer key or readers'
// index; false for any other key.
func (s *session) rwNameOf(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, s.prefix+"{")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, "}:rw:w")
	if !ok {
		name, ok = strings.CutSuffix(rest, "}:rw:r")
	}
	if !ok || name == "" || strings.ContainsAny(name, "{}") {
		return "", false
	}
	return name, true
}

// inspectRW reads the read-write lock called name: its readers by expiry,
// those that expire in the same millisecond by fence (Redis orders them by
// their random tokens).
func (s *session) inspectRW(ctx context.Context, name string) (fencelock.RWLockInfo, error) {
	info, err := s.locker.RWLock(name).Inspect(ctx)
	slices.SortStableFunc(info.Readers, func(a, b fencelock.RWHolder) int {
		return cmp.Or(cmp.Compare(a.TTL, b.TTL), cmp.Compare(a.Fence, b.Fence))
	})
	return info, err
}

// lsRWLocks reads the read-write locks matching pattern and returns those
// in use, and the errors.
func lsRWLocks(ctx context.Context, s *session, pattern string) ([]fencelock.RWLockInfo, []error) {
	names, err := s.scanRWLocks(ctx, pattern)
	if err != nil {
		return nil, []error{err}
	}
	infos, errs := inspectEach(names, func(name string) (fencelock.RWLockInfo, error) {
		return s.inspectRW(ctx, name)
	})
	var used []fencelock.RWLockInfo
	for _, info := range infos {
		if rwInUse(info) {
			used = append(used, info)
		}
	}
	return used, errs
}

// printRWTable prints the read-write locks as a table for people, a line
// per holder.
func printRWTable(w io.Writer, infos []fencelock.RWLockInfo) {
	if len(infos) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nRWLOCK\tMODE\tOWNER\tTTL\tFENCE\tWRITERS WAITING")
	for _, info := range infos {
		rwHolders(info, func(mode string, h fencelock.RWHolder) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", info.Name, mode, fmtOwner(h.Owner), fmtTTL(h.TTL), h.Fence, info.WritersWaiting)
		})
		if info.Writer == nil && len(info.Readers) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t%d\n", info.Name, info.WritersWaiting)
		}
	}
	_ = tw.Flush()
}

// printRWLines prints the read-write locks' holders one a line,
// tab-separated: a lock's five fields (name, owner, TTL in ms, fence, and
// the writers waiting in place of waiters), then "shared" or "exclusive".
func printRWLines(w io.Writer, infos []fencelock.RWLockInfo) {
	for _, info := range infos {
		rwHolders(info, func(mode string, h fencelock.RWHolder) {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\n", info.Name, h.Owner, ttlMillis(h.TTL), h.Fence, info.WritersWaiting, mode)
		})
	}
}

// rwHolders calls f for the writer, if any, and each reader.
func rwHolders(info fencelock.RWLockInfo, f func(mode string, h fencelock.RWHolder)) {
	if info.Writer != nil {
		f("exclusive", *info.Writer)
	}
	for _, r := range info.Readers {
		f("shared", r)
	}
}

// printRWInspect prints the read-write lock of a name for inspect, after
// its name when it leads (name is not "").
func printRWInspect(w io.Writer, name, key string, info fencelock.RWLockInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if name != "" {
		fmt.Fprintf(tw, "name\t%s\n", name)
	}
	fmt.Fprintf(tw, "rwlock\t%s\n", key)
	if h := info.Writer; h != nil {
		fmt.Fprintf(tw, "writer\t%s, ttl %s, fence %d\n", fmtOwner(h.Owner), fmtTTL(h.TTL), h.Fence)
	}
	for _, r := range info.Readers {
		fmt.Fprintf(tw, "reader\t%s, ttl %s, fence %d\n", fmtOwner(r.Owner), fmtTTL(r.TTL), r.Fence)
	}
	fmt.Fprintf(tw, "writers waiting\t%d\n", info.WritersWaiting)
	if info.LastFence != 0 {
		fmt.Fprintf(tw, "last fence\t%d\n", info.LastFence)
	}
	_ = tw.Flush()
}

// inspectJSON is inspect's JSON: the lock, and the read-write lock of the
// name when it is in use.
type inspectJSON struct {
	lockJSON
	Semaphore *semJSON    `json:"semaphore,omitempty"`
	RWLock    *rwlockJSON `json:"rwlock,omitempty"`
}
