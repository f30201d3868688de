package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/fencelock/fencelock"
)

var inspectCommand = &command{
	name:     "inspect",
	synopsis: "[flags] NAME",
	list:     "NAME",
	short:    "one lock: owner, TTL left, fence, last fence, waiters",
	help: `Reads the lock NAME without changing it (Locker.Inspect): whether it is
held, by which owner (Options.Owner or WithOwner), for how long more, with
which fence; the last fence issued for the name (kept for FenceRetention
after its last acquisition); and how many Lockers wait for it. A running
fencelock watch counts as one waiter. When the semaphore NAME
(fencelock.Semaphore) has holders, it shows them too: its permits held of
how many, and each holder's owner, fence, TTL left and token (for release
--force --permit). When the read-write lock (RWLock) of the name is in
use, it shows its writer, readers and waiting writers.

It leads with what the name is: the lock when it is held, else the
semaphore when it has holders, else the read-write lock; the lock of the
name, not held, then comes last, under "lock".

It exits 1 when neither the lock, a permit of the semaphore, nor the
read-write lock is held, after printing what it found.

Flags:

	--json             one JSON object: {"name", "key", "held", "owner",
	                   "ttl_ms", "fence", "last_fence", "waiters"}, and
	                   "semaphore": {"name", "key", "permits", "holders":
	                   [{"token", "owner", "ttl_ms", "fence"}, ...],
	                   "last_fence", "waiters"} when it has holders;
	                   "rwlock": {"name", "key", "writer", "readers",
	                   "writers_waiting", "last_fence"} when it is in use.
`,
}

func init() { inspectCommand.run = runInspect }

func runInspect(ctx context.Context, e *env, args []string) error {
	var cf connFlags
	fs := newFlagSet("inspect", &cf)
	asJSON := fs.Bool("json", false, "")
	pos, err := parse(e, inspectCommand, fs, args)
	if err != nil {
		return err
	}
	name, err := oneName(inspectCommand, pos)
	if err != nil {
		return err
	}
	s, err := cf.open(e, "inspect", nil)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()
	info, err := s.locker.Inspect(ctx, name)
	if err != nil {
		return redisError("inspect", &cf, err)
	}
	sem, err := s.inspectSemaphore(ctx, name)
	if err != nil {
		return redisError("inspect", &cf, err)
	}
	semHeld := len(sem.Holders) > 0
	rw, err := s.inspectRW(ctx, name)
	if err != nil {
		return redisError("inspect", &cf, err)
	}
	if *asJSON {
		out := inspectJSON{lockJSON: toJSON(s.key(name), info)}
		if semHeld {
			j := semToJSON(s.key(name)+semSuffix, sem)
			out.Semaphore = &j
		}
		if rwInUse(rw) {
			j := rwToJSON(s.rwKey(name), rw)
			out.RWLock = &j
		}
		if err := writeJSON(e.stdout, out); err != nil {
			return err
		}
	} else {
		printInspect(e.stdout, s, name, info, sem, rw)
	}
	if !info.Held && !semHeld && !rwInUse(rw) {
		return &cmdError{code: exitFailed}
	}
	return nil
}

// printInspect prints inspect's text for people, leading with what the
// name is: the lock when it is held, else the semaphore when it has
// holders, else the read-write lock when it is in use; the lock of the
// name, not held, then comes last.
func printInspect(w io.Writer, s *session, name string, info fencelock.LockInfo, sem fencelock.SemaphoreInfo, rw fencelock.RWLockInfo) {
	semHeld := len(sem.Holders) > 0
	if info.Held || (!semHeld && !rwInUse(rw)) {
		printLock(w, "name", name, s.key(name), info)
		if semHeld {
			fmt.Fprintln(w)
			printSemaphore(w, "", s.key(name)+semSuffix, sem)
		}
		if rwInUse(rw) {
			fmt.Fprintln(w)
			printRWInspect(w, "", s.rwKey(name), rw)
		}
		return
	}
	lead := name
	if semHeld {
		printSemaphore(w, lead, s.key(name)+semSuffix, sem)
		lead = ""
	}
	if rwInUse(rw) {
		if lead == "" {
			fmt.Fprintln(w)
		}
		printRWInspect(w, lead, s.rwKey(name), rw)
	}
	fmt.Fprintln(w)
	printLock(w, "lock", "", s.key(name), info)
}

// printLock prints the lock of a name for inspect: under "name" with the
// name and its key when it leads, under "lock" with its key otherwise.
func printLock(w io.Writer, heading, name, key string, info fencelock.LockInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if name != "" {
		fmt.Fprintf(tw, "%s\t%s\n", heading, name)
		fmt.Fprintf(tw, "key\t%s\n", key)
	} else {
		fmt.Fprintf(tw, "%s\t%s\n", heading, key)
	}
	if info.Held {
		fmt.Fprintf(tw, "held\tyes\n")
		fmt.Fprintf(tw, "owner\t%s\n", fmtOwner(info.Owner))
		fmt.Fprintf(tw, "ttl\t%s\n", fmtTTL(info.TTL))
		fmt.Fprintf(tw, "fence\t%d\n", info.Fence)
	} else {
		fmt.Fprintf(tw, "held\tno\n")
	}
	if info.LastFence != 0 {
		fmt.Fprintf(tw, "last fence\t%d\n", info.LastFence)
	} else {
		fmt.Fprintf(tw, "last fence\tnone kept\n")
	}
	if info.Waiters > 0 {
		// Waiters are the channel's subscribers, and watch is one.
		fmt.Fprintf(tw, "waiters\t%d (a running watch counts too)\n", info.Waiters)
	} else {
		fmt.Fprintf(tw, "waiters\t0\n")
	}
	_ = tw.Flush()
}
