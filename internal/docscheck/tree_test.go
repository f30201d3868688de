package docscheck

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTracked is the largest file the repository keeps: its biggest documents
// and benchmark results are about a tenth of it, a built binary ten times it.
const maxTracked = 1 << 20

// executableMagic are the first bytes of the executables and object files a
// build writes: ELF, Mach-O (both byte orders, 32 and 64 bits) and PE.
var executableMagic = [][]byte{
	[]byte("\x7fELF"),
	{0xfe, 0xed, 0xfa, 0xce}, {0xce, 0xfa, 0xed, 0xfe},
	{0xfe, 0xed, 0xfa, 0xcf}, {0xcf, 0xfa, 0xed, 0xfe},
	[]byte("MZ"),
}

// TestNoBuildOutputTracked fails when git tracks a built executable or a
// file over maxTracked bytes: build outputs stay out of the tree
// (.gitignore), and a commit that adds one anyway fails here.
func TestNoBuildOutputTracked(t *testing.T) {
	root := repoRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		path := filepath.Join(root, filepath.FromSlash(name))
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, a symlink or a submodule
		}
		if magic := head(t, path); isExecutable(magic) {
			t.Errorf("%s is tracked and is an executable (starts % x): remove it with git rm --cached; .gitignore keeps build outputs out", name, magic)
		} else if fi.Size() > maxTracked {
			t.Errorf("%s is tracked and %d bytes (over %d): a build output or data that belongs elsewhere", name, fi.Size(), maxTracked)
		}
	}
}

// TestBuildOutputsIgnored checks that git ignores what `go build` and
// `go test -c` write in the command's directory and what profiling writes.
func TestBuildOutputsIgnored(t *testing.T) {
	root := repoRoot(t)
	for _, name := range []string{
		"cmd/fencelock/fencelock",
		"cmd/fencelock/fencelock.exe",
		"cmd/fencelock/main.test",
		"fencelock.test",
		"cpu.prof",
		"mem.pprof",
		"cover.out",
	} {
		cmd := exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", name)
		if err := cmd.Run(); err != nil {
			if _, ok := err.(*exec.ExitError); !ok {
				t.Skipf("git check-ignore: %v", err)
			}
			t.Errorf("git does not ignore %s, a build output", name)
		}
	}
	for _, name := range []string{"cmd/fencelock/main.go", "cmd/fencelock/doc.go", "README.md"} {
		if err := exec.Command("git", "-C", root, "check-ignore", "-q", "--no-index", name).Run(); err == nil {
			t.Errorf("git ignores %s, a source", name)
		}
	}
}

// repoRoot returns the repository's root, two directories up; it skips the
// test when git is missing.
func repoRoot(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// head returns the first four bytes of the file at path (fewer if it is
// shorter).
func head(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 4)
	n, err := io.ReadFull(f, b)
	if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
		t.Fatal(err)
	}
	return b[:n]
}

func isExecutable(magic []byte) bool {
	for _, m := range executableMagic {
		if bytes.HasPrefix(magic, m) {
			return true
		}
	}
	return false
}
