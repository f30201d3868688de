package benchmarks

import (
	"math"
	"math/rand/v2"
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

func TestLatencies(t *testing.T) {
	// Every value lands in a bucket whose middle is within 1/128 of it.
	for _, d := range []time.Duration{0, 1, 127, 128, 129, 255, 256, 1000, 45_804, 99_999, 1 << 40, 1<<62 + 12345} {
		got := latValue(latBucket(d))
		if diff := math.Abs(float64(got - d)); diff > float64(d)/latSub {
			t.Errorf("latValue(latBucket(%d)) = %d, off by %.0f", d, got, diff)
		}
	}
	for i := 1; i < latBuckets; i++ {
		if latValue(i) <= latValue(i-1) {
			t.Fatalf("bucket %d's value %d is not above bucket %d's %d", i, latValue(i), i-1, latValue(i-1))
		}
	}

	// Percentiles agree with percentile's, exact on the same data, to the
	// resolution; the mean is exact.
	rng := rand.New(rand.NewPCG(1, 2))
	var l latencies
	var ds []time.Duration
	var sum time.Duration
	for range 10_000 {
		d := 40*time.Microsecond + time.Duration(rng.ExpFloat64()*float64(15*time.Microsecond))
		l.add(d)
		ds = append(ds, d)
		sum += d
	}
	for _, p := range []float64{1, 50, 90, 99, 100} {
		got, want := l.percentile(p), percentile(ds, p)
		if diff := math.Abs(float64(got - want)); diff > float64(want)/latSub {
			t.Errorf("percentile(%v) = %v, exact %v", p, got, want)
		}
	}
	if got, want := l.mean(), sum/time.Duration(len(ds)); got != want {
		t.Errorf("mean = %v, want %v", got, want)
	}
	var empty latencies
	if got := empty.percentile(50); got != 0 {
		t.Errorf("percentile of none = %v, want 0", got)
	}
}
