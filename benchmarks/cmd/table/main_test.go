package main

import (
	"bytes"
	"strings"
	"testing"
)

// parse reads go test -bench output from a string.
func parse(t *testing.T, in string) *results {
	t.Helper()
	r := &results{runs: make(map[string]map[string]map[string][]float64)}
	if err := r.parse(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestTargetsBySuite(t *testing.T) {
	const single = `
BenchmarkUncontended/fencelock   100  1000 ns/op  33 allocs/op
BenchmarkUncontended/raw         100  1000 ns/op  20 allocs/op
`
	const redlock = `
BenchmarkRedlockUncontended/fencelock-2  100  1500 ns/op
BenchmarkRedlockUncontended/redsync-2    100  1000 ns/op
BenchmarkRedlockContended/fencelock-2    1  1 ns/op  500 cs/s  0.5 handoff-p50-ms  0 overlaps
BenchmarkRedlockContended/redsync-2      1  1 ns/op  200 cs/s  1.5 handoff-p50-ms  0 overlaps
`
	tests := []struct {
		name        string
		in          string
		met         bool
		want, wantN []string // in the output; not in it
	}{
		{
			name:  "redlock only: its targets, all met",
			in:    redlock,
			met:   true,
			want:  []string{"### Redlock targets", "| RedlockUncontended ns/op ≤ 1.6 × redsync's | 1500 vs 1000: 1.50× | yes |", "| RedlockContended cs/s ≥ 2 × redsync's | 500 vs 200: 2.50× | yes |", "| RedlockContended handoff-p50 < redsync's | 0.5000 ms vs 1.50 ms: 0.33× | yes |", "| RedlockContended overlaps = 0 | 0 | yes |"},
			wantN: []string{"### Targets", "rueidislock"},
		},
		{
			name: "redlock with waiters as processes: their targets too",
			in: redlock + `
BenchmarkRedlockContendedProcs/fencelock-2  1  1 ns/op  300 cs/s  0.5 handoff-p50-ms  0 overlaps
BenchmarkRedlockContendedProcs/redsync-2    1  1 ns/op  200 cs/s  1.0 handoff-p50-ms  1 overlaps
`,
			want: []string{"| RedlockContended cs/s ≥ 2 × redsync's | 500 vs 200: 2.50× | yes |", "| RedlockContendedProcs cs/s ≥ 2 × redsync's | 300 vs 200: 1.50× | **no** |", "| RedlockContendedProcs handoff-p50 < redsync's | 0.5000 ms vs 1.00 ms: 0.50× | yes |", "| RedlockContendedProcs overlaps = 0 | 1.00 | **no** |"},
		},
		{
			name: "redlock behind",
			in:   strings.ReplaceAll(strings.ReplaceAll(redlock, "1500 ns/op", "1700 ns/op"), "500 cs/s", "300 cs/s"),
			want: []string{"| RedlockUncontended ns/op ≤ 1.6 × redsync's | 1700 vs 1000: 1.70× | **no** |", "| RedlockContended cs/s ≥ 2 × redsync's | 300 vs 200: 1.50× | **no** |"},
		},
		{
			name: "rounds: the ratios of the runs paired in order",
			in:   redlock + strings.ReplaceAll(strings.ReplaceAll(redlock, "1500 ns/op", "1800 ns/op"), "200 cs/s", "250 cs/s"),
			want: []string{"| RedlockUncontended ns/op ≤ 1.6 × redsync's | 1650 vs 1000: 1.65× (runs paired in order: 1.50–1.80×) | **no** |", "| RedlockContended cs/s ≥ 2 × redsync's | 500 vs 225: 2.22× (runs paired in order: 2.00–2.50×) | yes |"},
		},
		{
			name:  "single only: the single-deployment targets",
			in:    single,
			want:  []string{"### Targets", "| 13: Uncontended ns/op ≤ 1.10 × raw (fencelock) | 1000 vs 1000: 1.00× | yes |", "not measured"},
			wantN: []string{"Redlock targets", "(fencelock-cte)"},
		},
		{
			name: "issue 13 targets for both fencelock variants",
			in: `
BenchmarkUncontended/fencelock      100  1200 ns/op  1150 p50-ns/op  30 allocs/op
BenchmarkUncontended/fencelock-cte  100  1050 ns/op  1000 p50-ns/op  25 allocs/op
BenchmarkUncontended/raw            100  1000 ns/op  1000 p50-ns/op  20 allocs/op
BenchmarkParallel/fencelock         100  1000 ns/op
BenchmarkParallel/fencelock-cte     100   800 ns/op
BenchmarkParallel/rueidislock       100  1000 ns/op
BenchmarkContendedHandoff/fencelock-2  1  1 ns/op  500 cs/s  2 overlaps
`,
			want: []string{
				"| 13: Uncontended ns/op ≤ 1.10 × raw (fencelock) | 1200 vs 1000: 1.20× | **no** |",
				"| 13: Uncontended p50-ns/op ≤ 1.10 × raw (fencelock) | 1150 vs 1000: 1.15× | **no** |",
				"| 13: Uncontended allocs/op ≤ 25 (fencelock) | 30.0 | **no** |",
				"| 13: Parallel throughput ≥ 1.25 × rueidislock's (fencelock) | 1000 vs 1000 ns/op: 1.00× | **no** |",
				"| 13: Uncontended ns/op ≤ 1.10 × raw (fencelock-cte) | 1050 vs 1000: 1.05× | yes |",
				"| 13: Uncontended p50-ns/op ≤ 1.10 × raw (fencelock-cte) | 1000 vs 1000: 1.00× | yes |",
				"| 13: Uncontended allocs/op ≤ 25 (fencelock-cte) | 25.0 | yes |",
				"| 13: Parallel throughput ≥ 1.25 × rueidislock's (fencelock-cte) | 800 vs 1000 ns/op: 1.25× | yes |",
				"| Contended* overlaps = 0 | 2.00 | **no** |",
				"fencelock-cte ÷ each other implementation",
				"### ContendedHandoff\n",
			},
		},
		{
			name: "issue 16 targets for fair waiting: met, from the medians, runs paired",
			in: `
BenchmarkContended/fencelock-fair-2  1  1 ns/op  0.20 handoff-p50-ms  0.999 fairness  0 overlaps
BenchmarkContended/rueidislock-2     1  1 ns/op  0.50 handoff-p50-ms  0.950 fairness  0 overlaps
BenchmarkContended/raw-1ms-2         1  1 ns/op  0.25 handoff-p50-ms  0.990 fairness  0 overlaps
BenchmarkContended/fencelock-fair-2  1  1 ns/op  0.30 handoff-p50-ms  0.995 fairness  0 overlaps
BenchmarkContended/rueidislock-2     1  1 ns/op  0.50 handoff-p50-ms  0.950 fairness  0 overlaps
BenchmarkContended/raw-1ms-2         1  1 ns/op  0.35 handoff-p50-ms  0.990 fairness  0 overlaps
BenchmarkContendedHandoff/fencelock-fair-2  1  1 ns/op  0.90 handoff-p50-ms  0.5 fairness  0 overlaps
`,
			want: []string{
				"| 16: Contended handoff-p50 ≤ 0.6 × rueidislock's (fencelock-fair) | 0.2500 ms vs 0.5000 ms: 0.50× (runs paired in order: 0.40–0.60×) | yes |",
				"| 16: Contended handoff-p50 < raw-1ms's (fencelock-fair) | 0.2500 ms vs 0.3000 ms: 0.83× (runs paired in order: 0.80–0.86×) | yes |",
				"| 16: Contended fairness ≥ 0.99 (fencelock-fair) | 0.9970 (lowest run 0.9950) | yes |",
				"fencelock-fair ÷ each other implementation",
				"| raw-1ms | ",
			},
			wantN: []string{"13: Uncontended ns/op ≤ 1.10 × raw (fencelock-fair)", "Parallel throughput ≥ 1.25 × rueidislock's (fencelock-fair)"},
		},
		{
			name: "issue 16 targets not met, or not measured",
			in: `
BenchmarkContended/fencelock-fair-2  1  1 ns/op  0.31 handoff-p50-ms  0.98 fairness  0 overlaps
BenchmarkContended/rueidislock-2     1  1 ns/op  0.50 handoff-p50-ms  0.95 fairness  0 overlaps
`,
			want: []string{
				"| 16: Contended handoff-p50 ≤ 0.6 × rueidislock's (fencelock-fair) | 0.3100 ms vs 0.5000 ms: 0.62× | **no** |",
				"| 16: Contended handoff-p50 < raw-1ms's (fencelock-fair) | 0.3100 ms vs – ms: – | not measured |",
				"| 16: Contended fairness ≥ 0.99 (fencelock-fair) | 0.9800 (lowest run 0.9800) | **no** |",
			},
		},
		{
			name: "interleaved: one benchmark, IMPL:UNIT metrics; rounds paired",
			in: `
BenchmarkInterleaved  100  9000 ns/op  1200 fencelock:p50-ns/op  1300 fencelock:mean-ns/op  1000 raw:p50-ns/op  1100 raw:mean-ns/op  5 allocs/op
BenchmarkInterleaved  100  9000 ns/op  1050 fencelock:p50-ns/op  1300 fencelock:mean-ns/op  1000 raw:p50-ns/op  1100 raw:mean-ns/op  5 allocs/op
`,
			want: []string{
				"### Interleaved\n",
				"| fencelock | 1125 ±7% | 1300 |",
				"| 13: Interleaved p50-ns/op ≤ 1.10 × raw (fencelock) | 1125 vs 1000: 1.12× (runs paired in order: 1.05–1.20×) | **no** |",
			},
			wantN: []string{"| 9000"},
		},
		{
			name: "both",
			in:   single + redlock,
			want: []string{"### Targets", "### Redlock targets", "### RedlockUncontended", "### Uncontended"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			met := parse(t, tt.in).write(&out)
			if met != tt.met {
				t.Errorf("met = %v, want %v", met, tt.met)
			}
			for _, s := range tt.want {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output lacks %q:\n%s", s, out.String())
				}
			}
			for _, s := range tt.wantN {
				if strings.Contains(out.String(), s) {
					t.Errorf("output has %q:\n%s", s, out.String())
				}
			}
		})
	}
}
