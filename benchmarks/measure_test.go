package benchmarks

import (
	"context"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fencelock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Resolution of latencies: each power of two is split into 1<<latSubBits
// buckets, so a bucket is at most 1/128 (0.8 %) of its values wide.
const (
	latSubBits = 7
	latSub     = 1 << latSubBits
	latBuckets = (64 - latSubBits) * latSub
)

// latencies is a histogram of durations with a resolution of 1/128 of the
// value: percentiles of any number of operations in 29 KB, and no allocation
// while recording (the benchmarks report allocations per operation).
type latencies struct {
	counts [latBuckets]uint32
	n      int64
	sum    time.Duration
}

func latBucket(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < latSub {
		return int(v)
	}
	shift := bits.Len64(v) - 1 - latSubBits
	return (shift+1)<<latSubBits + int(v>>shift) - latSub
}

// latValue is the middle of bucket i.
func latValue(i int) time.Duration {
	if i < latSub {
		return time.Duration(i)
	}
	shift := i>>latSubBits - 1
	lo := uint64(i&(latSub-1)+latSub) << shift
	return time.Duration(lo + (uint64(1)<<shift)/2)
}

func (l *latencies) add(d time.Duration) {
	l.counts[latBucket(d)]++
	l.n++
	l.sum += d
}

// percentile returns the p-th percentile (nearest rank, as percentile does),
// to the histogram's resolution, or 0 for none.
func (l *latencies) percentile(p float64) time.Duration {
	if l.n == 0 {
		return 0
	}
	rank := int64(p/100*float64(l.n)+0.999999999) - 1
	rank = min(max(rank, 0), l.n-1)
	var cum int64
	for i, c := range l.counts {
		cum += int64(c)
		if cum > rank {
			return latValue(i)
		}
	}
	return latValue(latBuckets - 1)
}

func (l *latencies) mean() time.Duration {
	if l.n == 0 {
		return 0
	}
	return l.sum / time.Duration(l.n)
}

// report adds p50-ns/op and mean-ns/op, their units prefixed with prefix.
func (l *latencies) report(b *testing.B, prefix string) {
	if l.n == 0 {
		return
	}
	b.ReportMetric(float64(l.percentile(50)), prefix+"p50-ns/op")
	b.ReportMetric(float64(l.mean()), prefix+"mean-ns/op")
}

// commandStats logs, with -cmdstats, what INFO commandstats says the servers
// ran per operation: each command's calls per op and microseconds per call.
// Commands run by a script are counted both on their own lines and in the
// script's (EVALSHA's) time.
type commandStats struct {
	servers []*redistest.Server
}

// newCmdStats resets the servers' statistics (CONFIG RESETSTAT), with
// -cmdstats; it returns nil otherwise.
func newCmdStats(b *testing.B, servers ...*redistest.Server) *commandStats {
	if !*cmdStats {
		return nil
	}
	for _, srv := range servers {
		if _, err := serverDo(srv, "CONFIG", "RESETSTAT"); err != nil {
			b.Fatalf("CONFIG RESETSTAT: %v", err)
		}
	}
	return &commandStats{servers: servers}
}

// log logs one line per command, summed over the servers, per b.N.
func (c *commandStats) log(b *testing.B) {
	if c != nil {
		c.logPer(b, b.N, "ops")
	}
}

// logPer logs one line per command, summed over the servers, per one of n
// operations called what.
func (c *commandStats) logPer(b *testing.B, n int, what string) {
	if c == nil || n == 0 {
		return
	}
	calls := make(map[string]float64)
	usec := make(map[string]float64)
	for _, srv := range c.servers {
		v, err := serverDo(srv, "INFO", "commandstats")
		if err != nil {
			b.Errorf("INFO commandstats: %v", err)
			return
		}
		text, _ := v.(string)
		for line := range strings.Lines(text) {
			name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
			name, found := strings.CutPrefix(name, "cmdstat_")
			if !ok || !found {
				continue
			}
			for f := range strings.SplitSeq(fields, ",") {
				k, val, _ := strings.Cut(f, "=")
				x, err := strconv.ParseFloat(val, 64)
				if err != nil {
					continue
				}
				switch k {
				case "calls":
					calls[name] += x
				case "usec":
					usec[name] += x
				}
			}
		}
	}
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(calls)) {
		perOp := calls[name] / float64(n)
		if perOp < 0.01 {
			continue // the benchmark's own INFO, a stray PING
		}
		lines = append(lines, fmt.Sprintf("%s %.2f calls/op %.2f µs/call", name, perOp, usec[name]/calls[name]))
	}
	b.Logf("commandstats over %d %s: %s", n, what, strings.Join(lines, "; "))
}

// serverDo sends one command to srv on a connection of its own, bounded by
// 5 seconds.
func serverDo(srv *redistest.Server, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, args...).Result()
}
