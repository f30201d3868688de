// Package demo holds the plumbing the runnable examples share, so that each
// example's own files tell only its story: an embedded or real Redis, an
// embedded SQLite or a real PostgreSQL, portable SQL placeholders, and a
// timeline printer.
//
// Every example runs on a fresh machine with nothing but Go installed:
// without configuration it starts an embedded miniredis on a loopback port
// and keeps its tables in an SQLite file in a temporary directory. Two
// environment variables point it at real servers instead:
//
//	REDIS_ADDR    host:port or redis://[user:password@]host:port/db
//	DATABASE_URL  postgres://user[:password]@host:port/db?sslmode=...
package demo

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// RunID returns a short random hex string. The examples put it in their
// table names and lock key prefix, so that runs sharing a real Redis or
// PostgreSQL (two terminals, parallel test packages) never see each other's
// rows or locks.
func RunID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never returns an error
	return hex.EncodeToString(b)
}

// A Timeline prints one line per event, prefixed with the time elapsed since
// it was created and the name of the actor. It is safe for concurrent use, so
// goroutines and the readers of child processes can share one.
type Timeline struct {
	start time.Time

	mu sync.Mutex
	w  io.Writer // guarded by mu
}

// NewTimeline returns a Timeline writing to w whose clock starts now.
func NewTimeline(w io.Writer) *Timeline {
	return &Timeline{start: time.Now(), w: w}
}

// Printf prints one line for who. A message of several lines is folded into
// one, so that every line of the timeline keeps its prefix.
func (t *Timeline) Printf(who, format string, args ...any) {
	msg := strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", "; ")
	elapsed := time.Since(t.start).Seconds()
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(t.w, "%5.2fs  %-10s %s\n", elapsed, who, msg)
}

// Logger returns a logger that prints each record of level or above as a
// line of the timeline for who, without its time (the line has one), so an
// example can show what the library logs.
func (t *Timeline) Logger(who string, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(timelineWriter{t, who}, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// timelineWriter prints each Write, one log record, as a line for who.
type timelineWriter struct {
	t   *Timeline
	who string
}

func (w timelineWriter) Write(p []byte) (int, error) {
	w.t.Printf(w.who, "%s", strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
