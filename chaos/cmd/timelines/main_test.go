package main

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

// TestDiagrams checks that every diagram is well-formed XML with a span or
// mark in each lane, and that the files in docs/diagrams are the ones this
// command writes (go run ./cmd/timelines regenerates them).
func TestDiagrams(t *testing.T) {
	for _, d := range diagrams {
		t.Run(d.name, func(t *testing.T) {
			svg := d.svg()
			dec := xml.NewDecoder(strings.NewReader(svg))
			for {
				_, err := dec.Token()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("not well-formed XML: %v", err)
				}
			}
			for _, l := range d.lanes {
				if len(l.spans)+len(l.marks) == 0 {
					t.Errorf("lane %q is empty", l.label)
				}
			}
			if strings.Contains(svg, "<script") || strings.Contains(svg, "@font-face") {
				t.Error("a script or a font: GitHub would not show it")
			}
			want, err := os.ReadFile("../../../docs/diagrams/" + d.name + ".svg")
			if err != nil {
				t.Fatal(err)
			}
			if svg != string(want) {
				t.Errorf("docs/diagrams/%s.svg is not what this command writes: run go run ./cmd/timelines in chaos/", d.name)
			}
		})
	}
}
