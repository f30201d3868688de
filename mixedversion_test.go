package fencelock

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/redistest"
)

// mixedBase is the library version TestMixedVersions runs beside this one:
// the last landed before issue 36 changed the lock's scripts (a release
// always publishes its wake-up, and takes its arguments in another order).
const mixedBase = "373405f"

// TestMixedVersions runs the library at mixedBase and the library of this
// tree, each in a process of its own (testdata/mixed/driver.go built
// against each), on the same lock names at once, as during a rolling
// upgrade: waiting plainly, fairly, and on one name fairly through the old
// version and plainly through the new. Both must exclude each other (a
// witness counter never exceeds 1 inside the lock), and fences must
// increase across them (a fenced register refuses none).
func TestMixedVersions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the library at " + mixedBase + ": about a minute")
	}
	t.Parallel()
	for _, tool := range []string{"git", "go", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on PATH", tool)
		}
	}
	if err := exec.Command("git", "cat-file", "-e", mixedBase+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s not in this checkout's history (a shallow clone?): %v", mixedBase, err)
	}
	old := t.TempDir()
	archive := exec.Command("sh", "-c", "git archive --format=tar "+mixedBase+" | tar -x -C "+old)
	out, err := archive.CombinedOutput()
	require.NoError(t, err, "git archive: %s", out)
	here, err := os.Getwd()
	require.NoError(t, err)

	var bins [2]string
	var wg sync.WaitGroup
	var errs [2]error
	for i, lib := range []string{old, here} {
		bins[i] = filepath.Join(t.TempDir(), "driver")
		wg.Go(func() { errs[i] = buildDriver(t, lib, bins[i]) })
	}
	wg.Wait()
	require.NoError(t, errs[0], "the driver at %s", mixedBase)
	require.NoError(t, errs[1], "the driver of this tree")

	srv := redistest.Start(t)
	names := "plain,fair,both"
	runs := []struct {
		version string
		fair    string
	}{
		{mixedBase, "fair,both"},
		{"this tree", "fair"},
	}
	outs := make([]string, len(runs))
	for i, r := range runs {
		wg.Go(func() {
			cmd := exec.Command(bins[i], "-addr", srv.Addr, "-names", names, "-fair", r.fair, "-workers", "2", "-for", "3s")
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("%v: %s", err, stderr.String())
			}
			outs[i] = strings.TrimSpace(stdout.String())
		})
	}
	wg.Wait()
	for i, r := range runs {
		require.NoError(t, errs[i], r.version)
		var acquired, overlaps, stale, failed int
		_, err := fmt.Sscanf(outs[i], "acquired=%d overlaps=%d stale=%d failed=%d", &acquired, &overlaps, &stale, &failed)
		require.NoError(t, err, "%s: %q", r.version, outs[i])
		t.Logf("%s: %s", r.version, outs[i])
		assert.Positive(t, acquired, r.version)
		assert.Zero(t, overlaps, "%s: two holders at once", r.version)
		assert.Zero(t, stale, "%s: a fence not greater than an earlier holder's", r.version)
		assert.Zero(t, failed, "%s: a failed Acquire or Release", r.version)
	}
	admin := srv.Client(nil)
	for _, name := range strings.Split(names, ",") {
		n, err := admin.Get(context.Background(), "mixed:"+name+":inside").Int()
		require.NoError(t, err)
		assert.Zero(t, n, "%s: every holder left", name)
	}
}

// buildDriver builds testdata/mixed/driver.go against the library in lib,
// into bin, from the module cache alone.
func buildDriver(t *testing.T, lib, bin string) error {
	dir := t.TempDir()
	redisVersion, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/redis/go-redis/v9").Output()
	if err != nil {
		return fmt.Errorf("go list: %w", err)
	}
	mod := fmt.Sprintf("module mixeddriver\n\ngo 1.26\n\nrequire (\n\tgithub.com/fencelock/fencelock v0.0.0\n\tgithub.com/redis/go-redis/v9 %s\n)\n\nreplace github.com/fencelock/fencelock => %s\n",
		strings.TrimSpace(string(redisVersion)), lib)
	for file, data := range map[string][]byte{"go.mod": []byte(mod)} {
		if err := os.WriteFile(filepath.Join(dir, file), data, 0o600); err != nil {
			return err
		}
	}
	for _, f := range [][2]string{{"go.sum", "go.sum"}, {"testdata/mixed/driver.go", "main.go"}} {
		data, err := os.ReadFile(f[0])
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f[1]), data, 0o600); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOSUMDB=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w: %s", err, out)
	}
	return nil
}
