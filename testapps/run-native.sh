#!/usr/bin/env bash
# Runs every test program natively twice and checks that both runs exit 0,
# end with exactly one `RESULT <program> <16 hex>` line, and agree.
#   testapps/run-native.sh OUT_DIR [PROGRAM...]
# Extra arguments for every program may be given in $TESTAPP_ARGS
# (e.g. TESTAPP_ARGS="--iters 10").  Uses the OpenCL ICD loader as installed
# (OCL_ICD_VENDORS etc. from the environment); platform from
# $CRANE_TEST_PLATFORM (default 0).
set -uo pipefail
out=${1:?usage: run-native.sh OUT_DIR [PROGRAM...]}
shift
if [ $# -gt 0 ]; then
    progs=("$@")
else
    mapfile -t progs < "$out/programs.list"
fi
logdir=$(mktemp -d "${TMPDIR:-/tmp}/crane-testapps.XXXXXX")
pass=0
fail=0
skipped=0
# shellcheck disable=SC2086
run_one() { # prog run -> sets r_rc r_res r_time r_skip
    local p=$1 n=$2 t0 t1
    t0=$(date +%s.%N)
    "$out/$p" ${TESTAPP_ARGS:-} > "$logdir/$p.$n.out" 2> "$logdir/$p.$n.err"
    r_rc=$?
    t1=$(date +%s.%N)
    r_time=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
    r_res=$(tail -n 1 "$logdir/$p.$n.out")
    r_count=$(grep -c '^RESULT ' "$logdir/$p.$n.out")
    r_skip=$(grep "^SKIP $p " "$logdir/$p.$n.out" || true)
}
for p in "${progs[@]}"; do
    run_one "$p" 1; rc1=$r_rc res1=$r_res t1=$r_time c1=$r_count skip=$r_skip
    run_one "$p" 2; rc2=$r_rc res2=$r_res t2=$r_time c2=$r_count
    ok=1
    why=
    if [ "$rc1" != 0 ] || [ "$rc2" != 0 ]; then ok=0; why="exit codes $rc1 $rc2"; fi
    if [ $ok = 1 ] && { [ "$c1" != 1 ] || [ "$c2" != 1 ]; }; then ok=0; why="RESULT lines: $c1 $c2"; fi
    if [ $ok = 1 ] && ! [[ "$res1" =~ ^RESULT\ $p\ [0-9a-f]{16}$ ]]; then ok=0; why="last line is not a RESULT line: $res1"; fi
    if [ $ok = 1 ] && [ "$res1" != "$res2" ]; then ok=0; why="runs disagree: '$res1' vs '$res2'"; fi
    if [ $ok = 1 ]; then
        pass=$((pass + 1))
        printf 'PASS %-12s %s  (%ss, %ss)\n' "$p" "${res1##* }" "$t1" "$t2"
        [ -n "$skip" ] && { skipped=$((skipped + 1)); echo "     $skip"; }
        grep -h '^SKIP ' "$logdir/$p.1.out" | grep "^SKIP $p/" | sed 's/^/     /'
        grep -h -i 'callbacks\|frames/s' "$logdir/$p.1.out" "$logdir/$p.1.err" | sed 's/^/     /'
    else
        fail=$((fail + 1))
        printf 'FAIL %-12s %s\n' "$p" "$why"
        tail -n 5 "$logdir/$p.1.err" "$logdir/$p.2.err" | sed 's/^/     /'
    fi
done
echo "logs in $logdir"
echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" = 0 ]
