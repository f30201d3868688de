package keys

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestForLease(t *testing.T) {
	k := ForLease("lock:", "nightly", []byte("tok"))
	assert.Equal(t, Lease{
		LockKey:      "lock:{nightly}",
		MarkerKey:    "lock:{nightly}:t:tok",
		CounterKey:   "lock:{nightly}:fence",
		QueueKey:     "lock:{nightly}:q",
		QueueInfoKey: "lock:{nightly}:qi",
	}, k)
	assert.Equal(t, Lock("lock:", "nightly"), k[LockKey])
}

func TestNameOf(t *testing.T) {
	for key, want := range map[string]string{
		"lock:{a}":       "a",
		"lock:{a b}":     "a b",
		"lock:{a}:fence": "",
		"lock:{a}:t:x":   "",
		"lock:{}":        "",
		"other:{a}":      "",
		"lock:{a{b}":     "",
	} {
		got, ok := NameOf("lock:", key)
		assert.Equal(t, want, got, key)
		assert.Equal(t, want != "", ok, key)
	}
}

func TestValue(t *testing.T) {
	v := Value("tok", 42, "pod-2 (pid 7)")
	assert.Equal(t, "tok 42 pod-2 (pid 7)", v)
	token, fence, owner := Parse(v)
	assert.Equal(t, "tok", token)
	assert.Equal(t, int64(42), fence)
	assert.Equal(t, "pod-2 (pid 7)", owner)
	_, fence, owner = Parse("tok x")
	assert.Zero(t, fence, "not a number")
	assert.Empty(t, owner)
	assert.Equal(t, "lock:{a}@3", Channel("lock:{a}", 3))
	assert.Equal(t, "lock:{a}", Channel("lock:{a}", 0))
}

// A boxed string is an ordinary string interface value: go-redis writes it,
// hooks print it and compare it, as any other.
func TestBox(t *testing.T) {
	s := "lock:{name}:t:" + fmt.Sprint(42)
	v := Box(&s)
	got, ok := v.(string)
	assert.True(t, ok)
	assert.Equal(t, s, got)
	assert.Equal(t, s, fmt.Sprint(v))
	assert.True(t, v == any("lock:{name}:t:42"))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = Box(&s) }))
}

// TestSlot: the Cluster slot of a key, as Redis computes it (CRC16/XMODEM
// of its hash tag modulo 16384; the vectors are Redis's own).
func TestSlot(t *testing.T) {
	for key, slot := range map[string]int{"123456789": 12739, "foo": 12182, "bar": 5061, "": 0,
		"x{foo}y": 12182, "{bar}{foo}": 5061, "{}foo": 9500 /* an empty tag: the whole key */, "a{foo": 113} {
		if got := Slot(key); got != slot {
			t.Errorf("Slot(%q) = %d, want %d", key, got, slot)
		}
	}
}
