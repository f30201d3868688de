package fencerueidis

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// A slotMap is a Cluster's slot ranges and their masters, as CLUSTER SLOTS
// last gave them: rueidis keeps its own, which it does not show.
type slotMap struct {
	c       rueidis.Client
	table   atomic.Pointer[[]slotRange] // sorted by start; nil until loaded
	loading atomic.Bool                 // a reload runs in the background
}

type slotRange struct {
	start, end int
	addr       string // the master's
}

// reloadTimeout bounds a reload in the background.
const reloadTimeout = 5 * time.Second

// master returns the address of the master that serves slot, loading the
// map first if it was never loaded.
func (m *slotMap) master(ctx context.Context, slot int) (string, error) {
	p := m.table.Load()
	if p == nil {
		if _, err := m.load(ctx); err != nil {
			return "", err
		}
		p = m.table.Load()
	}
	t := *p
	i := sort.Search(len(t), func(i int) bool { return t[i].end >= slot })
	if i < len(t) && t[i].start <= slot {
		return t[i].addr, nil
	}
	m.reload()
	return "", fmt.Errorf("no master serves slot %d in the Cluster's slot map", slot)
}

// reload reads the map again in the background, unless a reload runs.
func (m *slotMap) reload() {
	if !m.loading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer m.loading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), reloadTimeout)
		defer cancel()
		_, _ = m.load(ctx)
	}()
}

// load reads the map with CLUSTER SLOTS, which the client sends to any node.
func (m *slotMap) load(ctx context.Context) ([]slotRange, error) {
	reply, err := result(m.c.Do(ctx, m.c.B().Arbitrary("CLUSTER", "SLOTS").Build()))
	if err != nil {
		return nil, err
	}
	entries, _ := reply.([]any)
	var t []slotRange
	for _, e := range entries {
		r, _ := e.([]any)
		if len(r) < 3 {
			continue
		}
		start, _ := r[0].(int64)
		end, _ := r[1].(int64)
		n, _ := r[2].([]any)
		if len(n) < 2 {
			continue
		}
		host, _ := n[0].(string)
		port, _ := n[1].(int64)
		t = append(t, slotRange{start: int(start), end: int(end), addr: net.JoinHostPort(host, strconv.FormatInt(port, 10))})
	}
	if len(t) == 0 {
		return nil, fmt.Errorf("CLUSTER SLOTS gave no slot: %v", reply)
	}
	sort.Slice(t, func(i, j int) bool { return t[i].start < t[j].start })
	m.table.Store(&t)
	return t, nil
}
