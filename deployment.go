package fencelock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/redis/go-redis/v9"
)

// A deployment is one Redis deployment: a server, a Sentinel-managed
// master, a Cluster or a Ring, through one go-redis client. It is the
// backend of New, and one of the nodes of NewRedlock.
type deployment struct {
	l *Locker
	// client runs the scripts: the client New was given, which may be an
	// AutoPipeliner (they are sent with Process, which it batches).
	client redis.UniversalClient
	// base is the client New was given, or the one behind its
	// AutoPipeliner: subscriptions, WAIT and what asks for a kind of
	// client (a Cluster's nodes) go through it.
	base  redis.UniversalClient
	waits *notifier
	dbTag string // appended to wake-up channels: "" on database 0, "@<db>" on others
	name  string // in errors, for a node of a quorum

	deadlines bool // the client honours context deadlines (see traits)
	// published: a release published its wake-up, or tried: until then,
	// releases publish with or without subscribers, so that a missing
	// permission is logged at the first (see warnPublish).
	published atomic.Bool
}

var _ backend = (*deployment)(nil)

func newDeployment(l *Locker, client redis.UniversalClient) *deployment {
	base := client
	if ap, ok := client.(*redis.AutoPipeliner); ok {
		base = behind(ap) // not nil: checkClient
	}
	base.AddHook(dialWatch{l})
	return &deployment{l: l, client: client, base: base, waits: newNotifier(base, l.opts.Logger, l.clock), dbTag: dbTag(client),
		deadlines: honoursDeadlines(client)}
}

// checkClient returns an ErrInvalid error for a client New cannot use: an
// AutoPipeliner whose own client it cannot find.
func checkClient(c redis.UniversalClient) error {
	if ap, ok := c.(*redis.AutoPipeliner); ok && behind(ap) == nil {
		return invalidf("an AutoPipeliner of a go-redis version whose client fencelock cannot find")
	}
	return nil
}

// behind returns the client an AutoPipeliner batches for, or nil. go-redis
// keeps it in an unexported field (v9.23: pipeliner), and fencelock needs
// it for what an AutoPipeliner does not batch or does not tell: its
// database, subscriptions, WAIT, a Cluster's nodes.
// TestAutoPipelinerClientFound fails when go-redis renames the field.
func behind(ap *redis.AutoPipeliner) redis.UniversalClient {
	f := reflect.ValueOf(ap).Elem().FieldByName("pipeliner")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return nil
	}
	f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem() // readable, as unexported fields are not
	c, _ := f.Interface().(redis.UniversalClient)
	if isNil(c) {
		return nil
	}
	return c
}

// honoursDeadlines reports whether go-redis stops a call of client at its
// context's deadline (ContextTimeoutEnabled): a call bounded by a deadline
// alone can then run on its caller's goroutine. An AutoPipeliner runs its
// batches on a context of its own, whatever its client's options: a call
// it has queued honours no deadline.
func honoursDeadlines(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	case *redis.AutoPipeliner:
		return false
	}
	return false
}

// dbTag tells wake-up channels of different databases apart: pub/sub
// channels are shared by all databases of a server.
func dbTag(c redis.UniversalClient) string {
	if ap, ok := c.(*redis.AutoPipeliner); ok {
		c = behind(ap) // the database of its client's connections
	}
	var db int
	switch c := c.(type) {
	case *redis.Client:
		db = c.Options().DB
	case *redis.Ring:
		db = c.Options().DB
	}
	if db == 0 {
		return ""
	}
	return "@" + strconv.Itoa(db)
}

// channel returns the wake-up channel of the lock key.
func (d *deployment) channel(key string) string {
	if d.dbTag == "" {
		return key
	}
	return key + d.dbTag
}

func (d *deployment) acquire(ctx context.Context, lease *Lease) attempt {
	var reply any
	var err error
	if lease.fair {
		reply, err = d.run(ctx, script.Acquire, false, lease.keyArgs[:], lease.tokenArg,
			d.l.ttlArg(lease.ttl), d.l.retentionMillis, lease.ownerArg, "1", queueEntryMillis)
	} else { // two arguments fewer: each costs the server about a third of a GET
		reply, err = d.run(ctx, script.Acquire, false, lease.keyArgs[:], lease.tokenArg,
			d.l.ttlArg(lease.ttl), d.l.retentionMillis, lease.ownerArg)
	}
	return d.attempted(ctx, lease, reply, err, acquireAttempt(reply))
}

// attempted is the attempt of a run of an acquire script for lease (this
// deployment's, or a kind's), given the run's reply and error and a, the
// reply as the script's decoder reads it: a, unless the run failed. A write
// happened only when the script says so (or its reply is not understood):
// any other answer stands whatever WAIT said.
func (d *deployment) attempted(ctx context.Context, lease *Lease, reply any, err error, a attempt) attempt {
	if err != nil && reply == nil { // the script did not run, or its reply was lost
		return attempt{err: err}
	}
	if err != nil && (a.ok || errors.Is(a.err, errReply)) {
		if isReplicaShort(err) {
			// Taken, but not on enough replicas to survive a failover:
			// give it back, and try again, if at all, with a new token.
			// It is given back before the next try, which would otherwise
			// find the lock held by this call's own last token.
			d.giveBack(ctx, lease)
			return attempt{err: err, retire: true, free: true}
		}
		return attempt{err: err}
	}
	return a
}

// giveBack deletes the lock that lease took short of its replicas and
// retires its token (modeAbandon), within ctx, or in the background when
// Redis does not answer within it.
func (d *deployment) giveBack(ctx context.Context, lease *Lease) {
	if _, perr, err := lease.runRelease(ctx, modeAbandon); err == nil {
		d.l.warnPublish(lease.name, perr)
		return
	}
	d.l.abandon(lease)
}

// acquireAttempt is the attempt of an acquire script's reply, read by
// decodeAcquire. A busy one wrote no lock (at most a fair waiter's queue
// entry); its PTTL -3 says the lock is free, but fair waiters are in line
// first.
func acquireAttempt(reply any) attempt {
	ok, val, owner, err := decodeAcquire(reply)
	switch {
	case err != nil: // retired, or not understood
		return attempt{err: err}
	case ok:
		return attempt{ok: true, fence: val}
	case val == -3:
		return attempt{pttl: -3, owner: "fair waiters in line"}
	}
	return attempt{pttl: time.Duration(val) * time.Millisecond, owner: owner}
}

// errRetired is the acquire script's refusal of a token whose Acquire gave
// up or whose lease was released: only a late copy of an attempt meets it.
var errRetired = errors.New("the acquisition was given up")

// decodeAcquire decodes the acquire script's reply: {1, fence} with the fence
// as a decimal string, {0, pttl, owner} with the holder's PTTL in
// milliseconds and its owner, or {2} for a retired token, which reads as an
// error.
func decodeAcquire(reply any) (ok bool, value int64, owner string, err error) {
	arr, isArr := reply.([]any)
	if !isArr || len(arr) == 0 {
		return false, 0, "", fmt.Errorf("%w from the acquire script: %v", errReply, reply)
	}
	flag, _ := arr[0].(int64)
	switch {
	case flag == 0 && len(arr) == 3:
		pttl, isInt := arr[1].(int64)
		owner, isStr := arr[2].(string)
		if isInt && isStr {
			return false, pttl, owner, nil
		}
	case flag == 1 && len(arr) == 2:
		s, isStr := arr[1].(string)
		fence, err := strconv.ParseInt(s, 10, 64)
		if isStr && err == nil && fence > 0 {
			return true, fence, "", nil
		}
	case flag == 2 && len(arr) == 1:
		return false, 0, "", errRetired
	}
	return false, 0, "", fmt.Errorf("%w from the acquire script: %v", errReply, reply)
}

func (d *deployment) extend(ctx context.Context, lease *Lease, ttl time.Duration, renewal bool) (int64, error) {
	reply, err := d.run(ctx, script.Extend, renewal, lease.keyArgs[keys.LockKey:keys.LockKey+1], lease.tokenArg, d.l.ttlArg(ttl))
	return decodeExtend(script.Extend, reply, err)
}

// decodeExtend decodes the reply of s, extend.lua or a kind's extend script
// (answering as kind.extend does), given its run's error: WAIT's when it
// comes with a reply, which stands only when the expiry was set (or the
// reply is not understood); 0 and -1 wrote nothing.
func decodeExtend(s *script.Script, reply any, err error) (int64, error) {
	if err != nil && reply == nil {
		return 0, err
	}
	code, ok := reply.(int64)
	ok = ok && code >= -1 && code <= 1
	switch {
	case err != nil && (!ok || code == 1):
		return 0, err // set (or unknown), but too few replicas have it
	case !ok:
		return 0, fmt.Errorf("%w from the %s script: %v", errReply, s.Name, reply)
	}
	return code, nil
}

// run runs s on the lock's keys, given boxed (a Lease keeps its keys
// boxed, so that the scripts of one lease do not box them again): EVALSHA,
// then EVAL if the server does not have the script, or EVAL alone when
// eval is set. With Options.Replicas, it sends WAIT (or WAITAOF) after the
// script in one pipeline on the connection to the node that serves the
// first key (on a Cluster, following MOVED and ASK there: see redirected):
// WAIT counts the writes of its own connection, so on any other connection
// it would not count this one. It then returns a *replicaError,
// wrapping ErrUnavailable, when fewer replicas acknowledged, or WAIT's own
// error; the script's reply is returned with it, and its decoder decides:
// an answer that says the script wrote nothing stands whatever WAIT said.
func (d *deployment) run(ctx context.Context, s *script.Script, eval bool, keys []any, argv ...any) (any, error) {
	o := &d.l.opts
	if o.Replicas == 0 {
		return evalScript(ctx, d.client, s, eval, keys, argv).Result()
	}
	key, _ := keys[0].(string)
	node, err := d.node(ctx, key)
	if err != nil {
		return nil, err
	}
	timeout := ttlMillis(o.ReplicaTimeout)
	asking := false
	exec := func(eval bool) (*redis.Cmd, *redis.Cmd, error) {
		pipe := node.Pipeline()
		if asking {
			pipe.Do(ctx, "ASKING") // the next command on this connection only
		}
		cmd := pipe.Do(ctx, script.Args(s, eval, keys, argv)...)
		var wait *redis.Cmd
		if o.ReplicaFsync {
			wait = pipe.Do(ctx, "WAITAOF", 1, o.Replicas, timeout)
		} else {
			wait = pipe.Do(ctx, "WAIT", o.Replicas, timeout)
		}
		_, err := pipe.Exec(ctx)
		return cmd, wait, err
	}
	var cmd, wait *redis.Cmd
	for redirects := 0; ; redirects++ {
		cmd, wait, err = exec(eval)
		if err != nil && redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			cmd, wait, err = exec(true)
		}
		addr, moved := redis.IsMovedError(cmd.Err())
		if a, ask := redis.IsAskError(cmd.Err()); ask {
			addr = a
		} else if !moved {
			break
		}
		cluster, isCluster := d.base.(*redis.ClusterClient)
		if !isCluster {
			break // not a Cluster's client: a refusal, as without Replicas
		}
		if node, err = redirected(ctx, cluster, addr, redirects); err != nil {
			return nil, err
		}
		asking = !moved
	}
	if cmd.Err() != nil {
		return nil, cmd.Err()
	}
	if err := wait.Err(); err != nil {
		return cmd.Val(), err
	}
	acked, local := int64(0), int64(1)
	switch v := wait.Val().(type) {
	case int64: // WAIT
		acked = v
	case []any: // WAITAOF: [local, replicas]
		if len(v) == 2 {
			local, _ = v[0].(int64)
			acked, _ = v[1].(int64)
		}
	}
	if acked < int64(o.Replicas) || local < 1 {
		return cmd.Val(), &replicaError{acked: acked, want: o.Replicas, local: local, fsync: o.ReplicaFsync, timeout: o.ReplicaTimeout}
	}
	return cmd.Val(), err
}

// node returns the client to pipeline on for key: the master that serves
// its slot on a Cluster (in the client's slot map, which may be out of
// date), its shard on a Ring, the deployment's client otherwise (a single
// server, or Sentinel's current master).
func (d *deployment) node(ctx context.Context, key string) (redis.Cmdable, error) {
	switch c := d.base.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Ring:
		return c.GetShardClientForKey(key)
	}
	if _, ok := d.client.(*redis.AutoPipeliner); ok {
		return d.base, nil // WAIT counts the writes of its own connection: a plain one
	}
	return d.client, nil
}

// redirected returns the master at addr, named by a MOVED or ASK reply of
// c, after reloading c's slot map (a MOVED means it is out of date). As
// go-redis does for one command, it follows at most
// ClusterOptions.MaxRedirects; past them, or when addr is no master of the
// reloaded map, the slot is still moving: the error is then not the
// redirect (a Redis error, which would read as a refusal), and classifies as
// ErrUnavailable.
func redirected(ctx context.Context, c *redis.ClusterClient, addr string, redirects int) (redis.Cmdable, error) {
	if redirects >= c.Options().MaxRedirects {
		return nil, fmt.Errorf("the lock's slot is moving: redirected to %s after %d redirects", addr, redirects)
	}
	var master atomic.Pointer[redis.Client]
	err := c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error { // reloads the slot map first
		if m.Options().Addr == addr {
			master.Store(m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if m := master.Load(); m != nil {
		return m, nil
	}
	return nil, fmt.Errorf("the lock's slot is moving: redirected to %s, no master in the slot map", addr)
}

// replicaError is an acquisition or extension that fewer replicas than
// Options.Replicas acknowledged within ReplicaTimeout.
type replicaError struct {
	acked   int64
	want    int
	local   int64 // WAITAOF: whether the master fsynced it
	fsync   bool
	timeout time.Duration
}

func (e *replicaError) Error() string {
	what := "acknowledged"
	if e.fsync {
		what = "wrote it to disk"
		if e.local < 1 {
			return fmt.Sprintf("the master did not write the lock to disk, %d of %d replicas did, within ReplicaTimeout %v",
				e.acked, e.want, e.timeout)
		}
	}
	return fmt.Sprintf("%d of %d replicas %s within ReplicaTimeout %v", e.acked, e.want, what, e.timeout)
}

func (e *replicaError) Unwrap() error { return ErrUnavailable }

func isReplicaShort(err error) bool {
	var short *replicaError
	return errors.As(err, &short)
}

func (d *deployment) release(ctx context.Context, lease *Lease, mode string) (int64, error, error) {
	return d.runRelease(ctx, lease, mode, false)
}

// runRelease runs release.lua; loud: it publishes even where nobody
// subscribes (Check tries the permission), as the first release of a
// deployment does.
func (d *deployment) runRelease(ctx context.Context, lease *Lease, mode string, loud bool) (int64, error, error) {
	loud = loud || (mode == modeRelease && !d.published.Load())
	argv := []any{lease.tokenArg, d.channelArg(lease), modeArg(mode), d.markerMillis(lease, mode), d.l.retentionMillis}
	if loud {
		argv = append(argv, "1")
	}
	reply, err := evalScript(ctx, d.client, script.Release, false, lease.keyArgs[:], argv).Result()
	if err != nil {
		return 0, nil, err
	}
	code, perr, err := decodeRelease(reply)
	if loud && code == 1 && err == nil {
		d.published.Store(true)
	}
	return code, perr, err
}

// releaseKind runs s, the release script of a keyed kind (a semaphore's
// or a read-write lock's), which answers as release.lua does, on keys; its
// arguments are lease's token, the channel of its wake-ups, mode, the TTL
// of the token marker it leaves (as release.lua's), then more. runRelease
// does not use it: the append to more costs a lock's release an allocation.
func (d *deployment) releaseKind(ctx context.Context, s *script.Script, keys []any, lease *Lease, channel any, mode string, more ...any) (int64, error, error) {
	argv := append([]any{lease.tokenArg, channel, modeArg(mode), d.markerMillis(lease, mode)}, more...)
	reply, err := evalScript(ctx, d.client, s, false, keys, argv).Result()
	if err != nil {
		return 0, nil, err
	}
	return decodeRelease(reply)
}

// markerMillis is how long a release in mode keeps the token's marker:
// ReleaseTimeout for a release; for an abandon, as long as a late attempt's
// lock would live, which it refuses.
func (d *deployment) markerMillis(lease *Lease, mode string) any {
	if mode == modeRelease {
		return d.l.releaseTimeoutMillis
	}
	return d.abandonMarkerMillis(lease)
}

// decodeRelease decodes the reply of release.lua and redlock_release.lua: 1,
// 0 or -1, or {1, error} when the lock was deleted but the wake-up could not
// be published.
func decodeRelease(reply any) (code int64, perr, err error) {
	switch r := reply.(type) {
	case int64:
		if r >= -1 && r <= 1 {
			return r, nil, nil
		}
	case []any:
		if len(r) == 2 {
			msg, _ := r[1].(string)
			if c, _ := r[0].(int64); c == 1 {
				return 1, errors.New(oneLine(msg)), nil
			}
		}
	}
	return 0, nil, fmt.Errorf("%w from the release script: %v", errReply, reply)
}

// abandonMarkerMillis is how long a token marker that refuses a late
// attempt of lease is kept: as long as its lock would live.
func (d *deployment) abandonMarkerMillis(lease *Lease) int64 {
	return ttlMillis(max(lease.ttl, d.l.opts.ReleaseTimeout))
}

// channelArg returns the wake-up channel of lease's lock, boxed.
func (d *deployment) channelArg(lease *Lease) any {
	if d.dbTag == "" {
		return lease.keyArgs[keys.LockKey] // the lock key on database 0
	}
	return d.channel(lease.keys[keys.LockKey])
}

func (d *deployment) register(key string, h hearer) *waiter {
	return d.waits.register(d.channel(key), nil, h)
}

func (d *deployment) close(by time.Time) { d.waits.close(by) }

// evalScript runs s on c: EVALSHA, then EVAL when the server does not have
// it cached (NOSCRIPT), or EVAL alone when eval is set. It sends them with
// Process, which an AutoPipeliner batches (its Do runs each command on a
// connection of its own); on a client, Do is the same.
func evalScript(ctx context.Context, c redis.UniversalClient, s *script.Script, eval bool, keys, argv []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, script.Args(s, eval, keys, argv)...)
	_ = c.Process(ctx, cmd)
	if err := cmd.Err(); !eval && err != nil && script.IsNoScript(err) { // no allocation on success
		cmd = redis.NewCmd(ctx, script.Args(s, true, keys, argv)...)
		_ = c.Process(ctx, cmd)
	}
	return cmd
}
