package script

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "write assembled/ and hashes.go from the .lua files (go generate does)")

// preludes are the prelude files, in the order a script defines their
// functions: a function may call those of the files before its own.
var preludes = []string{"prelude", "line_prelude", "semaphore_prelude", "rwlock_prelude"}

// TestAssembled checks each script as sent (assembled/) against its .lua
// file and the preludes, and its hash, sent by EVALSHA, against the SHA-1
// of that: a stale hash would make a server that still caches the
// script's former text run that. With -update (go generate) it writes
// them instead.
func TestAssembled(t *testing.T) {
	sources, err := filepath.Glob("*.lua")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // name: source as sent
	for _, file := range sources {
		name := strings.TrimSuffix(file, ".lua")
		if !slices.Contains(preludes, name) {
			want[name] = assemble(t, name)
		}
	}
	sums := make(map[string]string, len(want))
	for name, src := range want {
		sum := sha1.Sum([]byte(src))
		sums[name] = hex.EncodeToString(sum[:])
	}
	if *update {
		write(t, want, sums)
		return
	}
	const fix = "run go generate ./internal/script"
	for _, s := range All {
		if s.Src != want[s.Name] {
			t.Errorf("assembled/%s.lua is not its .lua file and preludes as they are: %s", s.Name, fix)
		}
		if s.Hash != sums[s.Name] {
			t.Errorf("%s: hash %q, the SHA-1 of its source is %s: %s", s.Name, s.Hash, sums[s.Name], fix)
		}
	}
	for name := range want {
		if !slices.ContainsFunc(All, func(s *Script) bool { return s.Name == name }) {
			t.Errorf("%s.lua is not loaded by script.go", name)
		}
	}
	for name := range hashes {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: a hash and no script: %s", name, fix)
		}
	}
}

// assemble returns the script name.lua as sent: its file after the
// functions it calls of the prelude files. A function a script defines
// costs the server a closure at every run, called or not: a script gets
// only those it calls, and those only its part after a "--#prelude" line
// calls go there, so that the common case, before it, returns without
// making them.
func assemble(t *testing.T, name string) string {
	head, tail, split := strings.Cut(read(t, name), "--#prelude\n")
	done := map[string]bool{}
	src := withFunctions(t, head, done)
	if split {
		src += withFunctions(t, tail, done)
	}
	return src
}

// withFunctions returns src after the prelude functions it calls, but
// those of done, which it adds to done.
func withFunctions(t *testing.T, src string, done map[string]bool) string {
	for i := len(preludes) - 1; i >= 0; i-- {
		if f := functionsFor(t, preludes[i], src, done); f != "" {
			src = f + "\n" + src
		}
	}
	return src
}

// preludeFunc finds the name of a function of a prelude file.
var preludeFunc = regexp.MustCompile(`(?m)^local function (\w+)\(`)

// functionsFor returns the opening comment of file.lua and those of its
// functions src calls, directly or not, but those of done, which it adds
// to done; "" when none is needed. A function is its comment lines, its
// "local function" line and the lines up to the next one's comment.
func functionsFor(t *testing.T, file, src string, done map[string]bool) string {
	lines := strings.SplitAfter(read(t, file), "\n")
	var names []string
	var starts []int // each function's first comment line
	for i, line := range lines {
		if m := preludeFunc.FindStringSubmatch(line); m != nil {
			start := i
			for start > 0 && strings.HasPrefix(lines[start-1], "--") {
				start--
			}
			names, starts = append(names, m[1]), append(starts, start)
		}
	}
	body := func(i int) string {
		end := len(lines)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		return strings.Join(lines[starts[i]:end], "")
	}
	need := make([]bool, len(names))
	calls := src
	for changed := true; changed; {
		changed = false
		for i, name := range names {
			if !need[i] && regexp.MustCompile(`\b`+name+`\(`).MatchString(calls) {
				need[i], changed = true, true
				calls += body(i)
			}
		}
	}
	out := ""
	for i, name := range names {
		if need[i] && !done[file+"."+name] {
			done[file+"."+name] = true
			out += body(i)
		}
	}
	if out == "" {
		return ""
	}
	return strings.Join(lines[:starts[0]], "") + out
}

func read(t *testing.T, name string) string {
	src, err := os.ReadFile(name + ".lua")
	if err != nil {
		t.Fatal(err)
	}
	return string(src)
}

// write writes the scripts as sent into assembled/, and their hashes into
// hashes.go.
func write(t *testing.T, scripts, sums map[string]string) {
	old, _ := filepath.Glob("assembled/*.lua")
	for _, file := range old {
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll("assembled", 0o755); err != nil {
		t.Fatal(err)
	}
	for name, src := range scripts {
		if err := os.WriteFile("assembled/"+name+".lua", []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	b.WriteString(`// Code generated by go generate (TestAssembled); DO NOT EDIT.

package script

// hashes are the SHA-1s of the scripts as sent (assembled/), by name:
// EVALSHA runs a script by its hash, and no SHA-1 is computed at run time.
var hashes = map[string]string{
`)
	names := make([]string, 0, len(sums))
	for name := range sums {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(&b, "\t%q: %q,\n", name, sums[name])
	}
	b.WriteString("}\n")
	src, err := format.Source(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("hashes.go", src, 0o644); err != nil {
		t.Fatal(err)
	}
}
