#!/usr/bin/env bash
# bench.sh runs the benchmarks the way README.md reports them.
#
#   ./bench.sh               the library in .. (work tree): writes
#                            results/latest.txt and refreshes the tables
#                            between the bench-table markers of README.md
#   REV=cc2d0ba ./bench.sh   the library at a git revision (exported with git
#                            archive into a temporary directory; the repository
#                            is not touched): writes results/REV.txt and prints
#                            the tables
#   COUNT=3 ./bench.sh       runs per benchmark (default 5)
#
# Uncontended and Parallel run pinned to one CPU with taskset: on a small VM
# the wake-ups between the client's CPU and redis-server's add jitter (tens of
# microseconds per round trip, varying from minute to minute) that swamps the
# differences between implementations; pinned, runs repeat within a few
# percent and ns/op measures the CPU work of client, server and kernel.
# Contended runs on all CPUs, because its waiters and the server must run at
# the same time. The whole script takes about 2.5 minutes on 2 CPUs.
set -euo pipefail
cd "$(dirname "$0")"

count=${COUNT:-5}
rev=${REV:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

modfile=()
if [ -n "$rev" ]; then
	mkdir "$tmp/lib" "$tmp/mod"
	git -C .. archive "$rev" | tar -x -C "$tmp/lib"
	sed "s#=> \.\./\$#=> $tmp/lib#" go.mod >"$tmp/mod/go.mod"
	cp go.sum "$tmp/mod/go.sum"
	modfile=(-modfile="$tmp/mod/go.mod")
	library="$(git -C .. log -1 --format='%h %s' "$rev")"
	out=results/$rev.txt
else
	library="$(git -C .. log -1 --format='%h %s')"
	if [ -n "$(git -C .. status --porcelain -- . ':(exclude)benchmarks')" ]; then
		library+=" (plus uncommitted changes)"
	fi
	out=results/latest.txt
fi

pin=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
	pin=(taskset -c 1)
fi

go test "${modfile[@]}" -c -o "$tmp/bench.test" .
mkdir -p results
{
	echo "library: $library"
	echo "command: ${pin[*]} go test -run '^\$' -bench 'Uncontended|Parallel' -benchmem -count $count"
	"${pin[@]}" "$tmp/bench.test" -test.run '^$' -test.bench 'Uncontended|Parallel' -test.benchmem -test.count "$count"
	echo "command: go test -run '^\$' -bench Contended -benchmem -count $count"
	"$tmp/bench.test" -test.run '^$' -test.bench Contended -test.benchmem -test.count "$count"
} | tee "$out"

if [ -n "$rev" ]; then
	go run ./cmd/table "$out"
else
	go run ./cmd/table -update README.md "$out"
fi
