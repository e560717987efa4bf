#!/usr/bin/env bash
# What tracked passthrough costs whole programs (the paper's "tracking
# overhead": 5.25% mean, 12.5% on a video encoder): each corpus program's wall
# time natively and under crane (preloaded, no suspend), alternating, ROUNDS
# times; then benches/remoting.c's frame loop (a video encoder's pattern: per
# frame a 4 KiB upload, 8 small kernels, a 4 KiB blocking download) natively
# and under crane. Prints per program the median of each and the overhead of
# the medians, then the mean over the programs. Each run's output must equal
# the native run's, or the script fails.
#
#   benches/tracking-overhead.sh DIR [ROUNDS] [PROGRAM...]
#
# DIR holds libcrane_opencl.so, remoting (gcc -O2 benches/remoting.c -lOpenCL)
# and testapps/ (testapps/build.sh DIR/testapps). The vendor is the ICD
# loader's: point OCL_ICD_VENDORS at one .icd file to pick one.
set -euo pipefail
. "$(dirname "$0")/corpus.sh"
dir=$(cd "${1:?usage: tracking-overhead.sh DIR [ROUNDS] [PROGRAM...]}" && pwd)
rounds=${2:-5}
shift $(($# > 1 ? 2 : 1))
progs=("$@")
[ ${#progs[@]} -gt 0 ] ||
    progs=("${corpus_programs[@]}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CRANE_RUN_DIR=$work/run
now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
sum=0
count=0
for p in "${progs[@]}"; do
    n=${corpus_iters[$p]:-3000}
    : > "$work/native.times"
    : > "$work/crane.times"
    for _ in $(seq "$rounds"); do
        t=$(now)
        "$dir/testapps/$p" --iters "$n" > "$work/native.out" 2> /dev/null
        awk -v a="$(now)" -v b="$t" 'BEGIN { print a - b }' >> "$work/native.times"
        t=$(now)
        LD_PRELOAD=$dir/libcrane_opencl.so "$dir/testapps/$p" --iters "$n" \
            > "$work/crane.out" 2> /dev/null
        awk -v a="$(now)" -v b="$t" 'BEGIN { print a - b }' >> "$work/crane.times"
        cmp -s "$work/native.out" "$work/crane.out" || {
            echo "$p: output under crane differs from native" >&2
            exit 1
        }
    done
    nat=$(median < "$work/native.times")
    cra=$(median < "$work/crane.times")
    pct=$(awk -v a="$cra" -v b="$nat" 'BEGIN { printf "%.1f", 100 * (a - b) / b }')
    printf '%-11s --iters %-6s native %.3f s, crane %.3f s (medians of %d): %+.1f%%\n' \
        "$p" "$n" "$nat" "$cra" "$rounds" "$pct"
    sum=$(awk -v s="$sum" -v x="$pct" 'BEGIN { print s + x }')
    count=$((count + 1))
done
printf 'mean overhead over %d programs: %+.1f%%\n' "$count" \
    "$(awk -v s="$sum" -v c="$count" 'BEGIN { print s / c }')"
: > "$work/native.fr"
: > "$work/crane.fr"
for _ in $(seq "$rounds"); do
    "$dir/remoting" 1 | sed -n 's/^BENCH frame_rate \([0-9.]*\).*/\1/p' >> "$work/native.fr"
    LD_PRELOAD=$dir/libcrane_opencl.so "$dir/remoting" 1 |
        sed -n 's/^BENCH frame_rate \([0-9.]*\).*/\1/p' >> "$work/crane.fr"
done
nat=$(median < "$work/native.fr")
cra=$(median < "$work/crane.fr")
printf 'frame loop (video-encoder pattern): native %.0f frames/s, crane %.0f (medians of %d): %+.1f%% time per frame\n' \
    "$nat" "$cra" "$rounds" "$(awk -v a="$cra" -v b="$nat" 'BEGIN { printf "%.1f", 100 * (b / a - 1) }')"
