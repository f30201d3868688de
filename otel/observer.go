package fencelockotel

import (
	"context"
	"fmt"
	"runtime/debug"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/fencelock/fencelock"
)

// scope is the instrumentation scope of the tracer and the meter: this
// module's path.
const scope = "github.com/fencelock/fencelock/otel"

// Attribute keys. The package documentation says which span, event and
// instrument carries which.
const (
	keyLockName    = attribute.Key("fencelock.lock.name")
	keyOutcome     = attribute.Key("fencelock.outcome")
	keyFence       = attribute.Key("fencelock.fence")
	keyDegraded    = attribute.Key("fencelock.lease.degraded")
	keyWaitTime    = attribute.Key("fencelock.acquire.wait_time")
	keyHandoffTime = attribute.Key("fencelock.acquire.handoff_time")
	keyHoldTime    = attribute.Key("fencelock.lease.hold_time")
	keyErrorType   = attribute.Key("error.type")    // OpenTelemetry semantic conventions
	keyErrorMsg    = attribute.Key("error.message") // OpenTelemetry semantic conventions
)

// Span and span event names.
const (
	spanAcquire = "fencelock.acquire"
	spanRelease = "fencelock.release"
	spanRun     = "fencelock.run"
	spanLost    = "fencelock.lost" // a span only when the lease's own span has ended
	eventRenew  = "fencelock.renew"
	eventLost   = "fencelock.lost"
)

// outcomes are the outcome classes fencelock reports; each gets its
// attribute set made once.
var outcomes = []fencelock.Outcome{
	fencelock.OutcomeOK, fencelock.OutcomeBusy, fencelock.OutcomeNotHeld, fencelock.OutcomeLost,
	fencelock.OutcomeUnavailable, fencelock.OutcomeMisconfigured, fencelock.OutcomeInvalid,
	fencelock.OutcomeCancelled, fencelock.OutcomeClosed, fencelock.OutcomeFailed,
}

// An Observer records what a fencelock Locker does as OpenTelemetry spans
// and metrics. Set it in fencelock.Options.Observer. It is safe for
// concurrent use, by any number of Lockers, and holds no goroutine: there is
// nothing to close.
type Observer struct {
	tracer   trace.Tracer
	nameAttr bool // WithLockNameAttribute: lock names on metrics

	acquireDuration metric.Float64Histogram
	waitTime        metric.Float64Histogram
	handoffTime     metric.Float64Histogram
	holdTime        metric.Float64Histogram
	renewals        metric.Int64Counter
	lost            metric.Int64Counter

	// byOutcome holds, for each outcome, the measurement option of a
	// metric without the lock name; read-only after NewObserver.
	byOutcome map[fencelock.Outcome]metric.MeasurementOption
	noAttrs   metric.MeasurementOption
}

var _ fencelock.Observer = (*Observer)(nil)

// An Option configures an Observer.
type Option func(*config)

type config struct {
	tp       trace.TracerProvider
	mp       metric.MeterProvider
	nameAttr bool
}

// WithTracerProvider makes the Observer create its spans with tp. Default:
// the global TracerProvider (otel.GetTracerProvider) at NewObserver.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider makes the Observer create its instruments with mp.
// Default: the global MeterProvider (otel.GetMeterProvider) at NewObserver.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithLockNameAttribute adds the lock's name to every measurement, as the
// attribute fencelock.lock.name. Without it metrics carry no lock name, since
// every name is a time series of its own in every instrument: turn it on only
// when your service locks a few fixed names ("settlement"), never names with
// an id in them ("order:<id>"). Spans carry the name either way.
func WithLockNameAttribute() Option {
	return func(c *config) { c.nameAttr = true }
}

// NewObserver returns an Observer that creates its spans and instruments
// with the providers its options name, the global ones by default. It
// returns an error when the MeterProvider refuses to create an instrument.
func NewObserver(opts ...Option) (*Observer, error) {
	var c config
	for _, opt := range opts {
		opt(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	v := version()
	o := &Observer{
		tracer:    c.tp.Tracer(scope, trace.WithInstrumentationVersion(v)),
		nameAttr:  c.nameAttr,
		byOutcome: make(map[fencelock.Outcome]metric.MeasurementOption, len(outcomes)),
		noAttrs:   metric.WithAttributeSet(*attribute.EmptySet()),
	}
	for _, oc := range outcomes {
		o.byOutcome[oc] = metric.WithAttributeSet(attribute.NewSet(keyOutcome.String(string(oc))))
	}

	meter := c.mp.Meter(scope, metric.WithInstrumentationVersion(v))
	var err error
	histogram := func(name, desc string, bounds ...float64) metric.Float64Histogram {
		if err != nil {
			return nil
		}
		var h metric.Float64Histogram
		h, err = meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		if err != nil {
			err = fmt.Errorf("fencelockotel: instrument %s: %w", name, err)
		}
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		if err != nil {
			return nil
		}
		var c metric.Int64Counter
		c, err = meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			err = fmt.Errorf("fencelockotel: instrument %s: %w", name, err)
		}
		return c
	}
	// Bucket boundaries are advice: a View of the MeterProvider overrides
	// them. An acquisition is one Redis round trip unless it waits.
	o.acquireDuration = histogram("fencelock.acquire.duration",
		"How long Acquire took, waiting included, by outcome.",
		0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
	o.waitTime = histogram("fencelock.acquire.wait_time",
		"Time an Acquire spent waiting between attempts for a busy lock (WithWait), for Acquires that waited, by outcome.",
		0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
	o.handoffTime = histogram("fencelock.acquire.handoff_time",
		"Time from the arrival of a release's wake-up to the grant of the lock to the waiter it woke.",
		0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
	o.holdTime = histogram("fencelock.lease.hold_time",
		"How long a lease was held: from its acquisition to its release (outcome ok) or its loss (outcome lost).",
		0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600)
	o.renewals = counter("fencelock.lease.renewals", "{renewal}",
		"Renewals of leases by their watchdog, by outcome.")
	o.lost = counter("fencelock.lease.lost", "{lease}",
		"Leases lost while their watchdog ran: taken over, deleted, or not renewed in time.")
	if err != nil {
		return nil, err
	}
	return o, nil
}

// Start starts the operation's span, a child of the span in ctx, and
// returns ctx with it. It implements fencelock.Observer.
func (o *Observer) Start(ctx context.Context, op fencelock.Op, name string) context.Context {
	ctx, _ = o.tracer.Start(ctx, spanName(op), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(keyLockName.String(name)))
	return ctx
}

// End records the operation's metrics and ends its span, the one in ctx. It
// implements fencelock.Observer.
func (o *Observer) End(ctx context.Context, e fencelock.Event) {
	span := trace.SpanFromContext(ctx)
	switch e.Op {
	case fencelock.OpAcquire:
		attrs := o.measured(e.Outcome, e.Name)
		o.acquireDuration.Record(ctx, e.Duration.Seconds(), attrs)
		if e.Waited > 0 {
			o.waitTime.Record(ctx, e.Waited.Seconds(), attrs)
			span.SetAttributes(keyWaitTime.Float64(e.Waited.Seconds()))
		}
		if e.Handoff > 0 {
			o.handoffTime.Record(ctx, e.Handoff.Seconds(), o.measured("", e.Name))
			span.SetAttributes(keyHandoffTime.Float64(e.Handoff.Seconds()))
		}
	case fencelock.OpRelease:
		// Only a release that deleted the lock tells how long it was held.
		// Any other outcome means the lock ended earlier, at a time not
		// known here (it expired, or was lost, and the loss was recorded
		// then), or may still be held until its TTL; and a degraded lease
		// held nothing.
		if e.Outcome == fencelock.OutcomeOK && !e.Lease.Degraded() {
			o.holdTime.Record(ctx, e.Held.Seconds(), o.measured(e.Outcome, e.Name))
			span.SetAttributes(keyHoldTime.Float64(e.Held.Seconds()))
		}
	}
	if span.IsRecording() {
		span.SetAttributes(keyOutcome.String(string(e.Outcome)))
		if e.Lease != nil {
			if e.Lease.Degraded() {
				span.SetAttributes(keyDegraded.Bool(true))
			} else {
				span.SetAttributes(keyFence.Int64(e.Fence))
			}
		}
		if isError(e.Outcome) && e.Err != nil {
			span.SetAttributes(keyErrorType.String(string(e.Outcome)))
			span.SetStatus(codes.Error, e.Err.Error())
		}
	}
	span.End()
}

// Notify records a renewal or a loss: in the metrics, and as an event of the
// span in ctx, that of the operation that took the lease (RunWithLock's, or
// Acquire's). It implements fencelock.Observer.
//
// A RunWithLock's span is open for as long as its lease is renewed, so its
// renewals and its loss are events of it. A lease from a plain Acquire
// outlives Acquire's span: its renewals are then in the metrics only, and a
// loss is a span of its own, "fencelock.lost", a child of Acquire's span in
// the same trace.
func (o *Observer) Notify(ctx context.Context, e fencelock.Event) {
	span := trace.SpanFromContext(ctx)
	switch e.Op {
	case fencelock.OpRenew:
		o.renewals.Add(ctx, 1, o.measured(e.Outcome, e.Name))
		if span.IsRecording() {
			attrs := []attribute.KeyValue{keyOutcome.String(string(e.Outcome))}
			if e.Err != nil {
				attrs = append(attrs, keyErrorType.String(string(e.Outcome)), keyErrorMsg.String(e.Err.Error()))
			}
			span.AddEvent(eventRenew, trace.WithAttributes(attrs...))
		}
	case fencelock.OpLost:
		o.lost.Add(ctx, 1, o.measured("", e.Name))
		o.holdTime.Record(ctx, e.Held.Seconds(), o.measured(fencelock.OutcomeLost, e.Name))
		attrs := []attribute.KeyValue{keyHoldTime.Float64(e.Held.Seconds())}
		if e.Err != nil {
			attrs = append(attrs, keyErrorMsg.String(e.Err.Error()))
		}
		if span.IsRecording() {
			span.AddEvent(eventLost, trace.WithAttributes(attrs...))
			return
		}
		_, lost := o.tracer.Start(ctx, spanLost, trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(keyLockName.String(e.Name), keyFence.Int64(e.Fence),
				keyOutcome.String(string(fencelock.OutcomeLost)), keyErrorType.String(string(fencelock.OutcomeLost))),
			trace.WithAttributes(attrs...))
		msg := "lease lost"
		if e.Err != nil {
			msg = e.Err.Error()
		}
		lost.SetStatus(codes.Error, msg)
		lost.End()
	}
}

// measured returns the measurement option for outcome ("": none) and, with
// WithLockNameAttribute, the lock's name.
func (o *Observer) measured(outcome fencelock.Outcome, name string) metric.MeasurementOption {
	if !o.nameAttr {
		if outcome == "" {
			return o.noAttrs
		}
		if m, ok := o.byOutcome[outcome]; ok {
			return m
		}
		return metric.WithAttributes(keyOutcome.String(string(outcome)))
	}
	if outcome == "" {
		return metric.WithAttributes(keyLockName.String(name))
	}
	return metric.WithAttributes(keyOutcome.String(string(outcome)), keyLockName.String(name))
}

// isError reports whether a span with outcome gets an error status. A busy
// lock is not an error: it is the answer the caller asked for ("is anyone on
// it?"), given to all but one instance at every contended tick.
func isError(outcome fencelock.Outcome) bool {
	return outcome != fencelock.OutcomeOK && outcome != fencelock.OutcomeBusy
}

func spanName(op fencelock.Op) string {
	switch op {
	case fencelock.OpAcquire:
		return spanAcquire
	case fencelock.OpRelease:
		return spanRelease
	case fencelock.OpRun:
		return spanRun
	}
	return "fencelock." + op.String()
}

// version returns this module's version as the binary was built with it,
// or "" when it is not known (a test, or a replace directive).
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, m := range info.Deps {
		if m.Path == scope {
			if m.Replace != nil {
				return m.Replace.Version
			}
			return m.Version
		}
	}
	return ""
}
