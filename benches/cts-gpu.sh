#!/usr/bin/env bash
# The conformance suite (docs/conformance.md) on the accelerator machine,
# which has no Rust toolchain: `pack` here puts stripped release builds of
# xtask, libcrane_opencl.so and crane-proxy, the CTS's bin/ and an .icd for
# NVIDIA into DIR (about 14 MiB, to carry); `run` there runs
# `xtask conformance` against NVIDIA's OpenCL with them.
#
#   benches/cts-gpu.sh pack DIR
#   benches/cts-gpu.sh run DIR TAG [conformance arguments...]
#
# `run` writes DIR/../out-TAG.json and .txt, or $OUT/conf-TAG.json and .txt
# and $OUT/logs-TAG.tgz (the logs of every run that differed) where OUT is set.
set -euo pipefail
cmd=${1:?usage: cts-gpu.sh pack DIR | run DIR TAG [ARGS...]}
dir=${2:?usage: cts-gpu.sh pack DIR | run DIR TAG [ARGS...]}
root=$(cd "$(dirname "$0")/.." && pwd)
case $cmd in
pack)
    cts=${CRANE_CTS_DIR:-$root/../shared/conformance/opencl-cts}
    (cd "$root" && cargo build --release -p crane-opencl -p crane-proxy -p xtask)
    mkdir -p "$dir/cts"
    for f in libcrane_opencl.so crane-proxy xtask; do
        strip -o "$dir/$f" "$root/target/release/$f"
    done
    cp -r "$cts/bin" "$dir/cts/"
    echo libnvidia-opencl.so.1 > "$dir/nvidia.icd"
    du -sh "$dir"
    ;;
run)
    tag=${3:?usage: cts-gpu.sh run DIR TAG [ARGS...]}
    shift 3
    dir=$(cd "$dir" && pwd)
    out=${OUT:-$dir/..}
    export OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=$dir/nvidia.icd
    unset CRANE_VENDOR
    nvidia-smi -L || true
    rc=0
    timeout -k 5 "${LIMIT:-560}" "$dir/xtask" conformance --cts "$dir/cts" \
        --lib "$dir/libcrane_opencl.so" --proxy "$dir/crane-proxy" \
        --out "$out/conf-$tag.json" --logs "/tmp/logs-$tag" "$@" 2>&1 |
        grep -v '^ \+[0-9]*:\|^ \+at ' | tee "$out/conf-$tag.txt" || rc=$?
    tar czf "$out/logs-$tag.tgz" -C /tmp "logs-$tag" 2>/dev/null || true
    exit "$rc"
    ;;
*)
    echo "usage: cts-gpu.sh pack DIR | run DIR TAG [ARGS...]" >&2
    exit 2
    ;;
esac
