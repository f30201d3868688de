package demo

import (
	"context"
	"errors"
	"io"
	"os"
)

// Servers says which servers a run of an example uses.
type Servers struct {
	RedisAddr   string // REDIS_ADDR; empty starts an embedded miniredis
	DatabaseURL string // DATABASE_URL; empty uses an embedded SQLite file
	NoDatabase  bool   // the example keeps no tables: no database is opened
	// RedisMayBeDown lets the run go on when the Redis named does not
	// answer (ErrNoAnswer), for an example whose locks fail open: see
	// Stage.RedisDown.
	RedisMayBeDown bool
}

// Stage is what one run of an example plays on: its timeline, its servers,
// and the names it uses in them, which Close removes at the end.
type Stage struct {
	Timeline *Timeline
	Redis    *Redis
	// RedisDown is why Redis does not answer, with RedisMayBeDown; nil if
	// it answers. Redis.Desc then says so too.
	RedisDown error
	DB        *DB // nil with NoDatabase
	// ID is a RunID, for the run's table names: runs sharing a real
	// PostgreSQL never see each other's rows.
	ID string
	// KeyPrefix is the run's fencelock.Options.KeyPrefix,
	// "fencelock-example:"+ID+":", so that runs sharing a Redis never see
	// each other's locks.
	KeyPrefix string

	ctx    context.Context
	tables []string // dropped by Close
	keys   []string // deleted by Close
}

// Start starts (or connects to) the servers s names and returns the stage
// of a run whose timeline is printed to out (os.Stdout if nil). Defer
// Close.
func Start(ctx context.Context, out io.Writer, s Servers) (*Stage, error) {
	if out == nil {
		out = os.Stdout
	}
	id := RunID()
	st := &Stage{Timeline: NewTimeline(out), ID: id, KeyPrefix: "fencelock-example:" + id + ":", ctx: ctx}
	var err error
	st.Redis, err = StartRedis(ctx, s.RedisAddr)
	switch {
	case s.RedisMayBeDown && errors.Is(err, ErrNoAnswer):
		st.Redis, st.RedisDown = &Redis{Addr: s.RedisAddr, Desc: err.Error()}, err
	case err != nil:
		return nil, err
	}
	if !s.NoDatabase {
		if st.DB, err = OpenDB(ctx, s.DatabaseURL); err != nil {
			st.Redis.Close()
			return nil, err
		}
	}
	return st, nil
}

// DropAtEnd has Close drop tables, and returns them.
func (st *Stage) DropAtEnd(tables ...string) []string {
	st.tables = append(st.tables, tables...)
	return tables
}

// LockKeys returns the Redis keys of the run's locks named, and has Close
// delete them: the lock key, KeyPrefix+"{"+name+"}" (Options.KeyPrefix
// documents the format), normally gone already, and its fence counter, the
// same plus ":fence", which is not.
func (st *Stage) LockKeys(names ...string) []string {
	var keys []string
	for _, name := range names {
		key := st.KeyPrefix + "{" + name + "}"
		keys = append(keys, key, key+":fence")
	}
	st.keys = append(st.keys, keys...)
	return keys
}

// SemaphoreKeys returns the Redis keys of the run's semaphore name (see
// GUARANTEES.md, "Semaphores"), and has Close delete them.
func (st *Stage) SemaphoreKeys(name string) []string {
	key := st.KeyPrefix + "{" + name + "}:sem"
	keys := []string{key, key + ":h", key + ":fence", key + ":q", key + ":qi"}
	st.keys = append(st.keys, keys...)
	return keys
}

// Close deletes the run's keys and drops its tables, also when the run was
// cancelled, then stops the servers. It stores the first error in *errp
// unless that holds one already. A Redis that was down at the start and
// still does not answer keeps the keys, which expire by themselves: the
// timeline says so.
func (st *Stage) Close(errp *error) {
	keep := func(err error) {
		if err != nil && *errp == nil {
			*errp = err
		}
	}
	if len(st.keys) > 0 {
		err := DeleteKeys(st.ctx, st.Redis.Addr, st.keys...)
		if st.RedisDown != nil && errors.Is(err, ErrNoAnswer) {
			st.Timeline.Printf("parent", "redis still does not answer: no clean-up of its keys (any written expire by themselves)")
			err = nil
		}
		keep(err)
	}
	if st.DB != nil {
		keep(st.DB.DropTables(st.ctx, st.tables...))
		_ = st.DB.Close()
	}
	st.Redis.Close()
}
