package fencelockotel_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fencelock/fencelock"
	fencelockotel "github.com/fencelock/fencelock/otel"
)

func TestRunWithLock(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, fencelock.Options{TTL: 300 * time.Millisecond}) // renewed every 100ms
	name := uniqueName(t)
	var fence int64
	err := l.RunWithLock(t.Context(), name, func(ctx context.Context, lease *fencelock.Lease) error {
		fence = lease.Fence()
		_, span := e.tp.Tracer("test").Start(ctx, "work")
		defer span.End()
		time.Sleep(250 * time.Millisecond) // two renewals
		return nil
	})
	require.NoError(t, err)

	run := e.one(t, "fencelock.run")
	assert.False(t, run.Parent().IsValid(), "the run's span is a root here")
	assert.Equal(t, codes.Unset, run.Status().Code)
	assertAttr(t, run, "fencelock.lock.name", name)
	assertAttr(t, run, "fencelock.outcome", "ok")
	assertAttr(t, run, "fencelock.fence", fence)
	var renewals int
	for _, ev := range run.Events() {
		require.Equal(t, "fencelock.renew", ev.Name)
		v, _ := attr(ev.Attributes, "fencelock.outcome")
		assert.Equal(t, "ok", v.AsString())
		renewals++
	}
	assert.GreaterOrEqual(t, renewals, 1, "renewals are events of the run's span")

	for _, child := range []string{"fencelock.acquire", "work", "fencelock.release"} {
		s := e.one(t, child)
		assert.Equal(t, run.SpanContext().TraceID(), s.SpanContext().TraceID(), child)
		assert.Equal(t, run.SpanContext().SpanID(), s.Parent().SpanID(), "%s is a child of the run's span", child)
	}
	acq, rel := e.one(t, "fencelock.acquire"), e.one(t, "fencelock.release")
	assertAttr(t, acq, "fencelock.fence", fence)
	assertAttr(t, acq, "fencelock.outcome", "ok")
	assertAttr(t, rel, "fencelock.fence", fence)
	hold, ok := attr(rel.Attributes(), "fencelock.lease.hold_time")
	require.True(t, ok)
	assert.GreaterOrEqual(t, hold.AsFloat64(), 0.25)

	m := e.collect(t)
	assert.Equal(t, map[string]int64{"ok": 1}, m["fencelock.acquire.duration"].byOutcome())
	assert.Equal(t, "s", m["fencelock.acquire.duration"].unit)
	assert.Equal(t, map[string]int64{"ok": int64(renewals)}, m["fencelock.lease.renewals"].byOutcome())
	assert.Equal(t, "{renewal}", m["fencelock.lease.renewals"].unit)
	holds := m["fencelock.lease.hold_time"]
	assert.Equal(t, "s", holds.unit)
	require.Len(t, holds.points, 1)
	assert.Equal(t, map[string]int64{"ok": 1}, holds.byOutcome())
	assert.GreaterOrEqual(t, holds.points[0].sum, 0.25)
	assert.NotContains(t, m, "fencelock.lease.lost")
	assert.NotContains(t, m, "fencelock.acquire.wait_time", "nothing waited")
}

func TestBusyWaitAndHandoff(t *testing.T) {
	e := newEnv(t)
	// Backoffs longer than the test: the waiter tries again only when a
	// wake-up comes, so its hand-off is known.
	l := e.locker(t, fencelock.Options{TTL: 5 * time.Second, MinRetryBackoff: 10 * time.Second, MaxRetryBackoff: 10 * time.Second})
	name := uniqueName(t)
	ctx := t.Context()
	held, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, fencelock.ErrNotObtained)

	acqs := e.ended("fencelock.acquire")
	require.Len(t, acqs, 2)
	busy := acqs[1]
	assertAttr(t, busy, "fencelock.outcome", "busy")
	assert.Equal(t, codes.Unset, busy.Status().Code, "a busy lock is an answer, not an error")
	_, hasFence := attr(busy.Attributes(), "fencelock.fence")
	assert.False(t, hasFence, "no lease, no fence")

	// A waiter woken by the release: its wait and its hand-off.
	released := make(chan error, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		released <- held.Release(context.Background())
	}()
	waiter, err := l.Acquire(ctx, name, fencelock.WithWait(5*time.Second))
	require.NoError(t, err)
	require.NoError(t, <-released)
	require.NoError(t, waiter.Release(ctx))

	acqs = e.ended("fencelock.acquire")
	require.Len(t, acqs, 3)
	waited := acqs[2]
	assertAttr(t, waited, "fencelock.outcome", "ok")
	assertAttr(t, waited, "fencelock.fence", waiter.Fence())
	w, ok := attr(waited.Attributes(), "fencelock.acquire.wait_time")
	require.True(t, ok)
	assert.GreaterOrEqual(t, w.AsFloat64(), 0.05)
	h, ok := attr(waited.Attributes(), "fencelock.acquire.handoff_time")
	require.True(t, ok, "woken by the release: the hand-off is known")
	assert.Positive(t, h.AsFloat64())
	assert.Less(t, h.AsFloat64(), 1.0)

	m := e.collect(t)
	assert.Equal(t, map[string]int64{"ok": 2, "busy": 1}, m["fencelock.acquire.duration"].byOutcome())
	assert.Equal(t, map[string]int64{"ok": 1}, m["fencelock.acquire.wait_time"].byOutcome())
	assert.Equal(t, map[string]int64{"": 1}, m["fencelock.acquire.handoff_time"].byOutcome())
	assert.Equal(t, "s", m["fencelock.acquire.handoff_time"].unit)
	assert.Equal(t, map[string]int64{"ok": 2}, m["fencelock.lease.hold_time"].byOutcome())
}

func TestLostAfterAcquire(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, fencelock.Options{TTL: 300 * time.Millisecond})
	name := uniqueName(t)
	ctx := t.Context()
	lease, err := l.Acquire(ctx, name)
	require.NoError(t, err)
	work := lease.KeepAlive(ctx)
	require.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
	<-work.Done()
	require.ErrorIs(t, context.Cause(work), fencelock.ErrLost)
	// Release waits for the watchdog, which reported the loss before it
	// exited.
	require.ErrorIs(t, lease.Release(ctx), fencelock.ErrNotHeld)

	// Acquire's span ended long before: the loss is a span of its own, in
	// Acquire's trace.
	acq, lost := e.one(t, "fencelock.acquire"), e.one(t, "fencelock.lost")
	assert.Equal(t, acq.SpanContext().TraceID(), lost.SpanContext().TraceID())
	assert.Equal(t, acq.SpanContext().SpanID(), lost.Parent().SpanID(), "a child of Acquire's span")
	assert.Equal(t, codes.Error, lost.Status().Code)
	assert.Contains(t, lost.Status().Description, "lost")
	assertAttr(t, lost, "fencelock.lock.name", name)
	assertAttr(t, lost, "fencelock.fence", lease.Fence())
	assertAttr(t, lost, "error.type", "lost")
	_, ok := attr(lost.Attributes(), "fencelock.lease.hold_time")
	assert.True(t, ok)
	assert.Empty(t, acq.Events(), "events on an ended span are dropped: none is added")

	rel := e.one(t, "fencelock.release")
	assert.Equal(t, codes.Error, rel.Status().Code, "released after it was lost: not held")
	assertAttr(t, rel, "error.type", "not_held")

	m := e.collect(t)
	assert.Equal(t, map[string]int64{"": 1}, m["fencelock.lease.lost"].byOutcome())
	assert.Equal(t, "{lease}", m["fencelock.lease.lost"].unit)
	assert.Equal(t, map[string]int64{"lost": 1}, m["fencelock.lease.hold_time"].byOutcome(),
		"held until the loss, and not counted again by the release that found it gone")
	assert.Equal(t, int64(1), m["fencelock.lease.renewals"].byOutcome()["not_held"], "the renewal that found it gone")
}

func TestLostInRunWithLock(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, fencelock.Options{TTL: 300 * time.Millisecond})
	name := uniqueName(t)
	err := l.RunWithLock(t.Context(), name, func(ctx context.Context, lease *fencelock.Lease) error {
		if err := e.admin.Del(ctx, lease.Key()).Err(); err != nil {
			return err
		}
		<-ctx.Done()
		return context.Cause(ctx)
	})
	require.ErrorIs(t, err, fencelock.ErrLost)

	run := e.one(t, "fencelock.run")
	assert.Equal(t, codes.Error, run.Status().Code)
	assertAttr(t, run, "fencelock.outcome", "lost")
	assertAttr(t, run, "error.type", "lost")
	var names []string
	for _, ev := range run.Events() {
		names = append(names, ev.Name)
	}
	assert.Contains(t, names, "fencelock.lost", "the loss is an event of the run's span")
	assert.Empty(t, e.ended("fencelock.lost"), "and not a span of its own")
	assert.Empty(t, e.ended("fencelock.release"), "a lost lease is released in the background, unobserved")

	m := e.collect(t)
	assert.Equal(t, map[string]int64{"": 1}, m["fencelock.lease.lost"].byOutcome())
	assert.Equal(t, map[string]int64{"lost": 1}, m["fencelock.lease.hold_time"].byOutcome())
}

func TestLockNameAttribute(t *testing.T) {
	for _, tc := range []struct {
		desc string
		opts []fencelockotel.Option
		want bool
	}{
		{"default", nil, false},
		{"WithLockNameAttribute", []fencelockotel.Option{fencelockotel.WithLockNameAttribute()}, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			e := newEnv(t, tc.opts...)
			l := e.locker(t, fencelock.Options{TTL: 300 * time.Millisecond})
			name := uniqueName(t)
			ctx := t.Context()
			lease, err := l.Acquire(ctx, name)
			require.NoError(t, err)
			_, err = l.Acquire(ctx, name)
			require.ErrorIs(t, err, fencelock.ErrNotObtained)
			work := lease.KeepAlive(ctx)
			require.NoError(t, e.admin.Del(ctx, lease.Key()).Err())
			<-work.Done()
			_ = lease.Release(ctx)
			require.NoError(t, l.RunWithLock(ctx, name, func(context.Context, *fencelock.Lease) error { return nil }))

			m := e.collect(t)
			for _, in := range []string{"fencelock.acquire.duration", "fencelock.lease.hold_time",
				"fencelock.lease.renewals", "fencelock.lease.lost"} {
				require.NotEmpty(t, m[in].points, in)
				for _, p := range m[in].points {
					v, ok := p.attrs.Value("fencelock.lock.name")
					assert.Equal(t, tc.want, ok, "%s: %v", in, p.attrs.Encoded(nil))
					if ok {
						assert.Equal(t, name, v.AsString())
					}
				}
			}
			spans := e.spans.Ended()
			require.NotEmpty(t, spans)
			for _, s := range spans {
				assertAttr(t, s, "fencelock.lock.name", name) // spans carry it either way
			}
		})
	}
}

func TestUnavailable(t *testing.T) {
	e := newEnv(t)
	// A client of a server that is gone: connection refused, at once.
	down := newEnv(t)
	down.srv.Kill()
	rdb := redis.NewClient(&redis.Options{Addr: down.srv.Addr, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := fencelock.New(rdb, &fencelock.Options{Observer: e.obs, FailOpen: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	name := uniqueName(t)
	ctx := t.Context()

	_, err = l.Acquire(ctx, name)
	require.ErrorIs(t, err, fencelock.ErrUnavailable)
	acq := e.one(t, "fencelock.acquire")
	assert.Equal(t, codes.Error, acq.Status().Code)
	assert.Equal(t, err.Error(), acq.Status().Description)
	assertAttr(t, acq, "fencelock.outcome", "unavailable")
	assertAttr(t, acq, "error.type", "unavailable")

	// Fail-open: the work runs on a degraded lease, which has no fence and
	// holds nothing.
	var ran bool
	require.NoError(t, l.RunWithLock(ctx, name, func(ctx context.Context, lease *fencelock.Lease) error {
		ran = lease.Degraded()
		if err := lease.Release(ctx); !errors.Is(err, fencelock.ErrNotHeld) {
			return fmt.Errorf("release of a degraded lease: got %v, want ErrNotHeld", err)
		}
		return nil // and no hold time is recorded
	}))
	require.True(t, ran)
	run := e.one(t, "fencelock.run")
	assertAttr(t, run, "fencelock.outcome", "ok")
	assertAttr(t, run, "fencelock.lease.degraded", true)
	_, hasFence := attr(run.Attributes(), "fencelock.fence")
	assert.False(t, hasFence)

	m := e.collect(t)
	assert.Equal(t, map[string]int64{"unavailable": 2}, m["fencelock.acquire.duration"].byOutcome())
	assert.NotContains(t, m, "fencelock.lease.hold_time")
}

func TestWorkFails(t *testing.T) {
	e := newEnv(t)
	l := e.locker(t, fencelock.Options{})
	errWork := errors.New("work failed")
	err := l.RunWithLock(t.Context(), uniqueName(t), func(context.Context, *fencelock.Lease) error { return errWork })
	require.ErrorIs(t, err, errWork)
	run := e.one(t, "fencelock.run")
	assert.Equal(t, codes.Error, run.Status().Code)
	assert.Equal(t, "work failed", run.Status().Description)
	assertAttr(t, run, "fencelock.outcome", "failed")
	assert.Equal(t, codes.Unset, e.one(t, "fencelock.release").Status().Code, "released all the same")
}

// The default providers are the global ones.
func TestGlobalProviders(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	prevTP, prevMP := otel.GetTracerProvider(), otel.GetMeterProvider()
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetMeterProvider(prevMP)
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})

	obs, err := fencelockotel.NewObserver()
	require.NoError(t, err)
	e := newEnv(t)
	e.obs, e.spans, e.reader = obs, spans, reader
	l := e.locker(t, fencelock.Options{})
	lease, err := l.Acquire(t.Context(), uniqueName(t))
	require.NoError(t, err)
	require.NoError(t, lease.Release(t.Context()))
	assert.Len(t, spans.Ended(), 2)
	m := e.collect(t)
	assert.Equal(t, map[string]int64{"ok": 1}, m["fencelock.acquire.duration"].byOutcome())
}

func assertAttr[V string | int64 | bool](t *testing.T, s sdktrace.ReadOnlySpan, key string, want V) {
	t.Helper()
	v, ok := attr(s.Attributes(), key)
	if !assert.True(t, ok, "span %s has no attribute %s", s.Name(), key) {
		return
	}
	assert.Equal(t, want, v.AsInterface(), "span %s: %s", s.Name(), key)
}
