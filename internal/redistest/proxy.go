package redistest

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// A ProxyMode is what a Proxy does with the bytes it relays.
type ProxyMode int

const (
	// Pass relays bytes as they come, after the proxy's latency.
	Pass ProxyMode = iota
	// BlackHole stops relaying in both directions while the connections
	// stay open, as a network partition does: senders see no error, only
	// silence. Bytes held meanwhile are delivered when the mode changes back
	// to Pass, as TCP would retransmit them once the partition heals, so a
	// request sent into the hole can still reach the server later.
	BlackHole
	// Reset closes every relayed connection with a TCP RST and resets each
	// new one as soon as it is accepted.
	Reset
)

func (m ProxyMode) String() string {
	switch m {
	case Pass:
		return "pass"
	case BlackHole:
		return "black-hole"
	case Reset:
		return "reset"
	default:
		return fmt.Sprintf("ProxyMode(%d)", int(m))
	}
}

// A Proxy relays TCP connections from its own loopback port to an upstream
// address and injects faults: see ProxyMode, SetLatency, DropNextReply and
// HangDials. A client connects to Addr instead of the server's address, and
// the test changes the faults while the client runs. All methods are safe
// for concurrent use.
type Proxy struct {
	Addr string // 127.0.0.1:port

	ln net.Listener

	mu        sync.Mutex
	upstream  string              // guarded by mu
	mode      ProxyMode           // guarded by mu
	latency   time.Duration       // guarded by mu; added to each direction
	drops     int                 // guarded by mu; replies DropNextReply armed
	hangDials bool                // guarded by mu
	changed   chan struct{}       // guarded by mu; closed and replaced on every change
	conns     map[*pconn]struct{} // guarded by mu; accepted and not yet closed
	closed    bool                // guarded by mu

	wg sync.WaitGroup // the accept loop and every relaying goroutine
}

// pconn is one relayed connection pair.
type pconn struct {
	client net.Conn
	done   chan struct{} // closed by close

	mu     sync.Mutex
	server net.Conn // guarded by mu; nil until dialed
	closed bool     // guarded by mu
}

// close closes both connections, with a TCP RST if rst is set.
func (c *pconn) close(rst bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	for _, conn := range []net.Conn{c.client, c.server} {
		if conn == nil {
			continue
		}
		if tc, ok := conn.(*net.TCPConn); ok && rst {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	}
	close(c.done)
}

// attach sets the pair's server connection, or closes server and returns
// false if the pair was closed meanwhile.
func (c *pconn) attach(server net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = server.Close()
		return false
	}
	c.server = server
	return true
}

// StartProxy starts a Proxy to upstream on a free loopback port, in mode
// Pass with no latency. It is closed when the test ends.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, upstream: upstream,
		changed: make(chan struct{}), conns: make(map[*pconn]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		c := &pconn{client: client, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.mode == Reset {
			p.mu.Unlock()
			c.close(true)
			continue
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.relay(c)
	}
}

// relay connects the pair's client to upstream, once dials no longer hang,
// and pumps bytes both ways until either side closes or the proxy closes
// the pair.
func (p *Proxy) relay(c *pconn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		hang, upstream, changed := p.hangDials, p.upstream, p.changed
		p.mu.Unlock()
		if !hang {
			server, err := net.DialTimeout("tcp", upstream, time.Second)
			if err != nil {
				// The upstream is down: the client sees its connection
				// closed at once, as it would notice a refused one.
				c.close(false)
				return
			}
			if !c.attach(server) {
				return
			}
			break
		}
		select {
		case <-changed:
		case <-c.done:
			return
		}
	}

	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.pump(c, c.server, c.client, true)
	}()
	p.pump(c, c.client, c.server, false)
}

// pump copies src to dst, applying the proxy's faults to each chunk read.
// It closes the pair when it returns.
func (p *Proxy) pump(c *pconn, src, dst net.Conn, fromServer bool) {
	defer c.close(false)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.hold(c, time.Now()) {
				return
			}
			if fromServer && p.takeDrop() {
				return // closing the pair discards the chunk
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// takeDrop reports whether a drop was armed, disarming it.
func (p *Proxy) takeDrop() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drops == 0 {
		return false
	}
	p.drops--
	return true
}

// hold waits until a chunk read at read may be written on: the mode is Pass
// and the latency has passed. It returns false if the pair was closed or
// reset meanwhile.
func (p *Proxy) hold(c *pconn, read time.Time) bool {
	for {
		p.mu.Lock()
		mode, latency, changed := p.mode, p.latency, p.changed
		p.mu.Unlock()
		switch mode {
		case Reset:
			c.close(true)
			return false
		case BlackHole:
			select {
			case <-changed:
				continue
			case <-c.done:
				return false
			}
		}
		wait := time.Until(read.Add(latency))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
			return true
		case <-changed: // e.g. a black hole began during the delay
			t.Stop()
		case <-c.done:
			t.Stop()
			return false
		}
	}
}

// SetMode changes the mode for every connection, open or new; Reset also
// resets every open connection at once.
func (p *Proxy) SetMode(mode ProxyMode) {
	p.mu.Lock()
	p.mode = mode
	p.notifyLocked()
	var open []*pconn
	if mode == Reset {
		open = p.openLocked()
	}
	p.mu.Unlock()
	for _, c := range open {
		c.close(true)
	}
}

// SetLatency sets the delay added to each chunk in each direction, so a
// request and its reply take at least 2*d more. Zero removes it.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
	p.notifyLocked()
}

// DropNextReply arms one lost reply: the next chunk of bytes the proxy reads
// from the server, on any connection, is discarded and that connection pair
// is closed (a FIN to the client, not a RST). The server has already
// executed the request, so the client sees io.EOF for a command that took
// effect; go-redis retries such a command on a new connection by default.
// Each call arms one more. To be deterministic, arm it while exactly one
// request is in flight or about to be sent, on a connection already set up:
// a go-redis client's first command dials, and the reply dropped would then
// be the reply to its connection handshake (HELLO).
func (p *Proxy) DropNextReply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops++
}

// HangDials makes new connections hang while on. The kernel completes a TCP
// handshake with the proxy's listening socket whether or not the proxy
// accepts, so a dial itself cannot be made to hang here; instead the proxy
// accepts the connection but neither connects it upstream nor reads from it,
// so a client's dial succeeds and its first request (go-redis's HELLO or
// AUTH) gets no answer until its read timeout or context ends. Connections
// relayed before keep working. Turning it off connects the held connections
// upstream and delivers what their clients sent, as a late SYN-ACK would;
// a client that gave up has closed its end by then.
func (p *Proxy) HangDials(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hangDials = on
	p.notifyLocked()
}

// Retarget points new connections at upstream and resets the open ones, as
// a virtual IP moving to another server would: the client reconnects to the
// same address and reaches the new server.
func (p *Proxy) Retarget(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	open := p.openLocked()
	p.mu.Unlock()
	for _, c := range open {
		c.close(true)
	}
}

func (p *Proxy) openLocked() []*pconn {
	open := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	return open
}

func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Close stops the proxy, resets every connection and waits for the proxy's
// goroutines to exit. It is safe to call more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = true
	open := p.openLocked()
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range open {
		c.close(true)
	}
	p.wg.Wait()
}
