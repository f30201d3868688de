// Command modproxy writes a file-system module proxy (the layout GOPROXY=file://
// reads) holding the modules in the given directories, each at one version, so
// that a release can be tried as users will fetch it before it is tagged.
//
//	go run . -o DIR -version v0.1.0 ../.. ../../otel ../../gocron
//
// Each module is zipped by golang.org/x/mod/zip, as the go command zips a
// tagged commit: the files git would commit (tracked or new, not ignored) as
// they are in the working tree, less nested modules, with the zip's size and
// file-name rules checked. So it needs git, and a directory in a repository.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func main() {
	out := flag.String("o", "", "the proxy's directory (created if missing)")
	version := flag.String("version", "", "the version to give every module, e.g. v0.1.0")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: modproxy -o DIR -version VERSION MODULE_DIR...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || *version == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	for _, dir := range flag.Args() {
		path, err := add(*out, dir, *version)
		if err != nil {
			fmt.Fprintln(os.Stderr, "modproxy:", err)
			os.Exit(1)
		}
		fmt.Printf("modproxy: %s@%s from %s\n", path, *version, dir)
	}
}

// add writes the module in dir at version to the proxy in out: its @v/list,
// .info, .mod and .zip. It returns the module's path.
func add(out, dir, version string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	path := modfile.ModulePath(gomod)
	if path == "" {
		return "", fmt.Errorf("%s: no module line", filepath.Join(dir, "go.mod"))
	}
	m := module.Version{Path: path, Version: version}
	if err := module.Check(m.Path, m.Version); err != nil {
		return "", err
	}
	escPath, err := module.EscapePath(m.Path)
	if err != nil {
		return "", err
	}
	escVersion, err := module.EscapeVersion(m.Version)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}

	inZip, err := gitFiles(dir)
	if err != nil {
		return "", err
	}
	var zip bytes.Buffer
	if err := modzip.Create(&zip, m, inZip); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return "", err
	}
	files := []struct {
		name string
		data []byte
	}{
		{escVersion + ".zip", zip.Bytes()},
		{escVersion + ".mod", gomod},
		{escVersion + ".info", info},
		// One version per module: a proxy built for one release.
		{"list", []byte(m.Version + "\n")},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(vdir, f.name), f.data, 0o644); err != nil {
			return "", err
		}
	}
	return m.Path, nil
}

// gitFiles lists the files under dir that a commit made now would hold:
// tracked or untracked, not ignored, and present in the working tree. Unlike
// a walk of dir, it leaves out build output, and a worktree's .git file.
func gitFiles(dir string) ([]modzip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", dir, err)
	}
	var files []modzip.File
	for _, name := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		f := file{slash: name, path: filepath.Join(dir, filepath.FromSlash(name))}
		if _, err := os.Lstat(f.path); os.IsNotExist(err) {
			continue // deleted in the working tree, not yet in the index
		}
		files = append(files, f)
	}
	return files, nil
}

// file is one of gitFiles' files; modzip.Create skips those of nested
// modules and those that are not regular files.
type file struct {
	slash string // the path in the module, with slashes
	path  string // the path on disk
}

func (f file) Path() string                 { return f.slash }
func (f file) Lstat() (fs.FileInfo, error)  { return os.Lstat(f.path) }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.path) }
