// Package fencegocron is a distributed Locker for gocron v2
// (github.com/go-co-op/gocron/v2) backed by fencelock: when several
// instances of a service schedule the same job, one of them runs each tick.
//
//	locker := fencegocron.NewLocker(fl, fencegocron.WithMinHold(30*time.Second))
//	defer locker.Close()
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//	...
//	_, err = s.NewJob(gocron.DurationJob(time.Minute),
//		locker.Task(func(ctx context.Context, lease *fencelock.Lease) error {
//			// ctx is cancelled (cause fencelock.ErrLost) if the lock is lost.
//			return settle(ctx, lease.Fence()) // UPDATE ... WHERE status = 'pending' AND fence_token < $fence
//		}),
//		gocron.WithName("settlement"))
//
// The package is named fencegocron, not gocron, so that it can be imported
// next to gocron itself without an alias.
//
// # What gocron lets a Locker do
//
// gocron calls Locker.Lock with the job's context and name before each run,
// skips the run when Lock fails, and calls the returned Lock's Unlock when
// the run ends. Lock takes the lock called by the job's name and starts its
// watchdog (fencelock's Lease.KeepAlive), which renews it while the job
// runs; Unlock releases it. gocron cancels the job's context at shutdown
// (or when the job is removed) while the job function may still run: the
// lock stays held until it returns.
//
// gocron hands the job function a context of its own: one per job, not per
// run, cancelled only when the job is removed or the scheduler shuts down.
// A Locker cannot replace it, and must not cancel it (that would remove the
// job from the scheduler). So a plain gocron task is not told when its lock
// is lost. A task made with Locker.Task is: it runs on a context of its own
// run, cancelled with cause fencelock.ErrLost as soon as the lock is no
// longer certainly held, and with gocron's cause when the job's context
// ends (the lock stays held until the task returns), and receives the run's
// Lease, whose Fence the job passes to what it writes. Locker.Task finds its
// run's lease through the context
// gocron passed to both Lock and the task, so it works only with the
// Locker the scheduler (WithDistributedLocker) or the job
// (WithDistributedJobLocker) was given, and only when the task gets
// gocron's context (do not pass a context of your own to the task).
//
// gocron ignores the error Unlock returns, and passes it the job's context,
// which a shutdown has cancelled by then: Unlock releases on a context that
// is not cancelled, bounded by fencelock's Options.ReleaseTimeout. A loss is
// reported by the task's error (it matches fencelock.ErrLost; gocron passes
// it to an AfterJobRunsWithError listener) and by fencelock's
// Options.OnLost.
//
// # Time splay
//
// gocron's schedulers fire each on its own clock and timers, so the same
// tick fires at slightly different moments in different instances. A lock
// that is released as soon as a short job ends lets a scheduler that fires
// a little later take it and run the same tick again. WithMinHold keeps the
// lock at least that long after it was acquired, so that a scheduler firing
// up to that much later finds it taken. Set it longer than the spread of your
// schedulers' firings and shorter than the job's interval; align the firings
// with a cron schedule, or with gocron.WithStartAt for a duration job.
//
// # What a lock cannot promise
//
// This is fencelock's lock: an efficiency lock. A process paused past the
// lock's TTL, or a Redis failover, can let a second instance run the job
// while the first still does. The first instance's task context is
// cancelled when it can run again, which may be after it wrote; pass
// lease.Fence to every write and let the resource refuse an old one. The
// fence refuses the first instance's write only once the second has
// written: a job meant to run once per tick also writes conditionally on
// the row's state (AND status = 'pending'), as the example does.
package fencegocron
