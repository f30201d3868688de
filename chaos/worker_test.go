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
		for _, c := range w.closers {
			c()
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
	closers []func() // the Close of each Redis client
	nodes   int      // deployments the lock is held on: 1, or Redlock's nodes
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
	w.nodes = max(1, len(c.RedlockAddrs))
	w.hook.redlock = len(c.RedlockAddrs) > 0
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
	switch c.Client {
	case "", goRedis:
		w.locker, err = w.goRedisLocker(opts)
	case rueidisC:
		w.locker, err = w.rueidisLocker(opts)
	case valkeyC:
		w.locker, err = w.valkeyLocker(opts)
	default:
		err = fmt.Errorf("unknown client %q", c.Client)
	}
	return err
}

// goRedisLocker builds the worker's Locker on go-redis clients, with the
// worker's renewHook on each.
func (w *worker) goRedisLocker(opts *fencelock.Options) (*fencelock.Locker, error) {
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
	var clients []redis.UniversalClient // one, or one per Redlock node
	switch {
	case len(c.SentinelAddrs) > 0:
		clients = []redis.UniversalClient{redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.MasterName, SentinelAddrs: c.SentinelAddrs,
			Protocol: 2, DisableIdentity: true, ContextTimeoutEnabled: true,
			DialTimeout: c.IOTimeout, ReadTimeout: c.IOTimeout, WriteTimeout: c.IOTimeout,
			MaxRetries: 1, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 10 * time.Millisecond,
			DialerRetries: 1, PoolSize: 8,
		})}
	case len(c.RedlockAddrs) > 0:
		for _, a := range c.RedlockAddrs {
			clients = append(clients, client(a))
		}
	default:
		clients = []redis.UniversalClient{client(c.Addr)}
	}
	for _, cl := range clients {
		cl.AddHook(w.hook)
		w.closers = append(w.closers, func() { _ = cl.Close() })
	}
	if len(c.RedlockAddrs) > 0 {
		return fencelock.NewRedlock(clients, opts)
	}
	return fencelock.New(clients[0], opts)
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
	granted := w.hook.granted(lease.Token(), w.nodes/2+1)
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
		c, isCmd := cmd.(*redis.Cmd)
		if !isCmd {
			return next(ctx, cmd)
		}
		end := h.begin(cmd.Args())
		err := next(ctx, cmd)
		if end != nil {
			end(c.Val(), err)
		}
		return err
	}
}

// begin is called before a command is sent, with its arguments (its name
// first), whichever client sends it: it returns what to call with the
// command's reply (int64, string or []any, as go-redis gives them) and
// error, or nil for a command the hook does not watch.
func (h *renewHook) begin(args []any) func(reply any, err error) {
	if h.redlock {
		if token, repair, ok := grantToken(args); ok && repair {
			return h.repair(token)
		} else if ok {
			return func(reply any, err error) {
				r, _ := reply.([]any)
				if err == nil && len(r) == 3 && r[0] == int64(1) {
					s, _ := r[2].(string)
					if at, perr := strconv.ParseInt(s, 10, 64); perr == nil {
						h.mu.Lock()
						h.lease(token).grants = append(h.lease(token).grants, at)
						h.mu.Unlock()
					}
				}
			}
		}
	}
	token, ok := extendToken(args)
	if !ok && !h.redlock {
		token, ok = semExtendToken(args)
	}
	if !ok {
		return nil
	}
	h.mu.Lock()
	if h.lease(token).released {
		h.afterRelease.Add(1)
	}
	h.mu.Unlock()
	return func(reply any, err error) {
		if isNoScript(err) {
			return // the EVALSHA half of one Script.Run: the EVAL follows
		}
		n, _ := reply.(int64)
		h.mu.Lock()
		if err == nil && n == 1 {
			h.lease(token).ok++
		} else {
			h.lease(token).fail++
		}
		h.mu.Unlock()
	}
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// repair returns what counts a repair of token's lease once it has run.
func (h *renewHook) repair(token string) func(reply any, err error) {
	h.mu.Lock()
	after := h.lease(token).released
	h.mu.Unlock()
	return func(reply any, err error) {
		if isNoScript(err) {
			return // the EVALSHA half of one Script.Run: the EVAL follows
		}
		if after {
			h.repairsAfterRelease.Add(1)
		}
		r, _ := reply.([]any)
		h.mu.Lock()
		l := h.lease(token)
		l.repairs++
		if err == nil && len(r) > 0 && r[0] == int64(1) {
			l.repaired++
		}
		h.mu.Unlock()
	}
}

// isScript reports whether args (a command's, its name first) run a script
// with n keys and m arguments.
func isScript(args []any, n, m int) bool {
	if len(args) != 3+n+m {
		return false
	}
	name := strings.ToLower(fmt.Sprint(args[0]))
	return (name == "evalsha" || name == "eval") && fmt.Sprint(args[2]) == strconv.Itoa(n)
}

// str returns a string argument (a go-redis command's may be a []byte).
func str(arg any) (string, bool) {
	switch s := arg.(type) {
	case string:
		return s, true
	case []byte:
		return string(s), true
	}
	return "", false
}

// grantToken returns the token of a Redlock grant script call, and whether
// it is a repair (its fence argument is not "0").
func grantToken(args []any) (token string, repair, ok bool) {
	if !isScript(args, 5, 7) {
		return "", false, false
	}
	token, ok = str(args[8])
	return token, ok && fmt.Sprint(args[10]) != "0", ok
}

// semExtendToken returns the token of a semaphore's extend script call
// (semaphore_extend.lua): two keys and two arguments, the second an integer
// TTL, which no other script of one deployment has (redlock_fence.lua has
// that shape, and a Redlock worker does not ask).
func semExtendToken(args []any) (string, bool) {
	if !isScript(args, 2, 2) {
		return "", false
	}
	if _, err := strconv.ParseInt(fmt.Sprint(args[6]), 10, 64); err != nil {
		return "", false
	}
	return str(args[5])
}

// extendToken returns the token of an extend script call.
func extendToken(args []any) (string, bool) {
	if !isScript(args, 1, 2) {
		return "", false
	}
	if _, err := strconv.ParseInt(fmt.Sprint(args[5]), 10, 64); err != nil {
		return "", false
	}
	return str(args[4])
}
