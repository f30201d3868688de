package fencegocron_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	fencegocron "github.com/fencelock/fencelock/gocron"
)

// The scheduler role: TestMain runs schedulerMain instead of the tests when
// the test binary is started with envScheduler set, so that each scheduler
// is a process of its own, which a test can pause with SIGSTOP as a whole
// (its watchdog and gocron's timers included).
const envScheduler = "FENCEGOCRON_TEST_SCHEDULER"

// schedConfig is what the test tells a scheduler process, as JSON in
// envScheduler.
type schedConfig struct {
	Name      string        `json:"name"`
	RedisAddr string        `json:"redis_addr"`
	KeyPrefix string        `json:"key_prefix"`
	Job       string        `json:"job"`      // the job's name, which is its lock's name
	Interval  time.Duration `json:"interval"` // gocron.DurationJob's
	TTL       time.Duration `json:"ttl"`      // fencelock.Options.TTL
	MinHold   time.Duration `json:"min_hold"` // fencegocron.WithMinHold
	Work      time.Duration `json:"work"`     // how long each run works, in workStep steps
}

const workStep = 10 * time.Millisecond

// event is one line a scheduler process writes to its stdout.
type event struct {
	Kind  string `json:"kind"` // ready, run, done, cancelled, job_error, lock_error, bye
	Tick  int    `json:"tick,omitempty"`
	Fence int64  `json:"fence,omitempty"`
	At    int64  `json:"at"`             // unix nanoseconds
	Lost  bool   `json:"lost,omitempty"` // the error or cause matches fencelock.ErrLost
	Busy  bool   `json:"busy,omitempty"` // the error matches fencelock.ErrNotObtained
	Err   string `json:"err,omitempty"`
}

func (e event) time() time.Time { return time.Unix(0, e.At) }

type emitter struct {
	mu sync.Mutex
	w  io.Writer // guarded by mu
}

func (e *emitter) emit(ev event) {
	ev.At = time.Now().UnixNano()
	b, _ := json.Marshal(ev)
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
}

// schedulerMain runs a gocron scheduler with a fencegocron Locker and one
// job, and returns the process's exit code. It reports "ready", starts the
// job on the line "start <unix nanoseconds>" from stdin (the first tick),
// and shuts down when stdin ends.
func schedulerMain(raw string) int {
	var cfg schedConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		return 2
	}
	if err := runScheduler(cfg, os.Stdin, &emitter{w: os.Stdout}); err != nil {
		fmt.Fprintf(os.Stderr, "scheduler %s: %v\n", cfg.Name, err)
		return 1
	}
	return 0
}

func runScheduler(cfg schedConfig, stdin io.Reader, out *emitter) error {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.RedisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	fl, err := fencelock.New(rdb, &fencelock.Options{KeyPrefix: cfg.KeyPrefix, TTL: cfg.TTL})
	if err != nil {
		return err
	}
	defer fl.Close()
	locker := fencegocron.NewLocker(fl, fencegocron.WithMinHold(cfg.MinHold))
	defer locker.Close()

	in := bufio.NewScanner(stdin)
	out.emit(event{Kind: "ready"})
	if !in.Scan() {
		return errors.New("stdin ended before start")
	}
	ns, err := strconv.ParseInt(strings.TrimPrefix(in.Text(), "start "), 10, 64)
	if err != nil {
		return fmt.Errorf("bad start line %q: %w", in.Text(), err)
	}
	start := time.Unix(0, ns)

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		return err
	}
	job := func(ctx context.Context, lease *fencelock.Lease) error {
		tick := int(math.Round(float64(time.Since(start)) / float64(cfg.Interval)))
		out.emit(event{Kind: "run", Tick: tick, Fence: lease.Fence()})
		for range int(cfg.Work / workStep) {
			select {
			case <-ctx.Done():
				cause := context.Cause(ctx)
				out.emit(event{Kind: "cancelled", Fence: lease.Fence(), Lost: errors.Is(cause, fencelock.ErrLost), Err: cause.Error()})
				return cause
			case <-time.After(workStep):
			}
		}
		out.emit(event{Kind: "done", Fence: lease.Fence()})
		return nil
	}
	_, err = s.NewJob(gocron.DurationJob(cfg.Interval), locker.Task(job),
		gocron.WithName(cfg.Job),
		gocron.WithStartAt(gocron.WithStartDateTime(start)),
		gocron.WithEventListeners(
			gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
				out.emit(event{Kind: "job_error", Lost: errors.Is(err, fencelock.ErrLost), Err: err.Error()})
			}),
			gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				out.emit(event{Kind: "lock_error", Busy: errors.Is(err, fencelock.ErrNotObtained), Err: err.Error()})
			}),
		))
	if err != nil {
		_ = s.Shutdown()
		return err
	}
	s.Start()
	for in.Scan() {
		// Run until the test closes stdin.
	}
	if err := s.Shutdown(); err != nil {
		return err
	}
	_ = locker.Close()
	out.emit(event{Kind: "bye"})
	return nil
}
