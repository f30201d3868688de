package fencegocron_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock"
	fencegocron "github.com/fencelock/fencelock/gocron"
)

var db *sql.DB // the service's database

// Every instance of a settlement service schedules the day's settlement at
// 00:05; one of them runs it. The fence guards the write against an
// instance that lost the lock without knowing it (a long pause).
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	fl, err := fencelock.New(rdb, nil) // TTL 30s, renewed every 10s
	if err != nil {
		panic(err)
	}
	defer fl.Close()
	// The instances' schedulers fire within a second or so of each other:
	// keep the lock a minute, so that a late one finds it taken.
	locker := fencegocron.NewLocker(fl, fencegocron.WithMinHold(time.Minute))
	defer locker.Close()

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		panic(err)
	}
	defer func() { _ = s.Shutdown() }() // before locker.Close: deferred calls run last first

	_, err = s.NewJob(gocron.CronJob("5 0 * * *", false),
		locker.Task(func(ctx context.Context, lease *fencelock.Lease) error {
			// ctx is cancelled (cause fencelock.ErrLost) if the lock is lost.
			day := time.Now().AddDate(0, 0, -1).Format(time.DateOnly)
			res, err := db.ExecContext(ctx, `UPDATE settlements SET status = 'done', fence_token = $1
				WHERE settle_date = $2 AND status = 'pending' AND fence_token < $1`, lease.Fence(), day)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				return fmt.Errorf("settlement %s: done already, or a newer holder wrote first (fence %d)", day, lease.Fence())
			}
			return nil
		}),
		gocron.WithName("settlement"), // the lock's name: the same in every instance
		gocron.WithEventListeners(
			gocron.AfterLockError(func(_ uuid.UUID, job string, err error) {
				if !errors.Is(err, fencelock.ErrNotObtained) { // busy: another instance runs it
					slog.Error("job not run: no lock", "job", job, "error", err)
				}
			}),
			gocron.AfterJobRunsWithError(func(_ uuid.UUID, job string, err error) {
				// errors.Is(err, fencelock.ErrLost): the lock was lost while it ran.
				slog.Error("job failed", "job", job, "error", err)
			}),
		))
	if err != nil {
		panic(err)
	}
	s.Start()
	// ... serve until shutdown
}
