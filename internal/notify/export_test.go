package notify

// Channels returns how many channels n keeps state for.
func (n *Notifier) Channels() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.channels)
}

// Hub returns n's hub for node, or nil: tests compare hubs by identity.
func (n *Notifier) Hub(node string) any {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h := n.hubs[node]; h != nil {
		return h
	}
	return nil
}

// Wait waits for every goroutine of n, after Close (whose own wait ends at
// its deadline on the clock).
func (n *Notifier) Wait() { n.wg.Wait() }
