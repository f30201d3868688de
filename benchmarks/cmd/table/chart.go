package main

// The chart that opens README.md: fencelock against each peer, per
// scenario, as an SVG document written with the standard library only, so
// that GitHub shows it as an image (no scripts, no external fonts).

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// chartMetrics is the one metric the chart shows for each group: the time
// of an operation where one client works alone, critical sections per
// second where several contend. Groups not listed show cs/s when it was
// measured, ns/op otherwise.
var chartMetrics = map[string]string{
	"Uncontended":           "ns/op",
	"Interleaved":           "p50-ns/op",
	"Parallel":              "ns/op",
	"Contended":             "cs/s",
	"ContendedHandoff":      "cs/s",
	"ContendedHandoff64":    "cs/s",
	"RedlockUncontended":    "ns/op",
	"RedlockContended":      "cs/s",
	"RedlockContendedProcs": "cs/s",
}

// chartSubjects are the implementations drawn against each peer, each in
// its own colour; fencelock-fair appears only where it was measured (the
// contended groups).
var chartSubjects = []struct{ name, colour string }{
	{subject, "#3b5bdb"},
	{subjectFair, "#0ca678"},
}

// A bar is one subject against one peer in one group: how many times as
// fast as the peer the subject was (greater than 1 when it is ahead), from
// the medians, and the lowest and highest of the same ratio over the rounds
// paired in order (NaN when the two were not measured as often).
type bar struct {
	group, subject, peer string
	ratio, lo, hi        float64
}

func (r *results) chartMetric(group string) string {
	if u, ok := chartMetrics[group]; ok {
		return u
	}
	if slices.Contains(r.units(group), "cs/s") {
		return "cs/s"
	}
	return "ns/op"
}

// bars returns the chart's bars, by group in the order of the tables.
func (r *results) bars() []bar {
	var bs []bar
	for _, g := range ordered(groups, keys(r.runs)) {
		unit := r.chartMetric(g)
		for _, s := range chartSubjects {
			for _, p := range peers {
				sv, pv := r.runs[g][s.name][unit], r.runs[g][p][unit]
				if len(sv) == 0 || len(pv) == 0 {
					continue
				}
				b := bar{group: g, subject: s.name, peer: p, lo: math.NaN(), hi: math.NaN()}
				b.ratio = median(sv) / median(pv)
				lo, hi, n := pairedRatios(sv, pv)
				if n > 1 {
					b.lo, b.hi = lo, hi
				}
				if !higherIsBetter[unit] {
					// A time: the subject is ahead when it takes less.
					b.ratio, b.lo, b.hi = 1/b.ratio, 1/b.hi, 1/b.lo
				}
				bs = append(bs, b)
			}
		}
	}
	return bs
}

// Layout of the chart, in pixels.
const (
	chartWidth = 860
	labelRight = 236 // right edge of the row labels
	plotLeft   = 250
	plotRight  = 610
	valueLeft  = 622 // left edge of the figures beside the bars
	rowHeight  = 19
	barHeight  = 11
	groupGap   = 26 // the group's heading line
)

// writeChart writes the chart of the bars as an SVG document. source names
// the results file(s) it comes from, for the caption.
func (r *results) writeChart(w io.Writer, source string) error {
	bs := r.bars()
	if len(bs) == 0 {
		return fmt.Errorf("no group has both %s and a peer (%s) to chart", subject, strings.Join(peers, ", "))
	}

	// A log scale, so that 2× ahead and 2× behind are as long, from the
	// powers of 2 around every ratio and whisker end (at least ½× to 2×).
	lo, hi := 0.5, 2.0
	for _, b := range bs {
		for _, v := range []float64{b.ratio, b.lo, b.hi} {
			if !math.IsNaN(v) && v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	loExp, hiExp := math.Floor(math.Log2(lo)), math.Ceil(math.Log2(hi))
	x := func(v float64) float64 {
		return plotLeft + (math.Log2(v)-loExp)/(hiExp-loExp)*(plotRight-plotLeft)
	}

	rounds := 0
	for _, byImpl := range r.runs {
		for _, byUnit := range byImpl {
			for _, vs := range byUnit {
				rounds = max(rounds, len(vs))
			}
		}
	}
	var used []string
	for _, b := range bs {
		if !slices.Contains(used, b.subject) {
			used = append(used, b.subject)
		}
	}
	colour := func(subj string) string {
		for _, s := range chartSubjects {
			if s.name == subj {
				return s.colour
			}
		}
		return "#495057"
	}

	// The rows: a heading per group, then its bars.
	top := 118.0
	height := top
	prev := ""
	for _, b := range bs {
		if b.group != prev {
			height += groupGap
			prev = b.group
		}
		height += rowHeight
	}
	height += 44 // the axis labels below

	var sb strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&sb, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%.0f" viewBox="0 0 %d %.0f" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	p("<title>%s</title>\n", esc(fmt.Sprintf("fencelock against each peer, per scenario, from %s", source)))
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	p(`<text x="12" y="24" font-size="16" font-weight="bold">%s</text>`+"\n",
		esc("How many times as fast as each peer fencelock was, per scenario"))
	for i, line := range []string{
		fmt.Sprintf("Bar: the ratio of the medians of %s — ns/op scenarios: the peer's ns/op ÷ fencelock's; contended: fencelock's cs/s ÷ the peer's.", plural(rounds, "round")),
		"Whisker: the lowest to the highest ratio of the rounds paired in order. Right of 1× fencelock is ahead. Log scale.",
		"From " + source + r.libraryCaption() + "; the tables below give every metric.",
	} {
		p(`<text x="12" y="%d" fill="#495057">%s</text>`+"\n", 44+16*i, esc(line))
	}
	lx := 12.0
	for _, s := range used {
		p(`<rect x="%.0f" y="86" width="14" height="%d" fill="%s"/>`+"\n", lx, barHeight, colour(s))
		p(`<text x="%.0f" y="96">%s</text>`+"\n", lx+20, esc(s))
		lx += 20 + 8*float64(len(s)) + 24
	}

	// Grid lines and their labels, above and below the rows.
	bottom := height - 44
	for e := loExp; e <= hiExp; e++ {
		v := math.Exp2(e)
		stroke, sw := "#dee2e6", 1.0
		if e == 0 {
			stroke, sw = "#212529", 1.5
		}
		p(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s" stroke-width="%.1f"/>`+"\n", x(v), top, x(v), bottom, stroke, sw)
		p(`<text x="%.1f" y="%.0f" text-anchor="middle" fill="#495057">%s</text>`+"\n", x(v), bottom+16, esc(times1(v)))
	}
	p(`<text x="%.1f" y="%.0f" text-anchor="end" fill="#495057">%s</text>`+"\n", x(1)-6, bottom+34, esc("← fencelock behind"))
	p(`<text x="%.1f" y="%.0f" fill="#495057">%s</text>`+"\n", x(1)+6, bottom+34, esc("fencelock ahead →"))

	y := top
	prev = ""
	for _, b := range bs {
		if b.group != prev {
			y += groupGap
			p(`<text x="12" y="%.0f" font-weight="bold">%s</text>`+"\n", y-7, esc(b.group))
			p(`<text x="%d" y="%.0f" fill="#868e96">%s</text>`+"\n", 12+8*len(b.group)+14, y-7, esc(r.chartMetric(b.group)))
			prev = b.group
		}
		mid := y + rowHeight/2.0
		p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", labelRight, mid+4, esc(b.subject+" vs "+b.peer))
		x0, x1 := x(1), x(b.ratio)
		p(`<rect class="bar" id="%s" x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s"/>`+"\n",
			esc(b.group+"/"+b.subject+"/"+b.peer), min(x0, x1), mid-barHeight/2.0, math.Abs(x1-x0), barHeight, colour(b.subject))
		figure := times2(b.ratio)
		if !math.IsNaN(b.lo) {
			wl, wh := x(b.lo), x(b.hi)
			p(`<path d="M%.1f %.1fH%.1fM%.1f %.1fV%.1fM%.1f %.1fV%.1f" stroke="#212529" stroke-width="1.2" fill="none"/>`+"\n",
				wl, mid, wh, wl, mid-4, mid+4, wh, mid-4, mid+4)
			figure += fmt.Sprintf("  (%.2f–%.2f)", b.lo, b.hi)
		}
		p(`<text x="%d" y="%.1f">%s</text>`+"\n", valueLeft, mid+4, esc(figure))
		y += rowHeight
	}
	p("</svg>\n")
	_, err := io.WriteString(w, sb.String())
	return err
}

// libraryCaption is ", library HASH" from the results' library: line, or "".
func (r *results) libraryCaption() string {
	for _, h := range r.header {
		if rest, ok := strings.CutPrefix(h, "library: "); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return ", library " + f[0]
			}
		}
	}
	return ""
}

// times1 labels a grid line: 0.25×, 1×, 4×.
func times1(v float64) string {
	return fmt.Sprintf("%g×", v)
}

func times2(v float64) string {
	return fmt.Sprintf("%.2f×", v)
}

func esc(s string) string {
	var sb strings.Builder
	xml.EscapeText(&sb, []byte(s))
	return sb.String()
}

// plural returns "1 round" or "5 rounds".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
