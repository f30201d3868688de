package fencelock

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/internal/deployment"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/fencelock/fencelock/internal/redlock"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(fairChildEnv); spec != "" {
		os.Exit(fairChild(spec))
	}
	if spec := os.Getenv(semChildEnv); spec != "" {
		os.Exit(semChild(spec))
	}
	if spec := os.Getenv(rwChildEnv); spec != "" {
		os.Exit(rwChild(spec))
	}
	goleak.VerifyTestMain(m)
}

// uniqueName returns a lock name unique to the test.
func uniqueName(t *testing.T) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
}

// assertTTLLeft checks that got is what a server had left, when it was
// read (just before the call), of a TTL of ttl that it set after since:
// at most ttl, at least ttl less the time since then, and 1ms (PTTL counts
// whole milliseconds). "Within a second of ttl" is the machine's speed: a
// busy one read 8.4s left of 10s.
func assertTTLLeft(t *testing.T, got, ttl time.Duration, since time.Time, msgAndArgs ...any) bool {
	t.Helper()
	return assert.LessOrEqual(t, got, ttl, msgAndArgs...) &&
		assert.GreaterOrEqual(t, got, ttl-time.Since(since)-time.Millisecond, msgAndArgs...)
}

// errReplyLost is what faultHook returns in place of a reply it dropped.
var errReplyLost = errors.New("test: reply lost in transit")

// faultHook wraps the real client's command processing. It counts commands,
// can fail a command before it is sent (Redis unreachable) and can drop a
// reply after the server applied the command (reply lost in transit).
type faultHook struct {
	calls atomic.Int64

	mu     sync.Mutex
	before func(ctx context.Context, cmd redis.Cmder) error // guarded by mu; non-nil error: not sent
	after  func(ctx context.Context, cmd redis.Cmder) error // guarded by mu; non-nil error: reply dropped
}

var _ redis.Hook = (*faultHook)(nil)

func (h *faultHook) set(before, after func(ctx context.Context, cmd redis.Cmder) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.before, h.after = before, after
}

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.calls.Add(1)
		h.mu.Lock()
		before, after := h.before, h.after
		h.mu.Unlock()
		if before != nil {
			if err := before(ctx, cmd); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		if err := next(ctx, cmd); err != nil {
			return err
		}
		if after != nil {
			if err := after(ctx, cmd); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		return nil
	}
}

// scriptName tells which of our scripts cmd runs (the name of its file,
// without ".lua"), or "".
func scriptName(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	body, _ := args[1].(string)
	switch cmd.Name() {
	case "evalsha", "eval":
		for _, s := range script.All {
			if body == s.Hash || body == s.Src {
				return s.Name
			}
		}
	}
	return ""
}

// runScript and loadScript run and load s as a *redis.Script, for tests
// that run one directly on a client.
func runScript(s *script.Script, ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	return redis.NewScript(s.Src.(string)).Run(ctx, c, keys, args...)
}

func loadScript(s *script.Script, ctx context.Context, c redis.Scripter) *redis.StringCmd {
	return redis.NewScript(s.Src.(string)).Load(ctx, c)
}

// onScript returns a hook function that returns err for the named script.
func onScript(name string, err error) func(context.Context, redis.Cmder) error {
	return func(_ context.Context, cmd redis.Cmder) error {
		if scriptName(cmd) == name {
			return err
		}
		return nil
	}
}

type env struct {
	srv    *redistest.Server
	client *redis.Client // with hook
	hook   *faultHook
	admin  *redis.Client // without hook, for inspecting and meddling
}

// newEnv starts a redis-server for the test and returns clients for it.
func newEnv(t *testing.T, opts *redis.Options) *env {
	t.Helper()
	srv := redistest.Start(t)
	e := &env{srv: srv, client: srv.Client(opts), hook: &faultHook{}, admin: srv.Client(nil)}
	e.client.AddHook(e.hook)
	return e
}

func (e *env) locker(t *testing.T, opts *Options) *Locker {
	t.Helper()
	l, err := New(e.client, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// keys returns the lock key and the fence counter key of name.
func (l *Locker) keys(name string) (key, fenceKey string) {
	key = keys.Lock(l.opts.KeyPrefix, name)
	return key, key + keys.Fence
}

// waitsOf returns the notifier of a Locker made by New.
func waitsOf(l *Locker) *notify.Notifier { return l.store.(*deployment.Deployment).Notifier() }

// nodeWaits returns the notifier of a Redlock's node i.
func nodeWaits(l *Locker, i int) *notify.Notifier {
	return l.checks[i].single.(*deployment.Deployment).Notifier()
}

// openHubs returns how many subscription connections l has open.
func openHubs(l *Locker) int { return waitsOf(l).Hubs() }

// call sends one command through the client of a Locker made by New.
func call(l *Locker, args ...any) (any, error) { return l.checks[0].client.Call(ctx, args) }

// decodeAcquire reads an acquire script's reply, for hooks: whether it took
// the lock, and its fence (or the holder's PTTL in ms, and its owner).
func decodeAcquire(reply any) (ok bool, value int64, owner string, err error) {
	a := store.AcquireReply("acquire", reply)
	switch {
	case a.Err != nil:
		return false, 0, "", a.Err
	case a.OK:
		return true, a.Fence, "", nil
	}
	return false, int64(a.Busy.TTL / time.Millisecond), a.Busy.Owner, nil
}

// lineTag returns the tag of a NewRedlock Locker's calls in a line.
func lineTag(l *Locker) string { return l.store.(*redlock.Quorum).LineTag() }
