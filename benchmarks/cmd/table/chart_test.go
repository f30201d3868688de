package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestChart(t *testing.T) {
	// Two rounds of two groups: fencelock against two peers where one
	// client works alone (ns/op: less is better), and fencelock and
	// fencelock-fair against one peer under contention (cs/s: more is);
	// raw is a baseline, not a peer, and gets no bar.
	const round = `
library: abc1234 a commit
BenchmarkUncontended/fencelock      100  1000 ns/op
BenchmarkUncontended/redislock      100   800 ns/op
BenchmarkUncontended/redsync        100  2000 ns/op
BenchmarkUncontended/raw            100   700 ns/op
BenchmarkContended/fencelock-2       1  1 ns/op  500 cs/s
BenchmarkContended/fencelock-fair-2  1  1 ns/op  600 cs/s
BenchmarkContended/rueidislock-2     1  1 ns/op  400 cs/s
`
	r := parse(t, round+strings.ReplaceAll(round, "500 cs/s", "300 cs/s"))
	var out bytes.Buffer
	if err := r.writeChart(&out, "fixture.txt"); err != nil {
		t.Fatal(err)
	}

	svg := out.String()

	// Well-formed XML, and the id of every bar.
	var ids []string
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "rect" {
			var class, id string
			for _, a := range el.Attr {
				switch a.Name.Local {
				case "class":
					class = a.Value
				case "id":
					id = a.Value
				}
			}
			if class == "bar" {
				ids = append(ids, id)
			}
		}
	}
	want := []string{
		"Uncontended/fencelock/redislock",
		"Uncontended/fencelock/redsync",
		"Contended/fencelock/rueidislock",
		"Contended/fencelock-fair/rueidislock",
	}
	if !slices.Equal(ids, want) {
		t.Errorf("bars %q, want %q", ids, want)
	}

	// The figures beside the bars: how many times as fast as the peer, and
	// the rounds' range (Contended's rounds: 1.25× and 0.75×).
	for _, s := range []string{"0.80×", "2.00×", "1.00×  (0.75–1.25)", "1.50×  (1.50–1.50)", "library abc1234", "2 rounds"} {
		if !strings.Contains(svg, s) {
			t.Errorf("chart lacks %q:\n%s", s, svg)
		}
	}
}

func TestChartNoPeers(t *testing.T) {
	r := parse(t, "BenchmarkUncontended/fencelock 100 1000 ns/op\nBenchmarkUncontended/raw 100 700 ns/op\n")
	if err := r.writeChart(io.Discard, "x"); err == nil {
		t.Error("a chart with no peer: no error")
	}
}

// TestChartsCurrent checks that the charts README.md opens with are the
// ones cmd/table writes from the results files beside them (bench.sh
// regenerates both; so does go run ./cmd/table -svg results/NAME.svg
// results/NAME.txt).
func TestChartsCurrent(t *testing.T) {
	for _, name := range []string{"latest", "redlock-latest"} {
		r, err := readInputs([]string{"../../results/" + name + ".txt"})
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := r.writeChart(&got, "results/"+name+".txt"); err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile("../../results/" + name + ".svg")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("results/%s.svg is not what cmd/table writes from results/%s.txt: run go run ./cmd/table -svg results/%s.svg results/%s.txt", name, name, name, name)
		}
	}
}
