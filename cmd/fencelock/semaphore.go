package main

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/glob"
	"github.com/fencelock/fencelock/internal/keys"
)

// What ls, inspect and release --force show and do of semaphores
// (fencelock.Semaphore): a semaphore's holders are the sorted set
// <prefix>{<name>}:sem, its holders' fences and owners the hash
// <prefix>{<name>}:sem:h (see the library's GUARANTEES.md, "Semaphores").

const semSuffix = keys.Sem // a semaphore's key, after the lock key of its name

// semJSON is one semaphore in the JSON of ls and inspect. Fields are only
// ever added.
type semJSON struct {
	Name      string       `json:"name"`
	Key       string       `json:"key"`
	Permits   int          `json:"permits"`
	Holders   []holderJSON `json:"holders"`
	LastFence int64        `json:"last_fence"`
	Waiters   int          `json:"waiters"`
}

// holderJSON is one holder of a semaphore's permit (with its token) or of
// a read-write lock (without).
type holderJSON struct {
	Token     string `json:"token,omitempty"`
	Owner     string `json:"owner"`
	TTLMillis int64  `json:"ttl_ms"`
	Fence     int64  `json:"fence"`
}

func semToJSON(key string, info fencelock.SemaphoreInfo) semJSON {
	j := semJSON{Name: info.Name, Key: key, Permits: info.Permits, LastFence: info.LastFence,
		Waiters: info.Waiters, Holders: make([]holderJSON, 0, len(info.Holders))}
	for _, h := range info.Holders {
		j.Holders = append(j.Holders, holderJSON{Token: h.Token, Owner: h.Owner, TTLMillis: ttlMillis(h.TTL), Fence: h.Fence})
	}
	return j
}

// inspectSemaphore reads the semaphore called name: its permits are the
// holders' own number, so any number opens it.
func (s *session) inspectSemaphore(ctx context.Context, name string) (fencelock.SemaphoreInfo, error) {
	return s.locker.Semaphore(name, 1).Inspect(ctx)
}

// semaphores returns the semaphores whose name matches pattern and that
// have holders, sorted by name, and the errors of those that could not be
// read.
func (s *session) semaphores(ctx context.Context, pattern string) ([]fencelock.SemaphoreInfo, []error, error) {
	names, err := s.scanMatching(ctx, glob.Escape(s.prefix)+"{"+pattern+"}"+glob.Escape(semSuffix), func(k string) (string, bool) {
		lockKey, ok := strings.CutSuffix(k, semSuffix)
		if !ok {
			return "", false
		}
		return s.nameOf(lockKey)
	})
	if err != nil {
		return nil, nil, err
	}
	const parallel = 8
	infos := make([]fencelock.SemaphoreInfo, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	slots := make(chan struct{}, parallel)
	for i, name := range names {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			infos[i], errs[i] = s.inspectSemaphore(ctx, name)
		})
	}
	wg.Wait()
	var held []fencelock.SemaphoreInfo
	var failed []error
	for i, info := range infos {
		switch {
		case errs[i] != nil:
			failed = append(failed, errs[i])
		case len(info.Holders) > 0: // not given back since the scan
			held = append(held, info)
		}
	}
	return held, failed, nil
}

// printSemaphoreTable prints the semaphores, a line per holder, as a
// table for people.
func printSemaphoreTable(w io.Writer, sems []fencelock.SemaphoreInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEMAPHORE\tPERMITS\tOWNER\tTTL\tFENCE\tWAITERS")
	for _, info := range sems {
		for _, h := range info.Holders {
			fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%d\t%d\n", info.Name, len(info.Holders), info.Permits,
				fmtOwner(h.Owner), fmtTTL(h.TTL), h.Fence, info.Waiters)
		}
	}
	_ = tw.Flush()
}

// printSemaphoreLines prints a line per holder, tab-separated: the lock's
// five fields, then "semaphore <held>/<permits>".
func printSemaphoreLines(w io.Writer, sems []fencelock.SemaphoreInfo) {
	for _, info := range sems {
		for _, h := range info.Holders {
			fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\tsemaphore %d/%d\n", info.Name, h.Owner, ttlMillis(h.TTL), h.Fence,
				info.Waiters, len(info.Holders), info.Permits)
		}
	}
}

// printSemaphore prints a semaphore's holders for inspect, after its name
// when it leads (name is not "").
func printSemaphore(w io.Writer, name, key string, info fencelock.SemaphoreInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if name != "" {
		fmt.Fprintf(tw, "name\t%s\n", name)
	}
	fmt.Fprintf(tw, "semaphore\t%s\n", key)
	fmt.Fprintf(tw, "permits\t%d held of %d\n", len(info.Holders), info.Permits)
	for _, h := range info.Holders {
		fmt.Fprintf(tw, "holder\t%s, fence %d, %s left, token %s\n", fmtOwner(h.Owner), h.Fence, fmtTTL(h.TTL), h.Token)
	}
	if info.LastFence != 0 {
		fmt.Fprintf(tw, "last fence\t%d\n", info.LastFence)
	}
	fmt.Fprintf(tw, "waiters\t%d\n", info.Waiters)
	_ = tw.Flush()
}

// forceReleasePermitLua is sent as EVAL (see forceReleaseLua).
//
//go:embed force_release_permit.lua
var forceReleasePermitLua string

// releasePermit frees the permit of semaphore name held by the holder
// whose token is token, or starts with it (8 characters at least, naming
// one holder): release --force --permit.
func releasePermit(ctx context.Context, e *env, s *session, cf *connFlags, name, token string, yes bool) error {
	if len(token) < 8 {
		return usagef("release: --permit %q: give the holder's token, or its first 8 characters at least (inspect shows them)", token)
	}
	info, err := s.inspectSemaphore(ctx, name)
	if err != nil {
		return redisError("release", cf, err)
	}
	var found []fencelock.HolderInfo
	for _, h := range info.Holders {
		if strings.HasPrefix(h.Token, token) {
			found = append(found, h)
		}
	}
	switch len(found) {
	case 0:
		return failf("release: semaphore %q has no holder with token %s: nothing to free", name, token)
	case 1:
	default:
		return usagef("release: --permit %s names %d holders of semaphore %q: give more of the token", token, len(found), name)
	}
	h := found[0]
	what := fmt.Sprintf("the permit of semaphore %q held by %s, fence %d, %s left (%d of %d permits held)",
		name, holder(h.Owner), h.Fence, fmtTTL(h.TTL), len(info.Holders), info.Permits)
	if !yes {
		fmt.Fprintf(e.stdout, "would free %s\n", what)
		return failf("release: not freed: add --yes to free it")
	}
	key := s.key(name) + semSuffix
	reply, err := s.client.Eval(ctx, forceReleasePermitLua,
		[]string{key, key + keys.SemInfo, key + keys.Marker + h.Token},
		h.Token, fmt.Sprintf("%d %s", h.Fence, h.Owner), s.channel(key), markerMillis).Slice()
	if err != nil {
		return redisError("release", cf, err)
	}
	freed, perr, err := decodeForce(reply)
	switch {
	case err != nil:
		return failf("release: %v", err)
	case !freed:
		return failf("release: the permit of %s was given back or expired meanwhile: nothing to free", holder(h.Owner))
	}
	fmt.Fprintf(e.stdout, "freed %s\n", what)
	if perr != "" {
		e.warn("release: freed, but the wake-up could not be published (%s): waiters try again after their backoff", oneLine(perr))
	}
	return nil
}
