package chaos

import (
	"net"
	"sync"
	"testing"
	"time"
)

// proxyMode is what a proxy does with the bytes it relays.
type proxyMode int

const (
	// pass relays bytes as they come (after the proxy's added latency).
	pass proxyMode = iota
	// blackHole stops relaying in both directions while the connections stay
	// open, as a network partition does: senders see no error, only
	// silence. Bytes held meanwhile are delivered when the mode changes back
	// to pass, as TCP would retransmit them once the partition heals, so a
	// request sent into the hole can still reach the server later.
	blackHole
	// reset closes every relayed connection with a TCP RST and resets each
	// new one as soon as it is accepted.
	reset
)

func (m proxyMode) String() string {
	switch m {
	case pass:
		return "pass"
	case blackHole:
		return "black-hole"
	default:
		return "reset"
	}
}

// A proxy relays TCP connections from a loopback port to an upstream address
// and injects faults: see proxyMode and setLatency. It runs in the test
// process; a worker connects to the proxy's port instead of Redis's, and the
// test switches modes.
type proxy struct {
	ln   net.Listener
	addr string

	mu       sync.Mutex
	upstream string              // guarded by mu
	mode     proxyMode           // guarded by mu
	latency  time.Duration       // guarded by mu; added to each direction
	changed  chan struct{}       // guarded by mu; closed and replaced on every change
	conns    map[*pconn]struct{} // guarded by mu
	closed   bool                // guarded by mu

	wg sync.WaitGroup // the accept loop and every relaying goroutine
}

// pconn is one relayed connection pair.
type pconn struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
}

func (c *pconn) close(rst bool) {
	c.once.Do(func() {
		if rst {
			for _, conn := range []net.Conn{c.client, c.server} {
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
			}
		}
		_ = c.client.Close()
		_ = c.server.Close()
		close(c.done)
	})
}

// startProxy starts a proxy to upstream on a free loopback port. It is closed
// when the test ends.
func startProxy(t testing.TB, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("chaos: proxy: %v", err)
	}
	p := &proxy{ln: ln, addr: ln.Addr().String(), upstream: upstream,
		changed: make(chan struct{}), conns: make(map[*pconn]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode, upstream, closed := p.mode, p.upstream, p.closed
		p.mu.Unlock()
		if closed || mode == reset {
			if tc, ok := client.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = client.Close()
			continue
		}
		p.wg.Add(1)
		go p.relay(client, upstream)
	}
}

// relay connects client to upstream and pumps bytes both ways until either
// side closes or the proxy resets the pair.
func (p *proxy) relay(client net.Conn, upstream string) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", upstream, time.Second)
	if err != nil {
		// The upstream is down: the client sees its connection closed at
		// once, as a refused connection would be noticed.
		_ = client.Close()
		return
	}
	c := &pconn{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close(true)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()

	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.pump(c, server, client)
	}()
	p.pump(c, client, server)

	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pump copies src to dst, applying the proxy's mode to each chunk. Chunks
// are read as they come and written on each at its own read time plus the
// latency, as a slow link delivers them: a chunk that arrives while an
// earlier one is held is not held behind it for a latency more.
func (p *proxy) pump(c *pconn, src, dst net.Conn) {
	type chunk struct {
		b    []byte
		read time.Time
	}
	q := make(chan chunk, 4096)
	written := make(chan struct{})
	go func() { // the writer: the delay line's far end
		defer close(written)
		for ch := range q {
			if !p.hold(c, ch.read) {
				return
			}
			if _, err := dst.Write(ch.b); err != nil {
				c.close(false)
				return
			}
		}
	}()
	defer func() {
		close(q)
		<-written // deliver what was read before src ended
		c.close(false)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case q <- chunk{b: append([]byte(nil), buf[:n]...), read: time.Now()}:
			case <-written:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// hold waits until a chunk read at read may be written on: the mode is pass
// and the added latency has passed. It returns false if the pair was closed
// or reset meanwhile.
func (p *proxy) hold(c *pconn, read time.Time) bool {
	for {
		p.mu.Lock()
		mode, latency, changed := p.mode, p.latency, p.changed
		p.mu.Unlock()
		switch mode {
		case reset:
			c.close(true)
			return false
		case blackHole:
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

// set changes the mode; reset also resets every open pair.
func (p *proxy) set(mode proxyMode) {
	p.mu.Lock()
	p.mode = mode
	p.notifyLocked()
	var open []*pconn
	if mode == reset {
		for c := range p.conns {
			open = append(open, c)
		}
	}
	p.mu.Unlock()
	for _, c := range open {
		c.close(true)
	}
}

// setLatency sets the delay added to each chunk in each direction.
func (p *proxy) setLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
	p.notifyLocked()
}

// retarget points new connections at upstream and resets the open ones, as
// a virtual IP moving to another server would: the client reconnects to the
// same address and reaches the new server.
func (p *proxy) retarget(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	open := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		c.close(true)
	}
}

func (p *proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// close stops the proxy, closes every pair and waits for its goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	open := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, c := range open {
		c.close(true)
	}
	p.wg.Wait()
}
