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
			want:  []string{"### Targets", "| Uncontended ns/op ≤ 1.10 × raw | 1000 vs 1000: 1.00× | yes |", "not measured"},
			wantN: []string{"Redlock targets"},
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
