// Command timelines draws the timelines of GUARANTEES.md's SIGSTOP and
// failover scenarios (S1, S3, S4) as SVG documents, with the standard
// library only so that GitHub shows them as images. The times are the
// scenarios' settings and the figures GUARANTEES.md reports for them; where
// a time is not measured (when before the fault the lock was taken) the
// diagram places it by eye and its caption says so.
//
// Usage, from chaos/:
//
//	go run ./cmd/timelines [-dir ../docs/diagrams]
package main

import (
	"encoding/xml"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	dir := flag.String("dir", "../docs/diagrams", "directory to write the SVG files to")
	flag.Parse()
	for _, d := range diagrams {
		if err := os.WriteFile(filepath.Join(*dir, d.name+".svg"), []byte(d.svg()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "timelines:", err)
			os.Exit(1)
		}
	}
}

// A diagram is lanes over one time axis.
type diagram struct {
	name    string // file name without .svg
	title   string
	caption []string
	from    float64 // the axis, in unit
	to      float64
	step    float64 // between ticks
	unit    string
	lanes   []lane
	bands   []band
}

// A lane is one process or resource: what it was doing when (spans) and
// what happened to it at an instant (marks).
type lane struct {
	label string
	spans []span
	marks []mark
}

type span struct {
	from, to float64
	label    string
	style    string // a key of styles
}

// A mark is an instant; its label goes below the lane, starting at the
// mark (or ending there, with left).
type mark struct {
	at    float64
	label string
	kind  string // "event", "ok" or "refused"
	left  bool
}

// A band highlights a stretch of time across every lane.
type band struct {
	from, to float64
	label    string
}

// styles are the fill and text colours of the spans.
var styles = map[string][2]string{
	"a":      {"#3b5bdb", "#ffffff"}, // worker A holds, or believes it holds
	"b":      {"#0ca678", "#ffffff"}, // another worker holds
	"c":      {"#087f5b", "#ffffff"}, // another worker holds (the next one)
	"paused": {"#adb5bd", "#212529"},
	"master": {"#e9ecef", "#212529"},
	"bad":    {"#ffa8a8", "#212529"},
	"none":   {"#ffffff", "#495057"},
}

const (
	width     = 900
	plotLeft  = 150
	plotRight = 860
	laneH     = 52
	barH      = 20
)

func (d diagram) x(t float64) float64 {
	return plotLeft + (t-d.from)/(d.to-d.from)*(plotRight-plotLeft)
}

func (d diagram) svg() string {
	top := 34.0 + 16*float64(len(d.caption)) + 18
	bottom := top + laneH*float64(len(d.lanes))
	height := bottom + 40

	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%.0f" viewBox="0 0 %d %.0f" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	p("<title>%s</title>\n", esc(d.title))
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="12" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", esc(d.title))
	for i, line := range d.caption {
		p(`<text x="12" y="%d" fill="#495057">%s</text>`+"\n", 44+16*i, esc(line))
	}

	// The bands, behind everything else.
	for _, b := range d.bands {
		p(`<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="#fff3bf"/>`+"\n", d.x(b.from), top-6, d.x(b.to)-d.x(b.from), bottom-top+6)
		p(`<text x="%.1f" y="%.0f" text-anchor="middle" font-weight="bold" fill="#e67700">%s</text>`+"\n", (d.x(b.from)+d.x(b.to))/2, top-9, esc(b.label))
	}

	// The axis and its grid.
	for t := d.from; t <= d.to+d.step/1000; t += d.step {
		t = math.Round(t/d.step) * d.step
		p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#e9ecef"/>`+"\n", d.x(t), top, d.x(t), bottom)
		p(`<text x="%.1f" y="%.0f" text-anchor="middle" fill="#495057">%s</text>`+"\n", d.x(t), bottom+16, esc(fmt.Sprintf("%g %s", t, d.unit)))
	}
	p(`<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#495057"/>`+"\n", plotLeft, bottom, plotRight, bottom)

	for i, l := range d.lanes {
		y := top + laneH*float64(i)
		p(`<text x="12" y="%.0f" font-weight="bold">%s</text>`+"\n", y+barH/2+4, esc(l.label))
		for _, s := range l.spans {
			st := styles[s.style]
			x0, x1 := d.x(s.from), d.x(s.to)
			dash := ""
			if s.style == "none" {
				dash = ` stroke-dasharray="4 3"`
			}
			p(`<rect class="span" x="%.1f" y="%.0f" width="%.1f" height="%d" rx="3" fill="%s" stroke="#495057" stroke-width="0.6"%s/>`+"\n",
				x0, y, x1-x0, barH, st[0], dash)
			if s.label != "" {
				p(`<text x="%.1f" y="%.0f" text-anchor="middle" fill="%s">%s</text>`+"\n", (x0+x1)/2, y+barH/2+4, st[1], esc(s.label))
			}
		}
		for _, m := range l.marks {
			x := d.x(m.at)
			switch m.kind {
			case "refused":
				p(`<path d="M%.1f %.0fl8 8m0 -8l-8 8" stroke="#c92a2a" stroke-width="2.5"/>`+"\n", x-4, y+barH/2-4)
			case "ok":
				p(`<path d="M%.1f %.0fl3 3l5 -7" stroke="#2b8a3e" stroke-width="2" fill="none"/>`+"\n", x-4, y+barH/2)
			default:
				p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#212529" stroke-width="2"/>`+"\n", x, y-3, x, y+barH+3)
			}
			anchor, dx := "start", 3.0
			if m.left {
				anchor, dx = "end", -3
			}
			if m.label != "" {
				p(`<text x="%.1f" y="%.0f" text-anchor="%s" font-size="11" fill="#212529">%s</text>`+"\n", x+dx, y+barH+15, anchor, esc(m.label))
			}
		}
	}
	p("</svg>\n")
	return sb.String()
}

func esc(s string) string {
	var sb strings.Builder
	xml.EscapeText(&sb, []byte(s))
	return sb.String()
}
