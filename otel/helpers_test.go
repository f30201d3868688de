package fencelockotel_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/redistest"
	fencelockotel "github.com/fencelock/fencelock/otel"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// env is one test's Redis (a server of its own), and the OpenTelemetry SDK
// with in-memory exporters that the Observer reports to.
type env struct {
	srv        *redistest.Server
	rdb, admin *redis.Client
	prefix     string

	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	obs    *fencelockotel.Observer
}

func newEnv(t *testing.T, opts ...fencelockotel.Option) *env {
	t.Helper()
	srv := redistest.Start(t)
	e := &env{
		srv:    srv,
		rdb:    srv.Client(&redis.Options{ContextTimeoutEnabled: true}),
		admin:  srv.Client(nil),
		prefix: "fencelockotel-test:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":",
		spans:  tracetest.NewSpanRecorder(),
		reader: sdkmetric.NewManualReader(),
	}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		_ = e.tp.Shutdown(t.Context())
		_ = mp.Shutdown(t.Context())
	})
	obs, err := fencelockotel.NewObserver(append([]fencelockotel.Option{
		fencelockotel.WithTracerProvider(e.tp), fencelockotel.WithMeterProvider(mp)}, opts...)...)
	require.NoError(t, err)
	e.obs = obs
	return e
}

// locker returns a Locker on the test's Redis with the test's Observer;
// t.Cleanup closes it.
func (e *env) locker(t *testing.T, o fencelock.Options) *fencelock.Locker {
	t.Helper()
	o.KeyPrefix = e.prefix
	o.Observer = e.obs
	l, err := fencelock.New(e.rdb, &o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// uniqueName returns a lock name unique to the test.
func uniqueName(t *testing.T) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
}

// ended returns the ended spans called name.
func (e *env) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the one ended span called name.
func (e *env) one(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := e.ended(name)
	require.Len(t, spans, 1, "spans called %s", name)
	return spans[0]
}

// attr returns the span's or event's attribute key, and whether it has it.
func attr(kvs []attribute.KeyValue, key string) (attribute.Value, bool) {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// point is one data point of an instrument: its attributes, and its count
// (histograms) or its value (counters), and a histogram's sum.
type point struct {
	attrs attribute.Set
	count int64
	sum   float64
}

// instrument is what the reader collected of one instrument.
type instrument struct {
	unit   string
	points []point
}

// collect returns what the Observer's instruments recorded, by name.
func (e *env) collect(t *testing.T) map[string]instrument {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(t.Context(), &rm))
	out := map[string]instrument{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			in := instrument{unit: m.Unit}
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					in.points = append(in.points, point{attrs: p.Attributes, count: int64(p.Count), sum: p.Sum})
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					in.points = append(in.points, point{attrs: p.Attributes, count: p.Value})
				}
			default:
				t.Fatalf("instrument %s: unexpected aggregation %T", m.Name, m.Data)
			}
			out[m.Name] = in
		}
	}
	return out
}

// byOutcome returns an instrument's counts (histograms) or values
// (counters) by the attribute fencelock.outcome ("" for none).
func (in instrument) byOutcome() map[string]int64 {
	out := map[string]int64{}
	for _, p := range in.points {
		v, _ := p.attrs.Value("fencelock.outcome")
		out[v.AsString()] += p.count
	}
	return out
}
