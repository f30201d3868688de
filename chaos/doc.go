// Package chaos is fencelock's fault-injection suite. It has no API: run it
// with
//
//	cd chaos && go test -count=1 -v ./...
//
// The tests start real redis-server and Sentinel processes on free loopback
// ports, re-execute the test binary as lock-holding worker processes that
// reach Redis through fault-injecting TCP proxies, pause, kill, partition and
// fail over those processes, and check what the lock and its fencing tokens
// guaranteed: on one Redis deployment (New: scenarios S0-S6) and on five
// independent ones (NewRedlock: scenarios R0-R4, where each worker reaches
// each node through a proxy of its own), and for a semaphore of 2 permits
// (fencelock.Semaphore: scenario N1, the pauses, partitions and restarts of
// S1, S2 and S5 in turn, with four workers). S0-S3 run twice: with plain
// waiters (WithWait) and with fair ones (WithWait and WithFair, the
// workers' Fair setting), on the same faults. The workers hold the lock
// through go-redis; the paused holder (S1) and the failovers (S3, S4) run
// again, with plain waiters, on rueidis and on valkey-go, through their
// adapters (fencerueidis, fencevalkey: the workers' Client setting), each
// row naming its client. GUARANTEES.md at the repository root reports the
// runs.
//
// FENCELOCK_CHAOS_LOG=1 gives the workers a debug-level fencelock logger on
// their stderr, which a failed scenario (or FENCELOCK_CHAOS_DUMP=1) writes
// to the artifact directory with their events.
//
// The suite is a module of its own so that its dependencies (porcupine among
// them) never reach fencelock's users.
package chaos
