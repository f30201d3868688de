package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/fencelock/fencelock"
)

// lockJSON is one lock in the JSON of ls and inspect. Fields are only ever
// added; see the package documentation for the schema.
type lockJSON struct {
	Name      string `json:"name"`
	Key       string `json:"key"`
	Held      bool   `json:"held"`
	Owner     string `json:"owner"`
	TTLMillis int64  `json:"ttl_ms"`
	Fence     int64  `json:"fence"`
	LastFence int64  `json:"last_fence"`
	Waiters   int    `json:"waiters"`
}

func toJSON(key string, info fencelock.LockInfo) lockJSON {
	return lockJSON{
		Name:      info.Name,
		Key:       key,
		Held:      info.Held,
		Owner:     info.Owner,
		TTLMillis: ttlMillis(info.TTL),
		Fence:     info.Fence,
		LastFence: info.LastFence,
		Waiters:   info.Waiters,
	}
}

// ttlMillis is a TTL in whole milliseconds, -1 for no expiry.
func ttlMillis(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// fmtTTL formats a TTL for people: to 100ms from a second on, as
// BusyError does, to the millisecond below (the JSON has milliseconds).
func fmtTTL(d time.Duration) string {
	switch {
	case d < 0:
		return "no expiry"
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// fmtOwner shows an owner for people: as it is when printable, quoted
// otherwise (another writer may have stored anything).
func fmtOwner(owner string) string {
	if owner == "" {
		return "-"
	}
	for _, r := range owner {
		if !unicode.IsPrint(r) {
			return strconv.Quote(owner)
		}
	}
	return owner
}

// holder describes who holds a lock, in a sentence.
func holder(owner string) string {
	if owner == "" {
		return "a holder that stored no owner"
	}
	return fmtOwner(owner)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// redisError turns the error of a Redis call into the command's: a
// timeout says which bound ran out.
func redisError(cmd string, cf *connFlags, err error) error {
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, fencelock.ErrUnavailable) {
		return failf("%s: no answer within --timeout %v", cmd, cf.timeout)
	}
	if errors.Is(err, fencelock.ErrInvalid) {
		return usagef("%s: %s", cmd, trimPrefix(err))
	}
	return failf("%s: %s", cmd, trimPrefix(err))
}

// wrap fills text into lines of at most width runes after indent (the
// first line's indent is left to the caller).
func wrap(text string, indent string, width int) string {
	var b strings.Builder
	col := 0
	for i, word := range strings.Fields(text) {
		n := len([]rune(word))
		if i > 0 && col+1+n > width {
			b.WriteString("\n" + indent)
			col = 0
		} else if i > 0 {
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += n
	}
	return b.String()
}

// plural returns "1 thing" or "2 things".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
