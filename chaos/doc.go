// Package chaos is fencelock's fault-injection suite. It has no API: run it
// with
//
//	cd chaos && go test -count=1 -v ./...
//
// The tests start real redis-server and Sentinel processes on free loopback
// ports, re-execute the test binary as lock-holding worker processes that
// reach Redis through fault-injecting TCP proxies, pause, kill, partition and
// fail over those processes, and check what the lock and its fencing tokens
// guaranteed. GUARANTEES.md at the repository root reports one run.
//
// The suite is a module of its own so that its dependencies (porcupine among
// them) never reach fencelock's users.
package chaos
