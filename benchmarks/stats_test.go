package benchmarks

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		ds := make([]time.Duration, len(ns))
		for i, n := range ns {
			ds[i] = time.Duration(n) * time.Millisecond
		}
		return ds
	}
	tests := []struct {
		name string
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{"none", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of odd", ms(3, 1, 2), 50, 2 * time.Millisecond},
		{"median of even takes the lower", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p99 of 100", ms(seq(100)...), 99, 99 * time.Millisecond},
		{"p99 of 10 is the max", ms(seq(10)...), 99, 10 * time.Millisecond},
		{"p100", ms(5, 9, 1), 100, 9 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.ds, tt.p); got != tt.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tt.ds, tt.p, got, tt.want)
			}
		})
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i + 1
	}
	return s
}

func TestJain(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"none", nil, 0},
		{"all zero", []float64{0, 0}, 0},
		{"equal", []float64{5, 5, 5, 5}, 1},
		{"one has all", []float64{8, 0, 0, 0}, 0.25},
		{"two to one", []float64{2, 1}, 0.9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := jain(tt.xs); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("jain(%v) = %v, want %v", tt.xs, got, tt.want)
			}
		})
	}
}
