#!/usr/bin/env bash
# bench.sh runs the benchmarks the way README.md reports them.
#
#   ./bench.sh               the library in .. (work tree), both suites:
#                            writes results/latest.txt and
#                            results/redlock-latest.txt, refreshes the
#                            tables between the bench-table markers of
#                            README.md (bench-table and bench-table:redlock)
#                            and writes the charts README.md opens with,
#                            results/latest.svg and results/redlock-latest.svg
#   SUITE=single ./bench.sh  only the single-deployment suite (Uncontended,
#                            Parallel, Contended, ContendedHandoff,
#                            ContendedHandoff64 on one redis-server):
#                            results/latest.txt, the bench-table section,
#                            results/latest.svg
#   SUITE=redlock ./bench.sh only the Redlock suite (RedlockUncontended,
#                            RedlockContended, RedlockContendedProcs on 5
#                            redis-servers):
#                            results/redlock-latest.txt, the
#                            bench-table:redlock section,
#                            results/redlock-latest.svg
#   REV=cc2d0ba ./bench.sh   the library at a git revision (exported with git
#                            archive into a temporary directory; the repository
#                            is not touched): writes results/REV.txt (and
#                            results/redlock-REV.txt) and prints the tables; a
#                            revision without NewRedlock gets the single suite
#                            only (built with -tags noredlock)
#   COUNT=3 ./bench.sh       rounds: runs per benchmark (default 5)
#
# Uncontended, Interleaved and Parallel run pinned to one CPU with taskset:
# on a small VM the wake-ups between the client's CPU and redis-server's add
# jitter (tens of microseconds per round trip, varying from minute to
# minute) that swamps the differences between implementations; pinned, ns/op
# measures the CPU work of client, server and kernel. The Contended
# benchmarks run on all CPUs, because their waiters and the server must run
# at the same time.
#
# Both suites run COUNT rounds, each with one run of every benchmark,
# instead of COUNT runs of one benchmark in a row: the implementations
# compared run seconds apart in every round, so a change in the machine's
# load (another job on a shared VM) moves all of them, and the results file
# records the load average at the start of every round. The single suite
# takes about 10.5 minutes on 2 CPUs (8 implementations in Uncontended,
# Interleaved and Parallel; 10 in the 3 contended benchmarks, which drop
# fencelock-ap and add fencelock-fair, fencelock-rueidis-fair and raw-1ms,
# of 3.25 s each per implementation and round).
#
# The Redlock suite's rounds are one run of RedlockUncontended (pinned like
# Uncontended; the 5 servers inherit the pinning), one of RedlockContended
# and one of RedlockContendedProcs (its waiters are processes). It takes
# about two minutes.
set -euo pipefail
cd "$(dirname "$0")"

count=${COUNT:-5}
rev=${REV:-}
suite=${SUITE:-all}
case $suite in
all | single | redlock) ;;
*)
	echo "bench.sh: SUITE is all, single or redlock, not $suite" >&2
	exit 2
	;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

modfile=()
tags=()
if [ -n "$rev" ]; then
	mkdir "$tmp/lib" "$tmp/mod"
	git -C .. archive "$rev" | tar -x -C "$tmp/lib"
	sed "s#=> \.\./\$#=> $tmp/lib#" go.mod >"$tmp/mod/go.mod"
	cp go.sum "$tmp/mod/go.sum"
	modfile=(-modfile="$tmp/mod/go.mod")
	library="$(git -C .. log -1 --format='%h %s' "$rev")"
	out=results/$rev.txt
	redlockOut=results/redlock-$rev.txt
	if ! grep -q '^func NewRedlock(' "$tmp/lib"/*.go; then
		tags=(-tags noredlock)
		case $suite in
		redlock)
			echo "bench.sh: $rev has no NewRedlock" >&2
			exit 2
			;;
		all)
			echo "bench.sh: $rev has no NewRedlock: single suite only" >&2
			suite=single
			;;
		esac
	fi
else
	library="$(git -C .. log -1 --format='%h %s')"
	if [ -n "$(git -C .. status --porcelain -- . ':(exclude)benchmarks')" ]; then
		library+=" (plus uncommitted changes)"
	fi
	out=results/latest.txt
	redlockOut=results/redlock-latest.txt
fi

pin=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
	pin=(taskset -c 1)
fi

go test "${modfile[@]}" "${tags[@]}" -c -o "$tmp/bench.test" .
mkdir -p results
bench=("$tmp/bench.test" -test.run '^$' -test.benchmem)

# table prints the tables of a results file, or with the name of a README
# section ("" for the single suite's) refreshes that section and writes the
# chart README.md opens with beside the results file (results/NAME.svg).
table() {
	if [ -n "$rev" ]; then
		go run ./cmd/table "$1"
	elif [ -n "$2" ]; then
		go run ./cmd/table -update README.md -section "$2" -svg "${1%.txt}.svg" "$1"
	else
		go run ./cmd/table -update README.md -svg "${1%.txt}.svg" "$1"
	fi
}

if [ "$suite" != redlock ]; then
	uncontended='^Benchmark(Uncontended|Interleaved|Parallel)$'
	contended='^BenchmarkContended(Handoff|Handoff64)?$'
	{
		echo "library: $library"
		echo "command: $count rounds of: ${pin[*]} go test -run '^\$' -bench '$uncontended' -benchmem -count 1; go test -run '^\$' -bench '$contended' -benchmem -count 1"
		for ((i = 1; i <= count; i++)); do
			echo "load: round $i: $(cat /proc/loadavg)"
			"${pin[@]}" "${bench[@]}" -test.bench "$uncontended" -test.count 1
			"${bench[@]}" -test.bench "$contended" -test.count 1
		done
		echo "load: after: $(cat /proc/loadavg)"
	} | tee "$out"
	table "$out" ""
fi

if [ "$suite" != single ]; then
	uncontended='^BenchmarkRedlockUncontended$'
	contended='^BenchmarkRedlockContended(Procs)?$'
	{
		echo "library: $library"
		echo "load: before: $(cat /proc/loadavg)"
		echo "command: $count rounds of: ${pin[*]} go test -run '^\$' -bench '$uncontended' -benchmem -count 1; go test -run '^\$' -bench '$contended' -benchmem -count 1"
		for ((i = 1; i <= count; i++)); do
			"${pin[@]}" "${bench[@]}" -test.bench "$uncontended" -test.count 1
			"${bench[@]}" -test.bench "$contended" -test.count 1
		done
		echo "load: after: $(cat /proc/loadavg)"
	} | tee "$redlockOut"
	table "$redlockOut" redlock
fi
