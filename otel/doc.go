// Package fencelockotel records what fencelock's Lockers do as OpenTelemetry
// traces and metrics: a fencelock.Observer, set in fencelock.Options.
//
//	obs, err := fencelockotel.NewObserver() // the global providers; see WithTracerProvider, WithMeterProvider
//	if err != nil { return err }
//	locker, err := fencelock.New(redisClient, &fencelock.Options{Observer: obs})
//
// The package is named fencelockotel, not otel, so that it imports next to
// go.opentelemetry.io/otel (whose package is otel) without an alias, in the
// way go-redis's OpenTelemetry package is redisotel.
//
// # Spans
//
// Acquire, Release and RunWithLock each make a span, a child of the span in
// the context they are given. RunWithLock's span is the parent of the
// Acquire and Release it makes and of the work's spans (the work's context
// is derived from it):
//
//	fencelock.run                 RunWithLock, from its acquisition to its release
//	├── fencelock.acquire
//	├── (the work's spans)
//	└── fencelock.release
//
// Attributes:
//
//	fencelock.lock.name             string   every span (spans, unlike metrics, have no cardinality limit)
//	fencelock.outcome               string   ok, busy, not_held, lost, unavailable, misconfigured, invalid, cancelled, failed
//	fencelock.fence                 int64    the lease's fencing token, when there is a lease
//	fencelock.lease.degraded        bool     true on a fail-open RunWithLock (Options.FailOpen): no lock, no fence
//	fencelock.acquire.wait_time     float64  seconds an Acquire waited for a busy lock, when it did
//	fencelock.acquire.handoff_time  float64  seconds from a release's wake-up to the grant, when known
//	fencelock.lease.hold_time       float64  seconds the lease was held, on a release that deleted the lock
//	error.type                      string   the outcome, on a span with error status
//
// A span's status is Error, with the error's message, for every outcome but
// ok and busy. A busy lock (fencelock.ErrNotObtained, also a WithWait that
// ran out) is not an error: it is the answer to the question the caller
// asked, and at every contended tick all instances but one get it; painting
// them red would drown real failures. A cancelled context is an error,
// as in OpenTelemetry's conventions for clients: the operation did not
// complete. So is a RunWithLock whose work returned an error (outcome
// failed).
//
// # Renewals and loss
//
// Each renewal by the watchdog is an event "fencelock.renew" (attributes
// fencelock.outcome; error.type and error.message when it failed), and a
// loss is an event "fencelock.lost" (fencelock.lease.hold_time,
// error.message: the cause), of the span of the operation that took the
// lease. A RunWithLock's span lasts until its lease is released, so its
// renewals and its loss are events of it; its status then says lost too.
// The Go SDK keeps a span's latest 128 events by default (sdktrace.SpanLimits),
// so a run renewed more often than that keeps its latest renewals and its
// loss.
//
// A lease from a plain Acquire outlives Acquire's span, which has ended by
// the time of its first renewal, and events added to an ended span are
// dropped. Its renewals are then counted in the metrics only (a lease may be
// renewed for hours: a span for each would flood the traces), and its loss,
// which matters, is a span of its own, "fencelock.lost" (status Error, with
// the attributes of the event above, the lock name and the fence), a child
// of Acquire's span, in Acquire's trace.
//
// # Metrics
//
// Durations are float64 histograms in seconds, as OpenTelemetry's semantic
// conventions ask, with bucket boundaries advised for locks (sub-millisecond
// for a Redis round trip, up to an hour for a hold); a View overrides them.
//
//	fencelock.acquire.duration     s          Acquire, waiting included; by fencelock.outcome
//	fencelock.acquire.wait_time    s          time an Acquire spent waiting for a busy lock (WithWait), for those that waited; by fencelock.outcome
//	fencelock.acquire.handoff_time s          from the arrival of a release's wake-up to the grant to the waiter it woke, when known
//	fencelock.lease.hold_time      s          from acquisition to a release that deleted the lock (outcome ok) or to the loss (outcome lost)
//	fencelock.lease.renewals       {renewal}  renewals by the watchdog; by fencelock.outcome (ok, not_held, unavailable, ...)
//	fencelock.lease.lost           {lease}    leases lost while their watchdog ran
//
// A release with any other outcome than ok records no hold time: the lock
// ended earlier, at a time not known (it expired, or was lost and recorded
// then), or may still be held until its TTL.
//
// Metrics carry the lock's name (fencelock.lock.name) only with
// WithLockNameAttribute: each name is a time series of its own in every
// instrument, and a service that locks order:<id> would create one per
// order.
package fencelockotel
