package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/examples/internal/demotest"
)

func TestMain(m *testing.M) {
	demotest.Main(m, command)
}

// TestStory runs the story on the embedded and on a real Redis and checks
// what happened: with the semaphore, at most 4 requests in flight and none
// refused, every instance served; without it, refusals.
func TestStory(t *testing.T) {
	demotest.Run(t, []demotest.Setup{demotest.Embedded, demotest.WithRedis}, func(t *testing.T, redisAddr, _ string) {
		cfg := Config{RedisAddr: redisAddr, Out: demotest.Output(t)}
		res, err := run(t.Context(), cfg)
		require.NoError(t, err)

		r := res.Limited
		assert.True(t, r.Limited)
		assert.Zero(t, r.API.Refused, "requests refused with the semaphore")
		assert.LessOrEqual(t, r.API.Most, limit, "in flight at once with the semaphore")
		assert.LessOrEqual(t, r.MostHeld, limit, "permits held at once")
		assert.Positive(t, r.API.Calls)
		assert.Equal(t, r.API.Calls, r.Fences, "one permit per request")
		for _, name := range instanceNames {
			assert.Positive(t, r.Sent[name], "%s sent nothing with the semaphore", name)
		}

		u := res.Unlimited
		assert.False(t, u.Limited)
		assert.Positive(t, u.API.Refused, "requests refused without the semaphore")
		assert.Zero(t, u.Fences)
		demotest.KeysGone(t, redisAddr, res.Keys)
	})
}

// TestCommand runs the command as `go run ./examples/ratelimit` does.
func TestCommand(t *testing.T) {
	out := demotest.RunCommand(t)
	m := regexp.MustCompile(`requests refused by the partner: (\d+) with the semaphore, (\d+) without`).FindStringSubmatch(out)
	require.Len(t, m, 3, "the summary line")
	with, _ := strconv.Atoi(m[1])
	without, _ := strconv.Atoi(m[2])
	assert.Zero(t, with)
	assert.Positive(t, without)
	assert.Regexp(t, `with the semaphore: \d+ requests served, 0 refused, at most [1-4] in flight at once`, out)
}

// TestCommandBadInput: a bad REDIS_ADDR ends the command with a clear
// message and exit code 1.
func TestCommandBadInput(t *testing.T) {
	demotest.BadInput(t, "ratelimit", "REDIS_ADDR=localhost", `REDIS_ADDR "localhost": want host:port or a redis:// URL`)
}
