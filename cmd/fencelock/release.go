package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/redis/go-redis/v9"
)

var releaseCommand = &command{
	name:     "release",
	synopsis: "--force [--yes] [--permit TOKEN] [flags] NAME",
	list:     "--force NAME",
	short:    "delete a lock whoever holds it",
	help: `Deletes the lock NAME whoever holds it: for a holder that is stuck and
will not give it back. A holder releases its own lock with Lease.Release;
this is the operator's override, so it needs --force, and it deletes only
with --yes. Without --yes it prints what it would delete and exits 1.

The delete is atomic: the lock is deleted only if it still holds what was
read, and the deleted holder's owner and fence are printed; if it changed
hands after the read, nothing is deleted and it exits 1. The fence
counter stays, so the next holder's fence is greater than the deleted one;
the holder's token is retired, so it cannot take the lock again; its
waiters are woken, as by a release. The holder finds out at its next
renewal or Extend (ErrNotHeld; RunWithLock cancels its work with ErrLost):
until then it may still be working, which is why writes must check the
fence.

It exits 1 when the lock is not held.

With --permit TOKEN it frees instead one holder's permit of the semaphore
NAME (fencelock.Semaphore): the holder whose token is TOKEN, or starts with
it (8 characters at least; inspect shows them), if it still holds the
permit as read. As for a lock, its token is retired, the semaphore's
waiters are woken, and the holder finds out at its next renewal.

Flags:

	--force            required: delete the lock whoever holds it.
	--yes              really delete it.
	--permit TOKEN     free the semaphore NAME's permit held by TOKEN.
`,
}

func init() { releaseCommand.run = runRelease }

// forceReleaseLua is sent as EVAL, as is force_release_permit.lua: a run
// of the command sends it once, and EVALSHA would need its SHA-1, which a
// program may not compute in FIPS 140-only mode (GODEBUG=fips140=only).
//
//go:embed force_release.lua
var forceReleaseLua string

// markerMillis is the least time a force-deleted holder's token stays
// retired: the library's default ReleaseTimeout.
const markerMillis = 5000

func runRelease(ctx context.Context, e *env, args []string) error {
	var cf connFlags
	fs := newFlagSet("release", &cf)
	force := fs.Bool("force", false, "")
	yes := fs.Bool("yes", false, "")
	permit := fs.String("permit", "", "")
	pos, err := parse(e, releaseCommand, fs, args)
	if err != nil {
		return err
	}
	name, err := oneName(releaseCommand, pos)
	if err != nil {
		return err
	}
	if !*force {
		return usagef("release: deletes a lock whoever holds it, so it needs --force (a holder releases its own lock with Lease.Release)")
	}
	s, err := cf.open(e, "release", nil)
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()
	if *permit != "" {
		return releasePermit(ctx, e, s, &cf, name, *permit, *yes)
	}

	key := s.key(name)
	value, pttl, err := s.read(ctx, key)
	if err != nil {
		return redisError("release", &cf, err)
	}
	if value == "" {
		return failf("release: lock %q is not held: nothing to delete", name)
	}
	token, fence, owner := keys.Parse(value)
	left := fmtTTL(pttl) + " left"
	if pttl < 0 {
		left = "no expiry"
	}
	what := fmt.Sprintf("lock %q held by %s, fence %d, %s", name, holder(owner), fence, left)
	if !*yes {
		fmt.Fprintf(e.stdout, "would delete %s\n", what)
		return failf("release: not deleted: add --yes to delete it")
	}
	reply, err := s.client.Eval(ctx, forceReleaseLua,
		[]string{key, key + keys.Marker + token}, value, s.channel(key), markerMillis).Slice()
	if err != nil {
		return redisError("release", &cf, err)
	}
	deleted, perr, err := decodeForce(reply)
	if err != nil {
		return failf("release: %v", err)
	}
	if !deleted {
		// Released, or released and taken again, since the read: the new
		// holder is not the one the operator chose to delete.
		return failf("release: lock %q changed hands after it was read (%s): not deleted; inspect it and run release again", name, what)
	}
	fmt.Fprintf(e.stdout, "deleted %s\n", what)
	if perr != "" {
		e.warn("release: deleted, but the wake-up could not be published (%s): waiters try again after their backoff", oneLine(perr))
	}
	return nil
}

// read returns the lock's value ("" when it is not held) and its TTL, in
// one transaction.
func (s *session) read(ctx context.Context, key string) (string, time.Duration, error) {
	var get *redis.StringCmd
	var pttl *redis.DurationCmd
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, key)
		pttl = p.PTTL(ctx, key)
		return nil
	})
	if errors.Is(err, redis.Nil) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	ttl := pttl.Val()
	if ttl < 0 {
		ttl = -1
	}
	return get.Val(), ttl, nil
}

// decodeForce decodes force_release.lua's reply.
func decodeForce(reply []any) (deleted bool, publishErr string, err error) {
	if len(reply) >= 1 {
		code, _ := reply[0].(int64)
		switch {
		case code == 1 && len(reply) == 1:
			return true, "", nil
		case code == 1 && len(reply) == 2:
			msg, _ := reply[1].(string)
			return true, msg, nil
		case code == 0 && len(reply) == 2:
			return false, "", nil
		}
	}
	return false, "", fmt.Errorf("unexpected reply from the force-release script: %v", reply)
}
