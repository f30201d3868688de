package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
)

var doctorCommand = &command{
	name:     "doctor",
	synopsis: "[flags]",
	list:     "",
	short:    "the deployment's settings, against the lock's guarantees",
	help: `Checks the deployment (Locker.Check: every master of a Cluster) for
settings that weaken the lock's guarantees, and says what each means and
how to fix it, most severe first: a maxmemory-policy that evicts lock keys,
persistence off, fewer replicas than --replicas, no sharded pub/sub, ACL
permissions the lock needs, the round trip against the TTL's drift
allowance. It takes and releases a test lock, "fencelock-check:<random>"
(on a Cluster one on each master, whose ACL is its own), and deletes its
keys.

It exits 1 when a finding is critical: the lock's guarantees do not hold
there, or it cannot be taken at all; and when the check did not finish
within --timeout, after printing the findings made until then.

Flags:

	--json             one JSON document: {"complete": false when the check
	                   did not finish, "critical", "warning", "info":
	                   counts, "findings": [{"severity", "check", "node",
	                   "seen", "means", "fix"}]}.
	--ttl D            the services' lock TTL, for the round-trip check
	                   (default 30s, the library's; the report then says
	                   so).
	--replicas N       the services' Options.Replicas, for the replicas
	                   check (default 0: not checked).
`,
}

func init() { doctorCommand.run = runDoctor }

// libraryTTL is fencelock's default Options.TTL, which doctor's Locker has
// without --ttl.
const libraryTTL = 30 * time.Second

type findingJSON struct {
	Severity string `json:"severity"`
	Check    string `json:"check"`
	Node     string `json:"node"`
	Seen     string `json:"seen"`
	Means    string `json:"means"`
	Fix      string `json:"fix"`
}

func runDoctor(ctx context.Context, e *env, args []string) error {
	var cf connFlags
	fs := newFlagSet("doctor", &cf)
	asJSON := fs.Bool("json", false, "")
	ttl := fs.Duration("ttl", 0, "")
	replicas := fs.Int("replicas", 0, "")
	pos, err := parse(e, doctorCommand, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("doctor: takes no arguments, got %q", pos)
	}
	s, err := cf.open(e, "doctor", &fencelock.Options{TTL: *ttl, Replicas: *replicas})
	if err != nil {
		return err
	}
	defer s.close()
	ctx, cancel := cf.withTimeout(ctx)
	defer cancel()
	findings, checkErr := s.locker.Check(ctx) // by ctx's end, with the findings made until then
	complete := checkErr == nil

	count := map[fencelock.Severity]int{}
	for _, f := range findings {
		count[f.Severity]++
	}
	if *asJSON {
		out := struct {
			Complete bool          `json:"complete"`
			Critical int           `json:"critical"`
			Warning  int           `json:"warning"`
			Info     int           `json:"info"`
			Findings []findingJSON `json:"findings"`
		}{complete, count[fencelock.SeverityCritical], count[fencelock.SeverityWarning], count[fencelock.SeverityInfo], make([]findingJSON, 0, len(findings))}
		for _, f := range findings {
			out.Findings = append(out.Findings, findingJSON{f.Severity.String(), f.Check, f.Node, f.Seen, f.Means, f.Fix})
		}
		if err := writeJSON(e.stdout, out); err != nil {
			return err
		}
	} else {
		var note string
		if *ttl == 0 && complete {
			// The round trip's finding names the TTL; say where it
			// came from, so that a pass at 30s is not taken for the
			// services' shorter TTL.
			note = fmt.Sprintf("round trip judged against TTL %v, the library's default: give the services' TTL with --ttl", libraryTTL)
		}
		printReport(e.stdout, findings, count, note, complete)
	}
	if checkErr != nil {
		return redisError("doctor", &cf, checkErr)
	}
	if count[fencelock.SeverityCritical] > 0 {
		return &cmdError{code: exitFailed}
	}
	return nil
}

// printReport prints the findings for people: a heading line per finding
// (severity, check, node), then what was seen, what it means and the fix,
// wrapped at 80 columns; then note, if any, and the counts, with a verdict
// only when the check is complete.
func printReport(w io.Writer, findings []fencelock.Finding, count map[fencelock.Severity]int, note string, complete bool) {
	const indent = "           "
	for _, f := range findings {
		head := fmt.Sprintf("%-9s %s", f.Severity, f.Check)
		if f.Node != "" {
			head += "  " + f.Node
		}
		fmt.Fprintln(w, head)
		for _, line := range [][2]string{{"seen", f.Seen}, {"means", f.Means}, {"fix", f.Fix}} {
			if line[1] != "" {
				fmt.Fprintf(w, "  %-8s %s\n", line[0], wrap(line[1], indent, 80-len(indent)))
			}
		}
		fmt.Fprintln(w)
	}
	var parts []string
	for _, sev := range []fencelock.Severity{fencelock.SeverityCritical, fencelock.SeverityWarning, fencelock.SeverityInfo} {
		parts = append(parts, fmt.Sprintf("%d %s", count[sev], sev))
	}
	verdict := "nothing weakens the lock's guarantees"
	switch {
	case !complete:
		verdict = "the check did not finish"
	case count[fencelock.SeverityCritical] > 0:
		verdict = "the lock's guarantees do not hold here"
	case count[fencelock.SeverityWarning] > 0:
		verdict = "the guarantees hold until a fault (see the warnings)"
	}
	if note != "" {
		fmt.Fprintln(w, note)
	}
	fmt.Fprintf(w, "%s: %s\n", strings.Join(parts, ", "), verdict)
}
