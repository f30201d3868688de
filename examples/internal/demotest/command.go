package demotest

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// commandEnv makes an example's test binary run as the example's command
// itself (see Command), so that tests can check what the command prints, its
// exit code and what it leaves behind.
const commandEnv = "FENCELOCK_EXAMPLE_COMMAND"

// Main is an example's TestMain. The example's command runs its own
// binary as its children, and Command runs the test binary as the command:
// in those roles the test binary runs cmd instead of the tests.
func Main(m *testing.M, cmd demo.Command) {
	if demo.IsChild() || os.Getenv(commandEnv) == "1" {
		os.Exit(cmd.Main())
	}
	// Under -race every process sleeps 1s at exit by default (the race
	// detector's atexit_sleep_ms); the children inherit this and exit at
	// once.
	_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	goleak.VerifyTestMain(m)
}

// Command returns the test binary set up to run as the example's command,
// as `go run ./examples/<name>` does: on the embedded servers unless env
// sets REDIS_ADDR or DATABASE_URL.
func Command(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), exe)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDIS_ADDR=") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, commandEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// RunCommand runs the example's command with env, as Command does, checks
// that it succeeds and prints nothing on stderr, and returns its stdout,
// which it logs.
func RunCommand(t *testing.T, env ...string) string {
	t.Helper()
	cmd := Command(t, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	require.NoError(t, cmd.Run(), "stderr: %s", stderr.String())
	t.Logf("the command took %v", time.Since(start).Round(time.Millisecond))
	out := stdout.String()
	t.Log("\n" + out)
	assert.Empty(t, stderr.String())
	return out
}

// BadInput runs the example's command with env, a bad REDIS_ADDR or
// DATABASE_URL, and checks that it ends with exit code 1 and the message
// want after the command's name on stderr, not a panic and without a
// password.
func BadInput(t *testing.T, name, env, want string) {
	t.Helper()
	cmd := Command(t, env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "stdout: %s", stdout.String())
	assert.Equal(t, 1, exit.ExitCode())
	assert.Contains(t, stderr.String(), name+": "+want)
	assert.NotContains(t, stderr.String(), "secret", "a password in an error message")
	assert.NotContains(t, stderr.String(), "goroutine ", "a panic")
}
