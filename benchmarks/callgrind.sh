#!/usr/bin/env bash
# callgrind.sh counts the instructions redis-server runs per acquire+release
# of each implementation: a redis-server under valgrind --tool=callgrind,
# cmd/cgloop running N cycles against it, and callgrind_annotate's totals of
# the dump taken around them. Instruction counts do not move with the load
# of a shared VM, as times do.
#
#   ./callgrind.sh                      fencelock, raw and redislock
#   ./callgrind.sh fencelock fencelock-ap fencelock-split
#                                       fencelock-ap: over client.AutoPipeline();
#                                       fencelock-split: N acquisitions, then
#                                       their N releases, counted apart
#   REV=f5ed2cb ./callgrind.sh          the library at a git revision (as bench.sh)
#   N=5000 ./callgrind.sh               cycles measured (default 2000)
#
# It prints, per implementation, the server's instructions per cycle: in
# all, in the EVALSHA/EVAL commands (the scripts, their calls included), and
# in the scripts' calls alone.
set -euo pipefail
cd "$(dirname "$0")"
n=${N:-2000}
rev=${REV:-}
impls=("$@")
[ ${#impls[@]} -gt 0 ] || impls=(fencelock raw redislock)
for tool in valgrind callgrind_annotate callgrind_control redis-server redis-cli; do
	command -v "$tool" >/dev/null || { echo "callgrind.sh: $tool not on PATH" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
modfile=()
library="$(git -C .. log -1 --format='%h %s') (work tree)"
if [ -n "$rev" ]; then
	mkdir "$tmp/lib" "$tmp/mod"
	git -C .. archive "$rev" | tar -x -C "$tmp/lib"
	sed "s#=> \.\./\$#=> $tmp/lib#" go.mod >"$tmp/mod/go.mod"
	cp go.sum "$tmp/mod/go.sum"
	modfile=(-modfile="$tmp/mod/go.mod")
	library="$(git -C .. log -1 --format='%h %s' "$rev")"
fi
go build "${modfile[@]}" -o "$tmp/cgloop" ./cmd/cgloop
echo "library: $library; $n cycles each"
ir() { # ir FILE [FUNCTION]: the total, or FUNCTION's inclusive count
	# awk reads to the end: exiting early would fail callgrind_annotate on
	# SIGPIPE, and the script with it (pipefail).
	if [ -z "${2:-}" ]; then
		callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ && !n++ {gsub(",", "", $1); print $1}'
	else
		callgrind_annotate --inclusive=yes "$1" 2>/dev/null | awk -v f=":$2 " 'index($0, f) && !n++ {gsub(",", "", $1); print $1}'
	fi
}
for impl in "${impls[@]}"; do
	args=(-impl fencelock)
	case $impl in
	fencelock-ap) args+=(-ap) ;;
	fencelock-split) args+=(-split) ;;
	*) args=(-impl "$impl") ;;
	esac
	dir=$(mktemp -d "$tmp/run.XXXX")
	port=$((20000 + RANDOM % 20000))
	valgrind --tool=callgrind --callgrind-out-file="$dir/cg.%p" redis-server --port "$port" --save '' --appendonly no \
		--dir "$dir" >"$dir/valgrind.log" 2>&1 &
	vpid=$!
	for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
	"$tmp/cgloop" -addr "127.0.0.1:$port" -pid "$vpid" -n "$n" "${args[@]}" 2>&1 | { grep -v "^sending command" || true; }
	kill "$vpid"
	wait "$vpid" 2>/dev/null || true
	part=0
	for f in $(ls "$dir"/cg.$vpid.* | sort -t. -k3 -n); do
		part=$((part + 1))
		what=$impl
		[ "$impl" != fencelock-split ] || { [ $part = 1 ] && what="fencelock acquire" || what="fencelock release"; }
		total=$(ir "$f") scripts=$(ir "$f" evalGenericCommand) calls=$(ir "$f" scriptCall)
		printf '%-18s %8d Ir a cycle; scripts %8d, their calls %7d\n' "$what" $((total / n)) $((${scripts:-0} / n)) $((${calls:-0} / n))
	done
done
