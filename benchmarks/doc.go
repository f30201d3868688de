// Package benchmarks compares fencelock with other Go Redis locks
// (github.com/bsm/redislock, github.com/go-redsync/redsync/v4,
// github.com/redis/rueidis/rueidislock) and with a raw two-round-trip
// baseline (SET NX with a TTL, then a compare-and-delete script), all against
// one real redis-server started for the run; and fencelock's Redlock
// (NewRedlock) with go-redsync's, both over five redis-servers.
//
// It is a separate module so that the library does not depend on its peers.
// The benchmarks are in the _test.go files; see README.md for the command,
// the flags and the results, and cmd/table for turning `go test -bench`
// output into the README's ratio tables.
package benchmarks
