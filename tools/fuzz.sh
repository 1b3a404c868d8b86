#!/usr/bin/env bash
# Runs every Go fuzz target of the repository (func FuzzXxx(f *testing.F)), one after the
# other, each for FUZZTIME. Targets are discovered with `go test -list '^Fuzz'`, so a new one
# is picked up without editing this script. Exits non-zero when any target fails (or a
# package does not build); the failing inputs are written by `go test` under the package's
# testdata/fuzz/<Target>/, where the next `go test` replays them.
#
#   tools/fuzz.sh                     every target of ./..., 3s each
#   FUZZTIME=1m tools/fuzz.sh ./model/...
#   FUZZRUN='Config|Index' tools/fuzz.sh   only the targets whose name matches
#
# With Go 1.26 a target may fail with a bare "context deadline exceeded" when -fuzztime
# runs out (go.dev/issue/75804, fixed in Go 1.27): such a failure, without a failing input,
# is reported as "ok*" and does not fail the run.
#
# Environment:
#   FUZZTIME          time (or NNNx executions) per target; default 3s
#   FUZZMINIMIZETIME  time spent minimizing each new input (go test -fuzzminimizetime);
#                     default 1s: Go's 60s default lets a slow target with large seeds
#                     (tokenizer.json) spend its whole FUZZTIME minimizing one input
#   FUZZPARALLEL      fuzz workers per target (go test -parallel); default GOMAXPROCS
#   FUZZRUN           regular expression (awk) the target names must match; default all
set -uo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-3s}
minimize=${FUZZMINIMIZETIME:-1s}
filter=${FUZZRUN:-.}
pkgs=("$@")
[[ ${#pkgs[@]} -gt 0 ]] || pkgs=(./...)

parallel=()
[[ -n ${FUZZPARALLEL:-} ]] && parallel=(-parallel "$FUZZPARALLEL")

# `go test -list` prints a package's matching names, then "ok <tab> package <tab> time".
if ! listing=$(go test -list '^Fuzz' "${pkgs[@]}" 2>&1); then
	echo "$listing"
	echo "fuzz.sh: listing the fuzz targets failed" >&2
	exit 1
fi
targets=$(awk -v re="$filter" '
	/^Fuzz/ { names[n++] = $1; next }
	/^ok[ \t]/ { for (i = 0; i < n; i++) if (names[i] ~ re) print $2, names[i]; n = 0; next }
	{ n = 0 }
' <<<"$listing")
if [[ -z $targets ]]; then
	echo "fuzz.sh: no fuzz targets found in ${pkgs[*]}" >&2
	exit 1
fi

# spurious_deadline reports a failure that is only Go's fuzz coordinator racing its own
# -fuzztime deadline (go.dev/issue/75804, fixed in Go 1.27): the target fails with a bare
# "context deadline exceeded" and no failing input. A count (FUZZTIME=10000x) avoids it.
spurious_deadline() {
	grep -qx '    context deadline exceeded' <<<"$1" && ! grep -q 'Failing input written' <<<"$1" &&
		[[ $(grep -c -e '^    --- FAIL' -e '^        ' <<<"$1") -eq 0 ]]
}

count=$(wc -l <<<"$targets")
echo "fuzz.sh: $count targets, $fuzztime each"
failed=()
start=$SECONDS
while read -r pkg name; do
	t0=$SECONDS
	log=$(go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "${parallel[@]}" "$pkg" </dev/null 2>&1)
	rc=$?
	execs=$(grep -o 'execs: [0-9]*' <<<"$log" | tail -1)
	if [[ $rc -eq 0 ]]; then
		printf 'ok    %-45s %-28s %3ds  %s\n' "$pkg" "$name" $((SECONDS - t0)) "$execs"
	elif spurious_deadline "$log"; then
		printf 'ok*   %-45s %-28s %3ds  %s (spurious "context deadline exceeded", go.dev/issue/75804)\n' "$pkg" "$name" $((SECONDS - t0)) "$execs"
	else
		printf 'FAIL  %-45s %-28s %3ds\n' "$pkg" "$name" $((SECONDS - t0))
		grep -v '^fuzz: elapsed' <<<"$log" | sed 's/^/    /'
		failed+=("$pkg $name")
	fi
done <<<"$targets"

echo "fuzz.sh: $count targets in $((SECONDS - start))s"
if [[ ${#failed[@]} -gt 0 ]]; then
	echo "fuzz.sh: ${#failed[@]} failed:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
