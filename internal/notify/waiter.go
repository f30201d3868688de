package notify

import "strings"

// A Waiter is one waiting call's registration on a channel.
type Waiter struct {
	n       *Notifier
	channel string
	wake    chan struct{} // buffered: a pending wake-up
	also    []*Waiter     // the same call's other registrations (see Join); Leave ends them too
	h       Hearer
	seq     uint64   // the order of registration: one wake-up goes to the earliest
	wokeBy  *Message // the wake-up it got as one of many (see WakeOne); guarded by n.mu
}

// A Hearer is what one kind of waiter makes of the messages on its channel.
// It is called with the Notifier's mutex held, and must not call the Notifier.
type Hearer interface {
	// Hear tells what m (the empty payload: the subscription's
	// confirmation) does to the waiter.
	Hear(m Message) Hearing
	// Lingers reports whether the channel stays subscribed for
	// ChannelLinger after this waiter, its last, left.
	Lingers() bool
}

// Hearing is what a message does to a waiter.
type Hearing int

const (
	// Ignore leaves the waiter asleep.
	Ignore Hearing = iota
	// WakeAll wakes this waiter.
	WakeAll
	// WakeOne wakes the first registered of the waiters that heard it so;
	// it passes the wake-up on if it does not use it (PassOn, Leave).
	WakeOne
)

// EveryMessage is the Hearer of a waiter that every message wakes.
type EveryMessage struct{}

// Hear returns WakeAll.
func (EveryMessage) Hear(Message) Hearing { return WakeAll }

// Lingers returns false.
func (EveryMessage) Lingers() bool { return false }

// A Message is a payload published on a channel, cut once into its first word and the rest.
type Message struct {
	Payload    string
	Head, Rest string
}

func parseMessage(payload string) Message {
	head, rest, _ := strings.Cut(payload, " ")
	return Message{Payload: payload, Head: head, Rest: rest}
}

// C returns the channel w's wake-ups come on, one pending at most.
func (w *Waiter) C() <-chan struct{} { return w.wake }

// Join registers w's call on channel of n too, woken on w's channel.
func (w *Waiter) Join(n *Notifier, channel string, h Hearer) {
	if o := n.Register(channel, w.wake, h); o != nil {
		w.also = append(w.also, o)
	}
}

// Drain drops a pending wake-up of w, before a call to Redis that answers
// for every message before it.
func (w *Waiter) Drain() {
	select {
	case <-w.wake:
	default:
	}
}

// Leave deregisters w and those joined to it, without waiting for Redis, and
// passes on a wake-up w got as one of many and did not take.
func (w *Waiter) Leave() {
	for _, o := range w.also {
		o.Leave()
	}
	n := w.n
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.channels[w.channel]
	if cs == nil {
		return
	}
	delete(cs.waiters, w)
	if w.wokeBy != nil && len(w.wake) > 0 {
		cs.deliverLocked(*w.wokeBy, true)
	}
	if len(cs.waiters) > 0 {
		return
	}
	if w.h.Lingers() && cs.hub != nil && !n.closed {
		cs.idle = n.clock.Now()
		poke(cs.hub.kick) // to end it after ChannelLinger
		return
	}
	delete(n.channels, w.channel)
	if cs.hub != nil {
		// Confirmed until the hub's sync unsubscribes it: a waiter that
		// comes first finds it subscribed, and the hub sends nothing.
		delete(cs.hub.want, w.channel)
		poke(cs.hub.kick)
	}
}

// PassOn gives a wake-up w got as one of many, and did not use, to the next.
func (w *Waiter) PassOn() {
	n := w.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if cs := n.channels[w.channel]; cs != nil && w.wokeBy != nil {
		delete(cs.waiters, w)
		cs.deliverLocked(*w.wokeBy, true)
		cs.waiters[w] = struct{}{}
	}
	w.wokeBy = nil
}

// deliverLocked wakes the waiters m wakes, and the earliest of those it
// wakes one of; with onlyOne, only that one (a wake-up passed on).
func (cs *chanState) deliverLocked(m Message, onlyOne bool) {
	var one *Waiter
	for w := range cs.waiters {
		switch w.h.Hear(m) {
		case WakeAll:
			if !onlyOne {
				poke(w.wake)
			}
		case WakeOne:
			// Not one with a wake-up pending, which tries anyway: else a
			// second message that comes at once would be lost.
			if len(w.wake) == 0 && (one == nil || w.seq < one.seq) {
				one = w
			}
		}
	}
	if one != nil {
		one.wokeBy = &m
		poke(one.wake)
	}
}
