package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/examples/internal/demo"
	"github.com/fencelock/fencelock/examples/internal/demotest"
)

// commandEnv makes the test binary run as the ratelimit command itself.
const commandEnv = "FENCELOCK_RATELIMIT_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(commandEnv) == "1" {
		os.Exit(runMain())
	}
	// Under -race a process sleeps 1s at exit by default (the race
	// detector's atexit_sleep_ms); the command runs in a child process.
	_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	goleak.VerifyTestMain(m)
}

// TestStory runs the story on the embedded and on a real Redis and checks
// what happened: with the semaphore, at most 4 requests in flight and none
// refused, every instance served; without it, refusals.
func TestStory(t *testing.T) {
	for _, tt := range []struct {
		name  string
		redis func(t testing.TB) string
	}{
		{name: "embedded"},
		{name: "real redis", redis: demotest.RealRedis},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Out: demotest.Output(t)}
			if tt.redis != nil {
				cfg.RedisAddr = tt.redis(t)
			}
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
			if cfg.RedisAddr != "" {
				c, err := demo.NewRedisClient(t.Context(), cfg.RedisAddr)
				require.NoError(t, err)
				defer c.Close()
				n, err := c.Exists(t.Context(), res.Keys...).Result()
				require.NoError(t, err)
				assert.Zero(t, n, "keys left behind of %v", res.Keys)
			}
		})
	}
}

// TestCommand runs the command as `go run ./examples/ratelimit` does.
func TestCommand(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), exe)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDIS_ADDR=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, commandEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr: %s", stderr.String())
	out := stdout.String()
	t.Log("\n" + out)
	assert.Empty(t, stderr.String())
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
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), exe)
	cmd.Env = append(os.Environ(), commandEnv+"=1", "REDIS_ADDR=localhost")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, stderr.String(), `ratelimit: REDIS_ADDR "localhost": want host:port or a redis:// URL`)
}
