// Package keys is the layout of fencelock's keys in Redis and the format of
// a lock's value, shared by the library and the fencelock command. A change
// here is a change of the wire format: old and new library versions share
// these keys during a rolling upgrade.
//
// Every key of a name shares its hash tag, {name}, so that a Cluster keeps
// them in one slot:
//
//	P{name}            the lock: "<token> <fence> <owner>"
//	P{name}:fence      its fence counter
//	P{name}:t:<token>  a token's marker, once its lease was released or its Acquire gave up
//	P{name}:q, :qi     the line of fair waiters (or Redlock waiters): tokens, and their entries
//	P{name}:sem...     a semaphore's keys (Sem)
//	P{name}:rw...      a read-write lock's keys (RW)
//
// where P is the Locker's KeyPrefix.
package keys

import (
	"crypto/rand"
	"strconv"
	"strings"
	"unsafe"

	"github.com/google/uuid"
)

// Lock returns the key of the lock called name.
func Lock(prefix, name string) string { return prefix + "{" + name + "}" }

// Suffixes of the keys that sit beside a lock key (or a semaphore's or a
// read-write lock's base key).
const (
	Fence     = ":fence"
	Marker    = ":t:" // followed by the token
	Queue     = ":q"
	QueueInfo = ":qi"
	Sem       = ":sem" // after the lock key: a semaphore's holders
	SemInfo   = ":h"   // after the semaphore's key: its holders' values
	RW        = ":rw"  // after the lock key: a read-write lock's base
)

// A Lease is the keys of one token's lease of a lock, in the order the
// lock's scripts take them as KEYS.
type Lease [N]string

// The indexes of a Lease.
const (
	LockKey = iota
	MarkerKey
	CounterKey
	QueueKey
	QueueInfoKey
	N
)

// ForLease returns the keys of the lease of token on the lock called name,
// as slices of one string: one allocation for all five, the token's text
// included (the marker key ends with it).
func ForLease(prefix, name string, token []byte) Lease {
	// P{name}:fence P{name}:qi P{name}:t:<token>; P{name} and P{name}:q
	// are prefixes of the first two.
	n := len(prefix) + len(name) + 2
	var b strings.Builder
	b.Grow(3*n + len(Fence) + len(QueueInfo) + len(Marker) + len(token))
	for _, s := range [...]string{prefix, "{", name, "}", Fence, prefix, "{", name, "}", QueueInfo, prefix, "{", name, "}", Marker} {
		b.WriteString(s)
	}
	b.Write(token)
	s := b.String()
	qi := n + len(Fence)
	marker := qi + n + len(QueueInfo)
	var k Lease
	k[LockKey] = s[:n]
	k[CounterKey] = s[:qi]
	k[QueueKey] = s[qi : qi+n+len(Queue)]
	k[QueueInfoKey] = s[qi:marker]
	k[MarkerKey] = s[marker:]
	return k
}

// NameOf returns the name of the lock at key, KeyPrefix+"{"+name+"}", and
// false for any other key (one of a lock's companions, or not the
// library's).
func NameOf(prefix, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix+"{")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, "}")
	if !ok || name == "" || strings.ContainsAny(name, "{}") {
		return "", false
	}
	return name, true
}

// Channel returns the wake-up channel of the lock (or base) key key on
// database db: the key itself, plus "@<db>" on a database other than 0, as
// pub/sub channels are shared by all databases of a server.
func Channel(key string, db int) string {
	if db == 0 {
		return key
	}
	return key + "@" + strconv.Itoa(db)
}

// Value is a lock's value: "<token> <fence> <owner>".
func Value(token string, fence int64, owner string) string {
	return token + " " + strconv.FormatInt(fence, 10) + " " + owner
}

// Parse splits a lock's value, "<token> <fence> <owner>"; the fence is 0
// when it is not a number.
func Parse(v string) (token string, fence int64, owner string) {
	token, rest, _ := strings.Cut(v, " ")
	f, owner, _ := strings.Cut(rest, " ")
	fence, _ = strconv.ParseInt(f, 10, 64)
	return token, fence, owner
}

// Box returns *p as an interface value without copying it: its data word
// points at *p, where boxing a string copies its header to the heap, six
// allocations per lease (its keys and token). *p must not change while the
// value is in use, and lives as long as it does (a lease's own fields). It
// relies on an interface's layout, its type then its data word, which
// TestBox checks.
func Box(p *string) any {
	var v any = ""
	(*[2]unsafe.Pointer)(unsafe.Pointer(&v))[1] = unsafe.Pointer(p)
	return v
}

// NewToken returns a fresh token: a version 4 UUID's text, from crypto/rand, which cannot
// fail.
func NewToken() []byte {
	var u uuid.UUID
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const hexDigits = "0123456789abcdef"
	token := make([]byte, 0, 36)
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			token = append(token, '-')
		}
		token = append(token, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return token
}

// Slot returns the Cluster slot of key: CRC16 (XMODEM) of its hash tag, or
// of the whole key when it has none, mod 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}
