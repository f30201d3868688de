// Package fipstest builds a program and runs it in FIPS 140-only mode
// (GODEBUG=fips140=only), where Go's crypto packages panic or fail on any
// algorithm FIPS 140-3 does not approve, SHA-1 among them. The tests of
// each module use it to show that a program using the library works there.
//
// The program is built as a user builds theirs, from a main package of its
// own, not as the test binary: a test file computing a SHA-1 at start-up (a
// redis.NewScript in a package variable) would make the test binary fail
// where the library does not.
package fipstest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildTimeout and runTimeout only keep a hung build or program from
// hanging the test; neither measures anything.
const (
	buildTimeout = 5 * time.Minute
	runTimeout   = 2 * time.Minute
)

// Build builds the main package in dir (as go build takes it, relative to
// the test's directory: "./testdata/fips") into a temporary directory, and
// returns the binary's path. It fails t when go is not on the PATH or the
// build fails.
func Build(t testing.TB, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("go not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	return bin
}

// Env returns env with fips140=only added to GODEBUG, after any setting
// GODEBUG had (the last setting of a name wins).
func Env(env []string) []string {
	godebug := "fips140=only"
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			if v != "" {
				godebug = v + "," + godebug
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "GODEBUG="+godebug)
}

// Run runs bin with args in FIPS 140-only mode and returns its standard
// output. It fails t, with both outputs, when the program does not exit 0.
func Run(t testing.TB, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = Env(os.Environ())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("GODEBUG=fips140=only %s %s: %v\nstdout:\n%s\nstderr:\n%s",
			filepath.Base(bin), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
