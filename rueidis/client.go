package fencerueidis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"syscall"

	"github.com/redis/rueidis"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/driver"
	"github.com/fencelock/fencelock/internal/keys"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/script"
	"github.com/fencelock/fencelock/internal/store"
)

// New returns a Locker that keeps its locks in the deployment of client (a
// server, a Sentinel-managed master or a Cluster), configured by opts (nil:
// all defaults), making no Redis call: fencelock.New for a rueidis client.
// It returns an error matching fencelock.ErrInvalid for a nil client or an
// option it cannot honour. Closing the Locker does not close client.
func New(client rueidis.Client, opts *fencelock.Options) (*fencelock.Locker, error) {
	if isNil(client) {
		return nil, fmt.Errorf("%w: nil rueidis client", fencelock.ErrInvalid)
	}
	return fencelock.NewWith(connector(client), opts)
}

// NewRedlock returns a Locker whose locks are held on a quorum of the
// independent deployments of clients: fencelock.NewRedlock for rueidis
// clients (see it for how to choose them). It returns an error matching
// fencelock.ErrInvalid, with no Redis call, for no clients or more than 64,
// a nil client, the same client twice, or an option it cannot honour.
func NewRedlock(clients []rueidis.Client, opts *fencelock.Options) (*fencelock.Locker, error) {
	if len(clients) == 0 {
		return nil, fmt.Errorf("%w: no rueidis clients", fencelock.ErrInvalid)
	}
	if len(clients) > 64 {
		return nil, fmt.Errorf("%w: %d rueidis clients: at most 64", fencelock.ErrInvalid, len(clients))
	}
	connect := make([]fencelock.Connector, len(clients))
	for i, c := range clients {
		if isNil(c) {
			return nil, fmt.Errorf("%w: rueidis client %d is nil", fencelock.ErrInvalid, i)
		}
		for j := range i {
			if clients[j] == c {
				return nil, fmt.Errorf("%w: rueidis clients %d and %d are the same client", fencelock.ErrInvalid, j, i)
			}
		}
		connect[i] = connector(c)
	}
	return fencelock.NewRedlockWith(connect, opts)
}

func connector(c rueidis.Client) fencelock.Connector {
	return func(o driver.Options) driver.Client { return newClient(c, o) }
}

func isNil(c rueidis.Client) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// maxRedirects bounds the MOVED and ASK replies Run follows with Replicas,
// as go-redis's ClusterOptions.MaxRedirects does by default.
const maxRedirects = 3

// A client is one deployment's rueidis client, as fencelock's deployment
// package uses it.
type client struct {
	c       rueidis.Client
	o       driver.Options
	cluster bool
	slots   *slotMap // a Cluster's; nil else
	network *network
}

var _ driver.Client = (*client)(nil)

func newClient(c rueidis.Client, o driver.Options) *client {
	cl := &client{c: c, o: o, cluster: c.Mode() == rueidis.ClientModeCluster}
	if cl.cluster {
		cl.slots = &slotMap{c: c}
	}
	cl.network = &network{c: cl}
	return cl
}

// Call sends one command through the client: on a Cluster, to the node that
// serves its first key, following redirects as rueidis does.
func (c *client) Call(ctx context.Context, args []any) (any, error) {
	return do(ctx, c.c, args)
}

// Pipe sends cmds on one connection in order: see driver.Node.
func (c *client) Pipe(ctx context.Context, tx bool, cmds ...[]any) []error {
	return pipe(ctx, c.c, c.cluster, tx, cmds)
}

// Eval runs s on keys: EVALSHA, then EVAL when the server does not have it.
func (c *client) Eval(ctx context.Context, s *script.Script, keys, argv []any) (any, error) {
	return c.eval(ctx, s, false, keys, argv)
}

// eval runs s on keys as script.Run does through Call (EVALSHA, then EVAL
// on NOSCRIPT; EVAL alone with eval), building each command from the
// arguments directly, and again when its connection was dead, as do.
func (c *client) eval(ctx context.Context, s *script.Script, eval bool, keys, argv []any) (any, error) {
	for try := 0; ; try++ {
		reply, err := result(c.c.Do(ctx, evalCmd(c.c.B(), s, eval, keys, argv)))
		if !eval && err != nil && script.IsNoScript(err) {
			reply, err = result(c.c.Do(ctx, evalCmd(c.c.B(), s, true, keys, argv)))
		}
		if try == maxResends || !deadConn(err) || ctx.Err() != nil {
			return reply, err
		}
	}
}

// Network returns the client's pub/sub, for a notifier.
func (c *client) Network() notify.Network { return c.network }

// DB returns 0: rueidis does not show a client's SelectDB (see the package
// comment).
func (c *client) DB() int { return 0 }

// Deadlines reports true: rueidis stops every call at its context's
// deadline, whatever its own timeouts.
func (c *client) Deadlines() bool { return true }

// Mark, Since and LastDialError know nothing of the client's dials: its
// dialer is the user's (ClientOption.DialCtxFn), which no hook reaches. A
// failed dial shows in the call's own error instead (a *net.OpError "dial",
// which store.Unsent reads as not sent).
func (c *client) Mark() store.Mark                       { return store.Mark{} }
func (c *client) Since(store.Mark) (cause error, _ bool) { return nil, false }
func (c *client) LastDialError() error                   { return nil }

// Addr returns the address of a client of one server (a Sentinel's: of the
// master it now uses), else "".
func (c *client) Addr() string {
	if c.cluster {
		return ""
	}
	for addr := range c.c.Nodes() {
		return addr
	}
	return ""
}

// Servers returns the client's server, or a Cluster's masters with their slots.
func (c *client) Servers(ctx context.Context) ([]driver.Server, error) {
	if !c.cluster {
		return []driver.Server{{Addr: c.Addr(), Node: node{c.c, false}}}, nil
	}
	table, err := c.slots.load(ctx)
	if err != nil {
		return nil, err
	}
	nodes := c.c.Nodes()
	at := make(map[string]int) // index in out, by address
	var out []driver.Server
	for _, r := range table {
		i, ok := at[r.addr]
		if !ok {
			i = len(out)
			at[r.addr] = i
			out = append(out, driver.Server{Addr: r.addr, Node: nodeOf(nodes, r.addr)})
		}
		out[i].Slots = append(out[i].Slots, [2]int{r.start, r.end})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, nil
}

// nodeOf returns the Node of the server at addr in nodes.
func nodeOf(nodes map[string]rueidis.Client, addr string) driver.Node {
	if n := nodes[addr]; n != nil {
		return node{n, false}
	}
	return missing(addr)
}

// Subscribers returns how many connections subscribe to channel on the node
// that serves it: PUBSUB SHARDNUMSUB, or NUMSUB before Redis 7.
func (c *client) Subscribers(ctx context.Context, channel string) (int, error) {
	via, err := c.nodeFor(ctx, channel)
	if err != nil {
		return 0, err
	}
	reply, err := via.Call(ctx, []any{"PUBSUB", "SHARDNUMSUB", channel})
	if err != nil && store.IsUnknownCommand(err) {
		reply, err = via.Call(ctx, []any{"PUBSUB", "NUMSUB", channel})
	}
	if err != nil {
		return 0, err
	}
	switch r := reply.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			if r[i] == channel {
				n, _ := r[i+1].(int64)
				return int(n), nil
			}
		}
	case map[any]any:
		n, _ := r[channel].(int64)
		return int(n), nil
	}
	return 0, nil
}

// nodeFor returns the Node of the server that serves key: on a Cluster, its
// slot's master as the slot map says; else the client.
func (c *client) nodeFor(ctx context.Context, key string) (driver.Node, error) {
	if !c.cluster {
		return node{c.c, false}, nil
	}
	addr, err := c.slots.master(ctx, keys.Slot(key))
	if err != nil {
		return nil, err
	}
	return nodeOf(c.c.Nodes(), addr), nil
}

// Run runs s on keys as Eval does (EVAL alone when eval is set). With
// Options.Replicas it sends WAIT (or WAITAOF) after the script on the
// connection that wrote, and returns the script's reply with WAIT's error or
// a *store.ReplicaError when too few acknowledged.
func (c *client) Run(ctx context.Context, s *script.Script, eval bool, ks, argv []any) (any, error) {
	if c.o.Replicas == 0 {
		return c.eval(ctx, s, eval, ks, argv)
	}
	via := c.c
	if c.cluster {
		addr, err := c.slots.master(ctx, keys.Slot(arg(ks[0])))
		if err != nil {
			return nil, err
		}
		if via = c.c.Nodes()[addr]; via == nil {
			c.slots.reload()
			return nil, fmt.Errorf("no rueidis client for %s, the master of the lock's slot", addr)
		}
	}
	asking := false
	for redirects := 0; ; redirects++ {
		reply, err, wait, werr := c.runWait(ctx, via, s, eval, asking, 0, ks, argv)
		if !eval && script.IsNoScript(err) {
			reply, err, wait, werr = c.runWait(ctx, via, s, true, asking, 0, ks, argv)
		}
		var re *redisError
		if !errors.As(err, &re) || !c.cluster {
			if err != nil && c.cluster && store.ClassOf(err) == store.Unavailable {
				c.slots.reload() // the master may have failed over
			}
			if err != nil {
				return nil, err
			}
			if werr != nil {
				return reply, werr
			}
			return reply, c.o.Acknowledged(wait)
		}
		addr, moved := re.err.IsMoved()
		a, ask := re.err.IsAsk()
		if !moved && !ask {
			return nil, err
		}
		if ask {
			addr = a
		}
		c.slots.reload()
		if redirects >= maxRedirects {
			return nil, fmt.Errorf("the lock's slot is moving: redirected to %s after %d redirects", addr, redirects)
		}
		if via = c.c.Nodes()[addr]; via == nil {
			return nil, fmt.Errorf("the lock's slot is moving: redirected to %s, which the rueidis client does not know", addr)
		}
		asking = ask
	}
}

// runWait sends s and WAIT in one batch, after ASKING with asking, again
// (resent times so far) when its connection was dead, as do. WAIT is
// marked blocking: rueidis sends the batch on a connection of its own, which
// no other caller's command waits behind.
func (c *client) runWait(ctx context.Context, via rueidis.Client, s *script.Script, eval, asking bool, resent int, ks, argv []any) (reply any, err error, wait any, werr error) {
	b := via.B()
	var cmds []rueidis.Completed
	if asking {
		cmds = append(cmds, b.Arbitrary("ASKING").Build())
	}
	cmds = append(cmds, evalCmd(b, s, eval, ks, argv), b.Arbitrary(strs(c.o.Wait())...).Blocking())
	res := via.DoMulti(ctx, cmds...)
	n := len(res)
	reply, err = result(res[n-2])
	wait, werr = result(res[n-1])
	if deadConn(err) && resent < maxResends && ctx.Err() == nil { // as do
		return c.runWait(ctx, via, s, eval, asking, resent+1, ks, argv)
	}
	return reply, err, wait, werr
}

// A node is one server's rueidis client (or the client itself), as a
// driver.Node.
type node struct {
	c       rueidis.Client
	cluster bool
}

func (n node) Call(ctx context.Context, args []any) (any, error) {
	return do(ctx, n.c, args)
}

// maxResends bounds how many times do sends a command again on finding its
// connection dead: each such connection is dropped, and a client has a few
// (its pipe, and those of calls with a deadline or a blocking command).
const maxResends = 3

// do sends args through c, and again when the connection they went on
// turned out to be dead (EOF, a reset): rueidis finds a connection the
// server closed while it was idle (a failover, a restart) only by the next
// command's EOF, and resends no write. Every script of fencelock is safe to
// run twice, as go-redis's retries (3 by default) do: a token's second run
// finds what its first did.
func do(ctx context.Context, c rueidis.Client, args []any) (any, error) {
	for try := 0; ; try++ {
		cmd, _, _ := build(c.B(), args)
		reply, err := result(c.Do(ctx, cmd))
		if try == maxResends || !deadConn(err) || ctx.Err() != nil {
			return reply, err
		}
	}
}

// deadConn reports whether err is the end of a connection found at a
// command: the server had closed it.
func deadConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (n node) Pipe(ctx context.Context, tx bool, cmds ...[]any) []error {
	return pipe(ctx, n.c, n.cluster, tx, cmds)
}

// missing is the Node of a server the client has no connection to.
type missing string

func (m missing) err() error {
	return fmt.Errorf("the rueidis client has no connection to %s", string(m))
}

func (m missing) Call(context.Context, []any) (any, error) { return nil, m.err() }

func (m missing) Pipe(_ context.Context, tx bool, cmds ...[]any) []error {
	errs := make([]error, len(cmds), len(cmds)+1)
	for i := range errs {
		errs[i] = m.err()
	}
	if tx {
		errs = append(errs, m.err())
	}
	return errs
}

// pipe sends cmds through c on one connection, in order, in one DoMulti,
// within MULTI and EXEC with tx: the client writes a DoMulti's commands
// together, so no other caller's command comes between MULTI and EXEC (a
// dedicated connection is only needed for WATCH, which fencelock does not
// use, and taking one would not heed ctx). On a Cluster's client, commands
// of several slots are refused, as they would be sent to several nodes.
func pipe(ctx context.Context, c rueidis.Client, cluster, tx bool, args [][]any) []error {
	b := c.B()
	cmds := make([]rueidis.Completed, 0, len(args)+2)
	if tx {
		cmds = append(cmds, b.Arbitrary("MULTI").Build())
	}
	slot := -1
	for _, a := range args {
		cmd, key, keyed := build(b, a)
		if keyed && cluster {
			if s := keys.Slot(key); slot >= 0 && s != slot {
				return fail(len(args), tx, errors.New("commands of several slots in one pipeline of a Cluster's client"))
			} else {
				slot = s
			}
		}
		cmds = append(cmds, cmd)
	}
	if tx {
		cmds = append(cmds, b.Arbitrary("EXEC").Build())
	}
	res := c.DoMulti(ctx, cmds...)
	errs := make([]error, len(args), len(args)+1)
	if !tx {
		for i := range args {
			_, errs[i] = result(res[i])
		}
		return errs
	}
	_, multiErr := result(res[0])
	execReply, execErr := result(res[len(res)-1])
	replies, _ := execReply.([]any)
	for i := range args {
		_, errs[i] = result(res[i+1]) // QUEUED, or the command's refusal
		if errs[i] == nil && i < len(replies) {
			errs[i], _ = replies[i].(error)
		}
		if errs[i] == nil && execReply == nil {
			errs[i] = firstErr(execErr, multiErr)
		}
	}
	return append(errs, firstErr(execErr, multiErr))
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// fail returns err for each command of a pipe (and EXEC with tx).
func fail(n int, tx bool, err error) []error {
	errs := make([]error, n, n+1)
	for i := range errs {
		errs[i] = err
	}
	if tx {
		errs = append(errs, err)
	}
	return errs
}
