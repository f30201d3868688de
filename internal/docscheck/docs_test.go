package docscheck

import (
	"bufio"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// noCompile, on the line before a ```go fence, skips that fragment.
const noCompile = "<!-- no-compile -->"

// fragment is one fenced block of a Markdown file.
type fragment struct {
	file      string // relative to the repository root
	line      int    // line of the block's first line of code
	section   string // the heading the block is under, without its #s
	lang      string // the fence's info string: "go", "sql", or ""
	noCompile bool   // the line before the fence is noCompile
	code      string
}

// preamble declares what the fragments use without declaring it: the
// imports, the variables a fragment's surroundings would have, and the
// helpers it calls.
const preamble = `import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/fencesql"
	"github.com/redis/go-redis/v9"
)

var (
	_ = context.Background
	_ = sql.ErrNoRows
	_ = errors.Is
	_ = fmt.Errorf
	_ = fencelock.New
	_ = fencesql.NewGuard
	_ redis.UniversalClient
)

func computeSettlement(ctx context.Context, day string) (int64, error) { return 0, nil }
`

// statements wraps a fragment made of statements in a function that has the
// variables the fragments use as parameters. The fragment runs in a block of
// its own, so that it may declare locker and err with := or assign err.
const statements = `
func fragment(ctx context.Context, redisClient redis.UniversalClient, locker *fencelock.Locker, db *sql.DB, guard *fencesql.Guard, day, id string) error {
	var err error
	{
%s
	}
	return err
}
`

// TestDocsCompile compiles every ```go block of README.md and docs/*.md,
// with go build and an overlay, so that nothing is written to the tree. A
// compile error names the Markdown file and line (through //line).
func TestDocsCompile(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)

	var frags []fragment
	for _, f := range files {
		got, err := extract(f, root)
		if err != nil {
			t.Fatal(err)
		}
		frags = append(frags, got...)
	}
	if n := countIn(frags, "README.md"); n < 2 {
		t.Fatalf("got %d Go fragments in README.md, want at least 2 (Quick start and degraded runs)", n)
	}

	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for i, f := range frags {
		pkg := fmt.Sprintf("frag%d", i)
		src := "package " + pkg + "\n\n" + preamble + wrap(f)
		tmpFile := filepath.Join(tmp, pkg+".go")
		if err := os.WriteFile(tmpFile, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(root, "internal", "docscheck", "gen", pkg, "frag.go")] = tmpFile
		pkgs = append(pkgs, "./internal/docscheck/gen/"+pkg)
	}
	overlayJSON, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(overlayFile, overlayJSON, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(goTool, append([]string{"build", "-overlay=" + overlayFile}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a Go example in the docs does not compile:\n%s", out)
	}
	t.Logf("compiled %d Go fragments from %d files", len(frags), len(files))
}

// wrap returns a fragment as Go source to follow the preamble: top-level
// declarations as they are, statements inside a function. The //line
// directive makes compile errors point into the Markdown file.
func wrap(f fragment) string {
	directive := fmt.Sprintf("//line %s:%d\n", f.file, f.line)
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+f.code, 0); err == nil {
		return "\n" + directive + f.code
	}
	return fmt.Sprintf(statements, directive+f.code)
}

// extract returns the ```go blocks of a Markdown file, less those after a
// noCompile line.
func extract(path, root string) ([]fragment, error) {
	all, err := blocks(path, root)
	if err != nil {
		return nil, err
	}
	var frags []fragment
	for _, f := range all {
		if f.lang == "go" && !f.noCompile {
			frags = append(frags, f)
		}
	}
	return frags, nil
}

// blocks returns every fenced block of a Markdown file, with the heading it
// is under.
func blocks(path, root string) ([]fragment, error) {
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return nil, err
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()

	var (
		frags         []fragment
		cur           *fragment
		prev, section string
		n             int
	)
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur != nil && strings.HasPrefix(line, "```"):
			frags = append(frags, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		case strings.HasPrefix(line, "```"):
			cur = &fragment{file: filepath.ToSlash(rel), line: n + 1, section: section,
				lang: strings.TrimSpace(strings.TrimPrefix(line, "```")), noCompile: strings.TrimSpace(prev) == noCompile}
		case strings.HasPrefix(line, "#"):
			section = strings.TrimSpace(strings.TrimLeft(line, "#"))
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: a ```%s block is not closed", rel, cur.line-1, cur.lang)
	}
	return frags, nil
}

func countIn(frags []fragment, file string) int {
	n := 0
	for _, f := range frags {
		if f.file == file {
			n++
		}
	}
	return n
}
