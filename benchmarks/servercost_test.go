package benchmarks

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/fencelock/fencelock"
	"github.com/redis/go-redis/v9"

	"github.com/fencelock/fencelock/internal/redistest"
)

// BenchmarkServerCost reports what redis-server's INFO commandstats says one
// call costs it (usec-per-call, the command's own time, a script's inner
// calls included), b.N calls each on one server: empty scripts without and
// with fencelock's arguments (five keys and four or five ARGV), raw's
// compare-and-delete, a SET NX PX, and fencelock's acquire and release of
// a free lock nobody waits for (b.N acquisitions of distinct names, then
// their releases, through the library). Run it pinned, as the uncontended
// benchmarks:
//
//	taskset -c 1 go test -run '^$' -bench '^BenchmarkServerCost$' -benchtime 2000x
func BenchmarkServerCost(b *testing.B) {
	srv := startServer(b)
	c := newGoRedis(b, srv.Addr)
	ctx := context.Background()
	keys := []string{"k{n}", "k{n}:t:aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", "k{n}:fence", "k{n}:q", "k{n}:qi"}
	argv := []any{"aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", 10000, 3600000, "host (pid 1)"}
	scripts := []struct {
		name, src string
		keys      []string
		argv      []any
	}{
		{"empty-script", "return 1", nil, nil},
		{"empty-script-5-keys-4-args", "return 1", keys, argv},
		{"raw-release", rawReleaseLua, keys[:1], argv[:1]},
	}
	for _, s := range scripts {
		script := redis.NewScript(s.src)
		b.Run(s.name, func(b *testing.B) {
			must(b, script.Load(ctx, c).Err())
			resetStat(b, srv)
			for range b.N {
				if s.name == "raw-release" { // a lock to delete: GET and DEL
					must(b, c.Set(ctx, s.keys[0], s.argv[0], ttl).Err())
				}
				must(b, script.Run(ctx, c, s.keys, s.argv...).Err())
			}
			reportUsec(b, srv, "evalsha")
		})
	}
	b.Run("set-nx-px", func(b *testing.B) {
		resetStat(b, srv)
		for i := range b.N {
			must(b, c.SetNX(ctx, "set:"+strconv.Itoa(i), "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", ttl).Err())
		}
		reportUsec(b, srv, "set")
	})
	l, err := fencelock.New(c, &fencelock.Options{TTL: ttl})
	must(b, err)
	closeLater(b, l)
	warm, err := l.Acquire(ctx, "warm") // loads the scripts; a Locker's first release publishes
	must(b, err)
	must(b, warm.Release(ctx))
	runs := 0
	acquire := func(b *testing.B) []*fencelock.Lease {
		runs++
		leases := make([]*fencelock.Lease, b.N)
		for i := range leases {
			leases[i], err = l.Acquire(ctx, fmt.Sprintf("cost:%d:%d", runs, i))
			must(b, err)
		}
		return leases
	}
	b.Run("fencelock-acquire", func(b *testing.B) {
		resetStat(b, srv)
		leases := acquire(b)
		reportUsec(b, srv, "evalsha")
		for _, lease := range leases {
			must(b, lease.Release(ctx))
		}
	})
	b.Run("fencelock-release", func(b *testing.B) {
		leases := acquire(b)
		resetStat(b, srv)
		for _, lease := range leases {
			must(b, lease.Release(ctx))
		}
		reportUsec(b, srv, "evalsha")
	})
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

func resetStat(b *testing.B, srv *redistest.Server) {
	b.Helper()
	_, err := serverDo(srv, "CONFIG", "RESETSTAT")
	must(b, err)
}

// reportUsec reports cmd's usec_per_call as usec/call, and logs every
// command's calls and usec_per_call (a script's inner calls).
func reportUsec(b *testing.B, srv *redistest.Server, cmd string) {
	b.Helper()
	v, err := serverDo(srv, "INFO", "commandstats")
	must(b, err)
	text, _ := v.(string)
	var parts []string
	for line := range strings.Lines(text) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found || strings.HasPrefix(name, "config") || name == "info" {
			continue
		}
		var calls int64
		var usec float64
		for f := range strings.SplitSeq(fields, ",") {
			k, val, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(val, 10, 64)
			case "usec_per_call":
				usec, _ = strconv.ParseFloat(val, 64)
			}
		}
		if name == cmd {
			b.ReportMetric(usec, "usec/call")
		}
		parts = append(parts, fmt.Sprintf("%s %.2f/op %.2f µs", name, float64(calls)/float64(b.N), usec))
	}
	b.Logf("%s", strings.Join(parts, "; "))
}
