#!/usr/bin/env bash
# The remoting benchmark (benches/remoting.c) in alternating rounds: natively,
# then under crane on crane-proxy over loopback TCP, ROUNDS times, so that a
# machine's drift over minutes hits both alike. Prints each round's frame rate
# and blocking round trip, then the means and the remote/native ratio (issue 3's
# goal: >= 60% of native frames/s, round trip < 30 us).
#
#   benches/remote-rounds.sh DIR [ROUNDS] [SECS]
#
# DIR holds libcrane_opencl.so, crane-proxy and remoting (gcc -O2
# benches/remoting.c -lOpenCL), built on a machine with the same or an older
# glibc. The vendor is the ICD loader's: point OCL_ICD_VENDORS at one .icd
# file (e.g. one naming libnvidia-opencl.so.1) to pick one. SECS is each section's length (default 1).
set -euo pipefail
dir=$(cd "${1:?usage: remote-rounds.sh DIR [ROUNDS] [SECS]}" && pwd)
rounds=${2:-6}
secs=${3:-1}
work=$(mktemp -d)
echo "bench bench" > "$work/tokens"
port=$((20000 + RANDOM % 20000))
"$dir/crane-proxy" --listen "tcp://127.0.0.1:$port" --token-file "$work/tokens" \
    > "$work/proxy.log" 2>&1 &
proxy=$!
trap 'kill $proxy 2> /dev/null; wait $proxy 2> /dev/null; rm -rf "$work"' EXIT
for _ in $(seq 200); do
    (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null && break
    sleep 0.05
done
figure() { sed -n "s/^BENCH $1 \([0-9.]*\).*/\1/p" "$2"; }
calc() { awk "BEGIN { printf \"%.1f\", $1 }"; }
native_sum=0
remote_sum=0
for r in $(seq "$rounds"); do
    "$dir/remoting" "$secs" > "$work/native"
    CRANE_RUN_DIR=$work/run CRANE_MODE=remote CRANE_PROXY=tcp://127.0.0.1:$port \
        CRANE_PROXY_TOKEN=bench LD_PRELOAD=$dir/libcrane_opencl.so \
        "$dir/remoting" "$secs" > "$work/remote"
    n=$(figure frame_rate "$work/native")
    m=$(figure frame_rate "$work/remote")
    printf 'round %d: native %s frames/s, remote %s (%s%%), remote round trip %s us, native %s us\n' \
        "$r" "$n" "$m" "$(calc "100 * $m / $n")" \
        "$(figure rtt_finish "$work/remote")" "$(figure rtt_finish "$work/native")"
    native_sum=$(calc "$native_sum + $n")
    remote_sum=$(calc "$remote_sum + $m")
done
printf 'device: %s\n' "$(sed -n 's/^DEVICE //p' "$work/native")"
printf 'means over %d rounds: native %s frames/s, remote %s: %s%% of native\n' \
    "$rounds" "$(calc "$native_sum / $rounds")" "$(calc "$remote_sum / $rounds")" \
    "$(calc "100 * $remote_sum / $native_sum")"
