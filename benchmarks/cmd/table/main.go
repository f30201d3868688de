// Command table turns the output of the benchmarks in this module
// (go test -bench, any -count) into the Markdown tables of README.md: the
// median of every metric per implementation, each implementation's ratio to
// the raw baseline, fencelock's ratio to each peer, and the targets fencelock
// is held to.
//
// Usage:
//
//	go test -run '^$' -bench . -benchmem -count 5 | tee bench.txt
//	go run ./cmd/table [-update README.md] [-svg chart.svg] [-check] [bench.txt ...]
//
// It reads standard input when no file is named. -update replaces the text
// between the lines <!-- bench-table:begin --> and <!-- bench-table:end -->
// of the named file instead of printing (with -section NAME, between
// <!-- bench-table:NAME:begin --> and <!-- bench-table:NAME:end -->);
// -svg also writes a chart of fencelock against each peer per scenario
// (chart.go) to the named file; -check exits with status 1 when a target
// is not met.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

const (
	subject  = "fencelock"
	baseline = "raw"
	// subjectCTE is fencelock over a go-redis client with
	// ContextTimeoutEnabled, the one client option its documentation
	// recommends; subject has go-redis's default options.
	subjectCTE = "fencelock-cte"
	// subjectAP is fencelock over the AutoPipeliner of a client with
	// default options (client.AutoPipeline()), in the uncontended
	// benchmarks only.
	subjectAP = "fencelock-ap"
	// subjectFair is fencelock (default options) waiting in line
	// (WithWait and WithFair), in the contended benchmarks only.
	subjectFair = "fencelock-fair"
	// baseline1ms is the raw baseline polling every millisecond instead of
	// every 10, in the contended benchmarks only: issue 16's "1 ms poller".
	baseline1ms = "raw-1ms"
)

// impls is the order of the rows; implementations not listed follow.
var impls = []string{subject, subjectFair, subjectCTE, subjectAP, "redislock", "redsync", "rueidislock", "fencelock-rueidis", "fencelock-rueidis-fair", baseline, baseline1ms}

// subjects are the implementations compared with each other one (each in
// the groups that have it); issue13Subjects are those issue 13's targets
// are checked for; peers are the other locks (neither a subject nor a
// baseline).
var (
	subjects        = []string{subject, subjectFair, subjectCTE, subjectAP}
	issue13Subjects = []string{subject, subjectCTE}
	peers           = []string{"redislock", "redsync", "rueidislock"}
)

// groups is the order of the sections; groups not listed follow.
var groups = append(slices.Clone(singleGroups), redlockGroups...)

// metricOrder is the order of the columns; metrics not listed follow, sorted.
var metricOrder = []string{
	"ns/op", "p50-ns/op", "mean-ns/op", "B/op", "allocs/op", "srv-ns/op", "cs/s", "busy",
	"handoff-p50-ms", "handoff-p99-ms", "wait-p50-ms", "wait-p99-ms",
	"fairness", "fails", "overlaps",
}

// higherIsBetter lists the metrics where more is better; for all others less
// is.
var higherIsBetter = map[string]bool{"cs/s": true, "busy": true, "fairness": true}

func main() {
	update := flag.String("update", "", "replace the table section of this file instead of printing")
	section := flag.String("section", "", "with -update: the name in the markers of the section to replace")
	svg := flag.String("svg", "", "also write the chart of fencelock against each peer to this SVG file")
	check := flag.Bool("check", false, "exit with status 1 when a target is not met")
	flag.Parse()

	res, err := readInputs(flag.Args())
	if err != nil {
		fail(err)
	}
	if len(res.runs) == 0 {
		fail(errors.New("no benchmark results in the input"))
	}
	var out bytes.Buffer
	met := res.write(&out)
	if *update != "" {
		if err := replaceSection(*update, *section, out.String()); err != nil {
			fail(err)
		}
	} else {
		os.Stdout.Write(out.Bytes())
	}
	if *svg != "" {
		var chart bytes.Buffer
		if err := res.writeChart(&chart, strings.Join(res.inputs, ", ")); err != nil {
			fail(err)
		}
		if err := os.WriteFile(*svg, chart.Bytes(), 0o644); err != nil {
			fail(err)
		}
	}
	if *check && !met {
		fmt.Fprintln(os.Stderr, "table: targets not met")
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "table:", err)
	os.Exit(2)
}

// results holds every value of every metric, by group, implementation and
// unit, in input order.
type results struct {
	inputs []string // file names, or "standard input"
	header []string // library, command and load (written by bench.sh), goos, goarch and cpu lines
	runs   map[string]map[string]map[string][]float64
}

func readInputs(names []string) (*results, error) {
	r := &results{runs: make(map[string]map[string]map[string][]float64)}
	if len(names) == 0 {
		r.inputs = []string{"standard input"}
		return r, r.parse(os.Stdin)
	}
	r.inputs = names
	for _, name := range names {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		err = r.parse(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return r, nil
}

var (
	benchLine = regexp.MustCompile(`^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)
	procs     = regexp.MustCompile(`-\d+$`)
)

func (r *results) parse(in io.Reader) error {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := sc.Text()
		for _, key := range []string{"library:", "command:", "load:", "goos:", "goarch:", "cpu:"} {
			if strings.HasPrefix(line, key) && !slices.Contains(r.header, line) {
				r.header = append(r.header, line)
			}
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		group, impl, sub := strings.Cut(procs.ReplaceAllString(m[1], ""), "/")
		fields := strings.Fields(m[2])
		if len(fields)%2 != 0 {
			return fmt.Errorf("odd number of fields in %q", line)
		}
		for i := 0; i < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return fmt.Errorf("value %q in %q: %w", fields[i], line, err)
			}
			unit := fields[i+1]
			if !sub {
				// One benchmark measuring several implementations
				// (Interleaved): their metrics are IMPL:UNIT.
				var ok bool
				if impl, unit, ok = strings.Cut(unit, ":"); !ok {
					continue
				}
			}
			r.add(group, impl, unit, v)
		}
	}
	return sc.Err()
}

func (r *results) add(group, impl, unit string, v float64) {
	if r.runs[group] == nil {
		r.runs[group] = make(map[string]map[string][]float64)
	}
	if r.runs[group][impl] == nil {
		r.runs[group][impl] = make(map[string][]float64)
	}
	r.runs[group][impl][unit] = append(r.runs[group][impl][unit], v)
}

// value returns the median of a metric, or NaN when it was not measured.
func (r *results) value(group, impl, unit string) float64 {
	return median(r.runs[group][impl][unit])
}

func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// spread returns the largest distance of a value from the median, as a
// fraction of the median (0 for one run).
func spread(vs []float64) float64 {
	m := median(vs)
	if m == 0 || math.IsNaN(m) {
		return 0
	}
	var d float64
	for _, v := range vs {
		d = max(d, math.Abs(v-m))
	}
	return d / math.Abs(m)
}

func ordered(known []string, have []string) []string {
	var out []string
	for _, k := range known {
		if slices.Contains(have, k) {
			out = append(out, k)
		}
	}
	var rest []string
	for _, h := range have {
		if !slices.Contains(known, h) {
			rest = append(rest, h)
		}
	}
	slices.Sort(rest)
	return append(out, rest...)
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func (r *results) units(group string) []string {
	var have []string
	for _, byUnit := range r.runs[group] {
		for u := range byUnit {
			if !slices.Contains(have, u) {
				have = append(have, u)
			}
		}
	}
	return ordered(metricOrder, have)
}

// write prints the machine, the tables and the targets, and reports whether
// every target was met.
func (r *results) write(w io.Writer) bool {
	r.writeMachine(w)
	for _, g := range ordered(groups, keys(r.runs)) {
		r.writeGroup(w, g)
	}
	return r.writeTargets(w)
}

func (r *results) writeMachine(w io.Writer) {
	fmt.Fprintln(w, "Machine (the benchmark header, and this machine as cmd/table sees it):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "```")
	for _, h := range r.header {
		fmt.Fprintln(w, h)
	}
	fmt.Fprintf(w, "nproc: %d\n", runtime.NumCPU())
	if model := cpuModel(); model != "" {
		fmt.Fprintf(w, "model name: %s\n", model)
	}
	fmt.Fprintf(w, "go: %s\n", runtime.Version())
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		fmt.Fprintf(w, "redis-server: %s\n", strings.TrimSpace(string(out)))
	}
	fmt.Fprintln(w, "```")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Raw output: %s.\n\n", strings.Join(r.inputs, ", "))
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func (r *results) writeGroup(w io.Writer, g string) {
	units := r.units(g)
	rows := ordered(impls, keys(r.runs[g]))
	n := 0
	for _, byUnit := range r.runs[g] {
		for _, vs := range byUnit {
			n = max(n, len(vs))
		}
	}
	fmt.Fprintf(w, "### %s\n\n", g)
	fmt.Fprintf(w, "Median of %d run(s); ± is the largest distance of a run from the median.\n\n", n)
	table(w, "implementation", units, rows, func(impl, u string) string {
		vs := r.runs[g][impl][u]
		if len(vs) == 0 {
			return "–"
		}
		s := num(median(vs))
		if sp := spread(vs); sp >= 0.005 {
			s += fmt.Sprintf(" ±%.0f%%", sp*100)
		}
		return s
	})

	if slices.Contains(rows, baseline) {
		fmt.Fprintf(w, "Ratio to %s (implementation ÷ %s):\n\n", baseline, baseline)
		table(w, "implementation", units, without(rows, baseline), func(impl, u string) string {
			return ratio(r.value(g, impl, u), r.value(g, baseline, u), u)
		})
	}
	for _, subj := range subjects {
		if !slices.Contains(rows, subj) {
			continue
		}
		fmt.Fprintf(w, "%s ÷ each other implementation (\"behind\": %s is worse on that metric):\n\n", subj, subj)
		table(w, "vs", units, without(rows, subj), func(impl, u string) string {
			return ratio(r.value(g, subj, u), r.value(g, impl, u), u)
		})
	}
}

func without(rows []string, drop string) []string {
	return slices.DeleteFunc(slices.Clone(rows), func(s string) bool { return s == drop })
}

func table(w io.Writer, corner string, units, rows []string, cell func(row, unit string) string) {
	fmt.Fprintf(w, "| %s | %s |\n", corner, strings.Join(units, " | "))
	fmt.Fprintf(w, "|---%s|\n", strings.Repeat("|--:", len(units)))
	for _, row := range rows {
		cells := make([]string, len(units))
		for i, u := range units {
			cells[i] = cell(row, u)
		}
		fmt.Fprintf(w, "| %s | %s |\n", row, strings.Join(cells, " | "))
	}
	fmt.Fprintln(w)
}

// ratio formats a ÷ b and says whether a is behind (worse than) b on unit.
func ratio(a, b float64, unit string) string {
	switch {
	case math.IsNaN(a) || math.IsNaN(b):
		return "–"
	case a == b:
		return "same"
	case b == 0:
		return fmt.Sprintf("%s vs 0%s", num(a), verdict(a, b, unit))
	}
	return fmt.Sprintf("%.2f×%s", a/b, verdict(a, b, unit))
}

func verdict(a, b float64, unit string) string {
	if math.Abs(a/b-1) >= 0.005 && worse(a, b, unit) {
		return " behind"
	}
	return ""
}

func worse(a, b float64, unit string) bool {
	if higherIsBetter[unit] {
		return a < b
	}
	return a > b
}

func num(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case a == 0 || a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 4, 64)
}

// Groups of the single-deployment benchmarks and of the Redlock ones (over
// several independent servers); each has its own targets.
var (
	singleGroups  = []string{"Uncontended", "Interleaved", "Parallel", "Contended", "ContendedHandoff", "ContendedHandoff64"}
	redlockGroups = []string{"RedlockUncontended", "RedlockContended", "RedlockContendedProcs"}
)

// hasAny reports whether the input has results of any of groups.
func (r *results) hasAny(groups []string) bool {
	return slices.ContainsFunc(groups, func(g string) bool { return len(r.runs[g]) > 0 })
}

// writeTargets prints the targets fencelock is held to, each with its
// measurement, and reports whether all were met: the single-deployment
// targets when the input has those benchmarks (or no Redlock ones), the
// Redlock targets when it has Redlock benchmarks.
func (r *results) writeTargets(w io.Writer) bool {
	all := true
	if r.hasAny(singleGroups) || !r.hasAny(redlockGroups) {
		all = r.targetTable(w, "Targets", r.singleTargets) && all
	}
	if r.hasAny(redlockGroups) {
		all = r.targetTable(w, "Redlock targets", r.redlockTargets) && all
	}
	return all
}

// A targetRow prints one target: what it is, what was measured, whether it
// was met, and whether every figure it needs was measured.
type targetRow func(target, measured string, ok, known bool)

// targetTable prints a table of the targets that rows lists and reports
// whether all were met; a target not measured counts as not met.
func (r *results) targetTable(w io.Writer, title string, rows func(row targetRow)) bool {
	all := true
	fmt.Fprintf(w, "### %s\n\n", title)
	fmt.Fprintln(w, "Medians, except overlaps (the largest of any run of any implementation) and fairness (also the lowest run).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | met |")
	fmt.Fprintln(w, "|---|---|---|")
	rows(func(target, measured string, ok, known bool) {
		mark := "yes"
		switch {
		case !known:
			mark, ok = "not measured", false
		case !ok:
			mark = "**no**"
		}
		all = all && ok
		fmt.Fprintf(w, "| %s | %s | %s |\n", target, measured, mark)
	})
	fmt.Fprintln(w)
	return all
}

func known(vs ...float64) bool {
	return !slices.ContainsFunc(vs, math.IsNaN)
}

// worstOverlaps is the largest overlaps of any run of any implementation in
// group, or NaN when none was measured.
func (r *results) worstOverlaps(group string) float64 {
	worst := math.NaN()
	for _, byUnit := range r.runs[group] {
		for _, o := range byUnit["overlaps"] {
			if math.IsNaN(worst) || o > worst {
				worst = o
			}
		}
	}
	return worst
}

// singleTargets are the targets of fencelock.New on one redis-server: issue
// 13's (throughput and scale), for go-redis's default options (subject) and
// for the one documented option, ContextTimeoutEnabled (subjectCTE); issue
// 16's, for fair waiting (subjectFair) in Contended; and the earlier ones
// the contended benchmark was made for.
func (r *results) singleTargets(row targetRow) {
	v := r.value
	for _, subj := range issue13Subjects {
		if !slices.ContainsFunc([]string{"Uncontended", "Interleaved", "Parallel"}, func(g string) bool { return len(r.runs[g][subj]) > 0 }) {
			continue
		}
		for _, c := range []struct{ group, unit string }{
			{"Uncontended", "ns/op"}, {"Uncontended", "p50-ns/op"}, {"Interleaved", "p50-ns/op"},
		} {
			f, raw := v(c.group, subj, c.unit), v(c.group, baseline, c.unit)
			if c.group == "Interleaved" && !known(f, raw) {
				continue // an older results file
			}
			row(fmt.Sprintf("13: %s %s ≤ 1.10 × raw (%s)", c.group, c.unit, subj),
				fmt.Sprintf("%s vs %s: %.2f×%s", num(f), num(raw), f/raw, r.paired(c.group, c.unit, subj, baseline)),
				f <= 1.10*raw, known(f, raw))
		}
		f := v("Uncontended", subj, "allocs/op")
		row(fmt.Sprintf("13: Uncontended allocs/op ≤ 25 (%s)", subj), num(f), f <= 25, known(f))
		// Throughput is the reciprocal of ns/op.
		f, ru := v("Parallel", subj, "ns/op"), v("Parallel", "rueidislock", "ns/op")
		row(fmt.Sprintf("13: Parallel throughput ≥ 1.25 × rueidislock's (%s)", subj),
			fmt.Sprintf("%s vs %s ns/op: %.2f×%s", num(f), num(ru), ru/f, r.paired("Parallel", "ns/op", "rueidislock", subj)),
			ru >= 1.25*f, known(f, ru))
	}

	r.issue29Targets(row)
	r.fairTargets(row)

	f, rl := v("Uncontended", subject, "allocs/op"), v("Uncontended", "redislock", "allocs/op")
	row("Uncontended allocs/op ≤ redislock's", fmt.Sprintf("%s vs %s", num(f), num(rl)), f <= rl, known(f, rl))

	f, ru := v("Contended", subject, "cs/s"), v("Contended", "rueidislock", "cs/s")
	row("Contended cs/s ≥ 1.2 × rueidislock's",
		fmt.Sprintf("%s vs %s: %.2f×", num(f), num(ru), f/ru), f >= 1.2*ru, known(f, ru))

	f = v("Contended", subject, "handoff-p50-ms")
	var parts []string
	ok, ks := true, known(f)
	for _, peer := range peers {
		p := v("Contended", peer, "handoff-p50-ms")
		ks = ks && known(p)
		ok = ok && f < p
		parts = append(parts, fmt.Sprintf("%s %s", peer, num(p)))
	}
	row("Contended handoff-p50 < every peer's",
		fmt.Sprintf("%s ms vs %s", num(f), strings.Join(parts, ", ")), ok, ks)

	worst := r.worstOverlaps("Contended")
	for _, g := range []string{"ContendedHandoff", "ContendedHandoff64"} {
		if o := r.worstOverlaps(g); math.IsNaN(worst) || o > worst {
			worst = o
		}
	}
	row("Contended* overlaps = 0", num(worst), worst == 0, known(worst))

	f, lowest := r.fairness("Contended", subject)
	row("Contended fairness ≥ 0.98", fmt.Sprintf("%s (lowest run %s)", num(f), num(lowest)), f >= 0.98, known(f))
}

// issue29Targets are issue 29's uncontended and parallel targets: the
// Interleaved p50 of fencelock (default options) at most 1.5 × raw's and
// 1.05 × rueidislock's, at most 32 allocations an acquire+release, and
// Parallel throughput (the reciprocal of ns/op) over the AutoPipeliner
// at least 0.75 × rueidislock's and redislock's, and at least 0.6 ×
// rueidislock's on a plain client.
func (r *results) issue29Targets(row targetRow) {
	v := r.value
	for _, c := range []struct {
		other string
		max   float64
	}{{baseline, 1.5}, {"rueidislock", 1.05}} {
		f, o := v("Interleaved", subject, "p50-ns/op"), v("Interleaved", c.other, "p50-ns/op")
		row(fmt.Sprintf("29: Interleaved p50 ≤ %.2f × %s (%s)", c.max, c.other, subject),
			fmt.Sprintf("%s vs %s: %.2f×%s", num(f), num(o), f/o, r.paired("Interleaved", "p50-ns/op", subject, c.other)),
			f <= c.max*o, known(f, o))
	}
	f := v("Uncontended", subject, "allocs/op")
	row(fmt.Sprintf("29: Uncontended allocs/op ≤ 32 (%s)", subject), num(f), f <= 32, known(f))
	for _, c := range []struct {
		subj, other string
		min         float64
	}{{subjectAP, "rueidislock", 0.75}, {subjectAP, "redislock", 1}, {subject, "rueidislock", 0.6}} {
		f, o := v("Parallel", c.subj, "ns/op"), v("Parallel", c.other, "ns/op")
		row(fmt.Sprintf("29: Parallel throughput ≥ %.2f × %s's (%s)", c.min, c.other, c.subj),
			fmt.Sprintf("%s vs %s ns/op: %.2f×%s", num(f), num(o), o/f, r.paired("Parallel", "ns/op", c.other, c.subj)),
			o >= c.min*f, known(f, o))
	}
}

// fairTargets are issue 16's targets for fair waiting in Contended (8
// waiters): subjectFair's hand-off p50 at most 0.6 × rueidislock's and
// below the 1 ms poller's (baseline1ms), and its fairness at least 0.99.
func (r *results) fairTargets(row targetRow) {
	const g, unit = "Contended", "handoff-p50-ms"
	f := r.value(g, subjectFair, unit)
	for _, c := range []struct {
		other, target string
		ok            func(f, o float64) bool
	}{
		{"rueidislock", "≤ 0.6 × rueidislock's", func(f, o float64) bool { return f <= 0.6*o }},
		{baseline1ms, "< raw-1ms's", func(f, o float64) bool { return f < o }},
	} {
		o := r.value(g, c.other, unit)
		row(fmt.Sprintf("16: Contended handoff-p50 %s (%s)", c.target, subjectFair),
			fmt.Sprintf("%s ms vs %s ms: %s%s", num(f), num(o), times(f, o), r.paired(g, unit, subjectFair, c.other)),
			c.ok(f, o), known(f, o))
	}
	fair, lowest := r.fairness(g, subjectFair)
	row(fmt.Sprintf("16: Contended fairness ≥ 0.99 (%s)", subjectFair),
		fmt.Sprintf("%s (lowest run %s)", num(fair), num(lowest)), fair >= 0.99, known(fair))
}

// times formats a ÷ b as a ratio, or "–" when either was not measured.
func times(a, b float64) string {
	if !known(a, b) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// fairness returns the median and the lowest run of impl's fairness in
// group (NaN when not measured).
func (r *results) fairness(group, impl string) (med, lowest float64) {
	fs := r.runs[group][impl]["fairness"]
	if len(fs) == 0 {
		return math.NaN(), math.NaN()
	}
	return median(fs), slices.Min(fs)
}

// redlockPeer is the implementation the Redlock targets compare with.
const redlockPeer = "redsync"

// redlockTargets are the targets of fencelock.NewRedlock against redsync,
// both over the same independent servers (issue 11): the uncontended cost
// of the fence's extra parallel round trip bounded, and push-based waiting
// paying off under contention. bench.sh runs the Redlock benchmarks in
// rounds, each implementation once per round, so the ratios of the runs
// paired in order are also shown: they say whether the verdict holds in
// every round.
func (r *results) redlockTargets(row targetRow) {
	ratioRow := func(target, group, unit string, ok func(ratio float64) bool) {
		f, rs := r.value(group, subject, unit), r.value(group, redlockPeer, unit)
		u := ""
		if strings.HasSuffix(unit, "-ms") {
			u = " ms"
		}
		measured := fmt.Sprintf("%s%s vs %s%s: %.2f×", num(f), u, num(rs), u, f/rs)
		if lo, hi, n := pairedRatios(r.runs[group][subject][unit], r.runs[group][redlockPeer][unit]); n > 1 {
			measured += fmt.Sprintf(" (runs paired in order: %.2f–%.2f×)", lo, hi)
		}
		row(target, measured, ok(f/rs), known(f, rs))
	}
	ratioRow("RedlockUncontended ns/op ≤ 1.6 × redsync's", "RedlockUncontended", "ns/op",
		func(x float64) bool { return x <= 1.6 })
	// The contended targets, for RedlockContended and, when measured (older
	// results have none), RedlockContendedProcs: the same with every waiter
	// a process of its own.
	for _, g := range []string{"RedlockContended", "RedlockContendedProcs"} {
		if g != "RedlockContended" && len(r.runs[g]) == 0 {
			continue
		}
		ratioRow(g+" cs/s ≥ 2 × redsync's", g, "cs/s", func(x float64) bool { return x >= 2 })
		ratioRow(g+" handoff-p50 < redsync's", g, "handoff-p50-ms", func(x float64) bool { return x < 1 })
		worst := r.worstOverlaps(g)
		row(g+" overlaps = 0", num(worst), worst == 0, known(worst))
	}
}

// paired returns, when a and b have as many runs of unit in group (rounds),
// the range of the ratios a ÷ b of the runs paired in order, for a
// measured figure; "" otherwise.
func (r *results) paired(group, unit, a, b string) string {
	lo, hi, n := pairedRatios(r.runs[group][a][unit], r.runs[group][b][unit])
	if n < 2 {
		return ""
	}
	return fmt.Sprintf(" (runs paired in order: %.2f–%.2f×)", lo, hi)
}

// pairedRatios returns the smallest and largest a[i]/b[i], and how many
// pairs there are (0 when a and b differ in length).
func pairedRatios(a, b []float64) (lo, hi float64, n int) {
	if len(a) != len(b) {
		return 0, 0, 0
	}
	for i := range a {
		x := a[i] / b[i]
		if i == 0 || x < lo {
			lo = x
		}
		if i == 0 || x > hi {
			hi = x
		}
	}
	return lo, hi, len(a)
}

// replaceSection replaces the text between the markers of section in the
// file with text.
func replaceSection(name, section, text string) error {
	tag := "bench-table"
	if section != "" {
		tag += ":" + section
	}
	beginMarker, endMarker := "<!-- "+tag+":begin -->", "<!-- "+tag+":end -->"
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	doc := string(data)
	i := strings.Index(doc, beginMarker)
	j := strings.Index(doc, endMarker)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s ... %s section", name, beginMarker, endMarker)
	}
	doc = doc[:i+len(beginMarker)] + "\n\n" + text + doc[j:]
	return os.WriteFile(name, []byte(doc), 0o644)
}
