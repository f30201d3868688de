package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/fencelock/fencelock"
)

// The worker role: TestMain runs workerMain instead of the tests when the
// test binary is started with these variables, so that a pause is a real
// SIGSTOP of a whole process, its watchdog included.
const (
	envRole   = "FENCELOCK_CHAOS_ROLE" // "worker"
	envCoord  = "FENCELOCK_CHAOS_COORD"
	envWorker = "FENCELOCK_CHAOS_WORKER"
)

// errAborted is what a section returns when its context was cancelled before
// it wrote; it deliberately does not match ErrLost, so that an ErrLost in
// RunWithLock's error comes from the library.
var errAborted = errors.New("chaos: section aborted, context cancelled")

// workerMain runs one worker until the test process tells it to stop, and
// returns the process's exit code.
func workerMain() int {
	id, err := strconv.Atoi(os.Getenv(envWorker))
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker: bad", envWorker, err)
		return 2
	}
	conn, err := net.DialTimeout("tcp", os.Getenv(envCoord), 2*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker:", err)
		return 2
	}
	defer conn.Close()
	w := &worker{id: id, link: newLink(conn), hook: newRenewHook()}
	r := w.call(request{Op: "hello", W: id})
	if r.Config == nil {
		fmt.Fprintln(os.Stderr, "chaos worker: no configuration")
		return 2
	}
	w.cfg = *r.Config
	if err := w.setup(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker:", err)
		return 2
	}
	defer func() {
		for _, c := range w.clients {
			_ = c.Close()
		}
	}()
	ctx := context.Background()
	for seq := 1; ; seq++ {
		r := w.call(request{Op: "next", W: id, Seq: seq, AfterRelease: w.hook.afterRelease.Load(),
			RepairsAfterRelease: w.hook.repairsAfterRelease.Load()})
		if r.Stop {
			break
		}
		w.attempt(ctx, seq)
	}
	w.call(request{Op: "bye", W: id, AfterRelease: w.hook.afterRelease.Load(),
		RepairsAfterRelease: w.hook.repairsAfterRelease.Load()})
	return 0
}

type worker struct {
	id      int
	cfg     workerConfig
	link    *link
	hook    *renewHook
	clients []redis.UniversalClient // one, or one per Redlock node
	locker  *fencelock.Locker
	clock   realClock
}

// call sends req to the test process. A worker whose test process has gone
// exits at once.
func (w *worker) call(req request) reply {
	r, err := w.link.call(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos worker: test process gone:", err)
		os.Exit(3)
	}
	return r
}

func (w *worker) setup() error {
	c := w.cfg
	client := func(addr string) redis.UniversalClient {
		return redis.NewClient(&redis.Options{
			Addr:     addr,
			Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true,
			DialTimeout: c.IOTimeout, ReadTimeout: c.IOTimeout, WriteTimeout: c.IOTimeout,
			MaxRetries: 1, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond,
			DialerRetries: 1, PoolSize: 8,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
	}
	switch {
	case len(c.SentinelAddrs) > 0:
		w.clients = []redis.UniversalClient{redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.MasterName, SentinelAddrs: c.SentinelAddrs,
			Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true,
			DialTimeout: c.IOTimeout, ReadTimeout: c.IOTimeout, WriteTimeout: c.IOTimeout,
			MaxRetries: 1, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond,
			DialerRetries: 1, PoolSize: 8,
		})}
	case len(c.RedlockAddrs) > 0:
		for _, a := range c.RedlockAddrs {
			w.clients = append(w.clients, client(a))
		}
		w.hook.redlock = true
	default:
		w.clients = []redis.UniversalClient{client(c.Addr)}
	}
	for _, cl := range w.clients {
		cl.AddHook(w.hook)
	}
	opts := &fencelock.Options{
		TTL:             c.TTL,
		MinRetryBackoff: c.MinBackoff,
		MaxRetryBackoff: c.MaxBackoff,
		ReleaseTimeout:  c.ReleaseTimeout,
		MaxHold:         c.MaxHold,
		Replicas:        c.Replicas,
		ReplicaTimeout:  c.ReplicaTimeout,
	}
	if os.Getenv("FENCELOCK_CHAOS_LOG") == "1" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if c.ClockRate > 0 && c.ClockRate != 1 {
		sc := scaledClock{base: time.Now().Add(-c.ClockSince), rate: c.ClockRate}
		opts.Clock, w.clock = sc, sc
	} else {
		w.clock = systemClock{}
	}
	var err error
	if len(c.RedlockAddrs) > 0 {
		w.locker, err = fencelock.NewRedlock(w.clients, opts)
	} else {
		w.locker, err = fencelock.New(w.clients[0], opts)
	}
	return err
}

// attempt is one RunWithLock call, reported to the test process.
func (w *worker) attempt(ctx context.Context, seq int) {
	var (
		fence   int64
		token   string
		workEnd int64
	)
	opts := []fencelock.Option{fencelock.WithWait(w.cfg.Wait)}
	if w.cfg.Fair {
		opts = append(opts, fencelock.WithFair())
	}
	work := func(ctx context.Context, lease *fencelock.Lease) error {
		fence, token = lease.Fence(), lease.Token()
		defer func() { workEnd = wallMicros(time.Now()) }()
		return w.section(ctx, seq, lease)
	}
	var err error
	if w.cfg.Permits > 0 {
		err = w.locker.Semaphore(w.cfg.Lock, w.cfg.Permits).RunWithLock(ctx, work, opts...)
	} else {
		err = w.locker.RunWithLock(ctx, w.cfg.Lock, work, opts...)
	}
	done := time.Now()
	req := request{Op: "done", W: w.id, Seq: seq, Fence: fence, Wall: wallMicros(done), WorkEnd: workEnd}
	if token != "" {
		// RunWithLock has returned, so its Release is over: from here on
		// the hook counts any renewal of this lease as one after Release.
		r := w.hook.released(token)
		req.RenewOK, req.RenewFail, req.Repairs, req.Repaired = r.ok, r.fail, r.repairs, r.repaired
	}
	if err != nil {
		req.Err = err.Error()
		req.Lost = errors.Is(err, fencelock.ErrLost)
		req.NotObtained = errors.Is(err, fencelock.ErrNotObtained)
		req.Unavailable = errors.Is(err, fencelock.ErrUnavailable)
	}
	w.call(req)
}

// section is the critical section: read the unfenced counter, hold, then
// write the fenced register and the counter+1, checking the context once
// before the writes (as an application would) but not between them.
func (w *worker) section(ctx context.Context, seq int, lease *fencelock.Lease) error {
	fence := lease.Fence()
	now := time.Now()
	granted := w.hook.granted(lease.Token(), len(w.clients)/2+1)
	w.call(request{Op: "acquired", W: w.id, Seq: seq, Fence: fence,
		Wall: wallMicros(now), Deadline: wallMicros(w.clock.realAt(lease.Deadline())), Granted: granted})

	// Report the cancellation the moment it is seen, with how long after the
	// lease's local deadline it came.
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-ctx.Done():
			at := time.Now()
			cause := context.Cause(ctx)
			dl := w.clock.realAt(lease.Deadline())
			w.call(request{Op: "cancel", W: w.id, Seq: seq, Fence: fence,
				Wall: wallMicros(at), Deadline: wallMicros(dl), LagUS: at.Sub(dl).Microseconds(),
				Cause: cause.Error(), Lost: errors.Is(cause, fencelock.ErrLost)})
		case <-stop:
		}
	}()
	defer func() { close(stop); <-watched }()

	r := w.call(request{Op: "ubegin", W: w.id, Seq: seq, Fence: fence, Granted: granted})
	hold := w.cfg.Hold
	if r.Hold > 0 {
		hold = r.Hold
	}
	if !sleepCtx(ctx, hold) {
		w.call(request{Op: "uend", W: w.id, Seq: seq, Fence: fence})
		time.Sleep(w.cfg.StopDelay)
		return errAborted
	}
	w.call(request{Op: "commit", W: w.id, Seq: seq, Fence: fence, Granted: granted}) // may be paused here
	fr := w.call(request{Op: "fwrite", W: w.id, Seq: seq, Fence: fence})
	w.call(request{Op: "uend", W: w.id, Seq: seq, Fence: fence,
		Value: r.Value + 1, Wrote: true, FWrote: true, Acked: fr.Accepted})
	if w.cfg.Linger > 0 {
		sleepCtx(ctx, w.cfg.Linger)
	}
	return nil
}

// sleepCtx sleeps d and reports whether ctx was still live when it ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return ctx.Err() == nil
	}
}

// realClock maps a time of the lock's clock to real time.
type realClock interface {
	realAt(t time.Time) time.Time
}

type systemClock struct{}

func (systemClock) realAt(t time.Time) time.Time { return t }

// scaledClock is a fencelock.Clock that has run at rate times real time since
// base: a slow clock for rate < 1, which by now lags real time by
// (1-rate)*time.Since(base). Its times carry the monotonic reading of base,
// so they compare and subtract consistently.
type scaledClock struct {
	base time.Time
	rate float64
}

var _ fencelock.Clock = scaledClock{}

func (c scaledClock) Now() time.Time {
	return c.base.Add(time.Duration(float64(time.Since(c.base)) * c.rate))
}

func (c scaledClock) NewTimer(d time.Duration) *time.Timer {
	return time.NewTimer(time.Duration(float64(d) / c.rate))
}

func (c scaledClock) realAt(t time.Time) time.Time {
	return c.base.Add(time.Duration(float64(t.Sub(c.base)) / c.rate))
}

// renewHook watches the worker's Redis commands for the extend script: it
// counts each lease's renewals, and any renewal sent for a lease after
// RunWithLock (and so its Release) returned. A Redlock worker's renewal is a
// call on each node, and the hook counts those calls. On a Redlock worker it
// also counts the repairs: the grant script sent with the lease's fence,
// which a renewal that reached a quorum sends to a node that lost the lock
// (restarted empty), and those sent after Release.
//
// On a Redlock worker it also dates each acquisition: Redlock fences count
// up by one and do not date the grant, as one node's (its server's TIME)
// do, so the hook records the TIME each node's grant reply carries (when
// that node granted), and the acquisition is dated by the q-th earliest:
// when a quorum held the lock.
//
// It recognises the extend script by its arguments (EVALSHA/EVAL with one
// key and two arguments, the second an integer TTL), which no other script
// of the library has; and the grant script by its five keys and seven
// arguments, the third the fence, "0" for an acquisition and the lease's
// fence for a repair (on a Redlock worker only).
type renewHook struct {
	redlock             bool // a Redlock worker; set before the first command
	afterRelease        atomic.Int64
	repairsAfterRelease atomic.Int64

	mu     sync.Mutex
	leases map[string]*renewals // guarded by mu; by token
}

type renewals struct {
	ok, fail          int
	repairs, repaired int // repairs sent, and those that put the lock back
	released          bool
	grants            []int64 // Redlock: each node's TIME (µs) when it granted an acquisition
}

// granted returns when the q-th node granted token's acquisition (its
// server's TIME, µs), or 0 when fewer did (not a Redlock worker).
func (h *renewHook) granted(token string, q int) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := slices.Clone(h.lease(token).grants)
	if len(g) < q {
		return 0
	}
	slices.Sort(g)
	return g[q-1]
}

var _ redis.Hook = (*renewHook)(nil)

func newRenewHook() *renewHook { return &renewHook{leases: make(map[string]*renewals)} }

// released marks token's lease released and returns its counts.
func (h *renewHook) released(token string) renewals {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.lease(token)
	r.released = true
	return *r
}

func (h *renewHook) lease(token string) *renewals {
	r := h.leases[token]
	if r == nil {
		r = &renewals{}
		h.leases[token] = r
	}
	return r
}

func (h *renewHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *renewHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *renewHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.redlock {
			if token, repair, ok := grantToken(cmd); ok && repair {
				return h.repair(ctx, next, cmd, token)
			} else if ok {
				err := next(ctx, cmd)
				if reply, _ := cmd.(*redis.Cmd).Slice(); err == nil && len(reply) == 3 && reply[0] == int64(1) {
					s, _ := reply[2].(string)
					if at, perr := strconv.ParseInt(s, 10, 64); perr == nil {
						h.mu.Lock()
						h.lease(token).grants = append(h.lease(token).grants, at)
						h.mu.Unlock()
					}
				}
				return err
			}
		}
		token, ok := extendToken(cmd)
		if !ok && !h.redlock {
			token, ok = semExtendToken(cmd)
		}
		if !ok {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		if h.lease(token).released {
			h.afterRelease.Add(1)
		}
		h.mu.Unlock()
		err := next(ctx, cmd)
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return err // the EVALSHA half of one Script.Run: the EVAL follows
		}
		n, _ := cmd.(*redis.Cmd).Int64()
		h.mu.Lock()
		if err == nil && n == 1 {
			h.lease(token).ok++
		} else {
			h.lease(token).fail++
		}
		h.mu.Unlock()
		return err
	}
}

// repair runs a repair of token's lease and counts it.
func (h *renewHook) repair(ctx context.Context, next redis.ProcessHook, cmd redis.Cmder, token string) error {
	h.mu.Lock()
	after := h.lease(token).released
	h.mu.Unlock()
	err := next(ctx, cmd)
	if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return err // the EVALSHA half of one Script.Run: the EVAL follows
	}
	if after {
		h.repairsAfterRelease.Add(1)
	}
	reply, _ := cmd.(*redis.Cmd).Slice()
	h.mu.Lock()
	r := h.lease(token)
	r.repairs++
	if err == nil && len(reply) > 0 && reply[0] == int64(1) {
		r.repaired++
	}
	h.mu.Unlock()
	return err
}

// grantToken returns the token of a Redlock grant script call, and whether
// it is a repair (its fence argument is not "0").
func grantToken(cmd redis.Cmder) (token string, repair, ok bool) {
	if _, isCmd := cmd.(*redis.Cmd); !isCmd {
		return "", false, false
	}
	args := cmd.Args()
	if len(args) != 15 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
		return "", false, false
	}
	if fmt.Sprint(args[2]) != "5" {
		return "", false, false
	}
	repair = fmt.Sprint(args[10]) != "0"
	switch token := args[8].(type) {
	case string:
		return token, repair, true
	case []byte:
		return string(token), repair, true
	}
	return "", false, false
}

// semExtendToken returns the token of a semaphore's extend script call
// (semaphore_extend.lua): two keys and two arguments, the second an integer
// TTL, which no other script of one deployment has (redlock_fence.lua has
// that shape, and a Redlock worker does not ask).
func semExtendToken(cmd redis.Cmder) (string, bool) {
	if _, isCmd := cmd.(*redis.Cmd); !isCmd {
		return "", false
	}
	args := cmd.Args()
	if len(args) != 7 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") || fmt.Sprint(args[2]) != "2" {
		return "", false
	}
	if _, err := strconv.ParseInt(fmt.Sprint(args[6]), 10, 64); err != nil {
		return "", false
	}
	token, ok := args[5].(string)
	return token, ok
}

// extendToken returns the token of an extend script call.
func extendToken(cmd redis.Cmder) (string, bool) {
	if _, isCmd := cmd.(*redis.Cmd); !isCmd {
		return "", false
	}
	args := cmd.Args()
	if len(args) != 6 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
		return "", false
	}
	if fmt.Sprint(args[2]) != "1" {
		return "", false
	}
	if _, err := strconv.ParseInt(fmt.Sprint(args[5]), 10, 64); err != nil {
		return "", false
	}
	switch token := args[4].(type) {
	case string:
		return token, true
	case []byte:
		return string(token), true
	}
	return "", false
}
