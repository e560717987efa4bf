#!/usr/bin/env bash
# The test corpus on a real GPU: each program natively, then under crane
# (preloaded) with suspend/resume cycles at random moments. Its whole output must
# equal the native run's, and after every suspend the process must hold no GPU
# device descriptor or mapping, no mapping of the vendor's libraries and no
# thread of the vendor (crane's own count, `cranectl suspend`, checked against
# /proc here for descriptors and mappings).
#
#   benches/gpu-corpus.sh DIR [PROGRAM...]
#
# With MOVES="cpu gpu" (device specs) each cycle moves the program to the next
# device in turn instead (`cranectl local PID --device SPEC`, e.g. NVIDIA's GPU
# to PoCL's CPU device and back). The GPU's vendor library stays loaded while
# the process runs on the CPU (its platform is still offered; the line says how
# many device descriptors it holds there). floatmath's FLOAT lines
# may then differ within their bound (corpus.sh same_output). A program whose every
# move is refused passes if its output equals native's and the refusal says why
# (programs made from binaries cannot move to another device).
#
# DIR holds libcrane_opencl.so, cranectl and testapps/ (testapps/build.sh
# DIR/testapps). The vendor is the ICD loader's: point OCL_ICD_VENDORS at one .icd
# file (e.g. one naming libnvidia-opencl.so.1) to pick one. Prints one line per program and
# "N passed, N failed" last; exits non-zero if any program failed.
set -uo pipefail
. "$(dirname "$0")/corpus.sh"
dir=$(cd "${1:?usage: gpu-corpus.sh DIR [PROGRAM...]}" && pwd)
shift
progs=("$@")
[ ${#progs[@]} -gt 0 ] ||
    progs=("${corpus_programs[@]}")
work=$(mktemp -d)
export CRANE_RUN_DIR=$work/run
devices='/dev/(nvidia|dri/|kfd)'
vendor_libs='libcuda\.so|libnvidia-opencl|libnvidia-ptxjitcompiler|libamdocl|libigdrcl'
read -r -a moves <<< "${MOVES:-}"
passed=0
failed=0
for p in "${progs[@]}"; do
    n=${corpus_iters[$p]:-3000}
    if ! "$dir/testapps/$p" --iters "$n" > "$work/$p.native" 2> /dev/null; then
        echo "$p: the native run failed"
        failed=$((failed + 1))
        continue
    fi
    LD_PRELOAD=$dir/libcrane_opencl.so "$dir/testapps/$p" --iters "$n" \
        > "$work/$p.crane" 2> "$work/$p.err" &
    pid=$!
    sock=$CRANE_RUN_DIR/apps/$pid.sock
    while kill -0 "$pid" 2> /dev/null && [ ! -S "$sock" ]; do sleep 0.01; done
    cycles=0
    refused=
    refusals=0
    on_cpu=
    problems=()
    suspend_ms=()
    while kill -0 "$pid" 2> /dev/null; do
        sleep "0.$(printf %03d $((RANDOM % 250 + 30)))"
        if [ ${#moves[@]} -gt 0 ]; then
            spec=${moves[$((cycles % ${#moves[@]}))]}
            if ! out=$("$dir/cranectl" local "$pid" --device "$spec" 2>&1); then
                [ -z "$refused" ] && refused=$out
                refusals=$((refusals + 1))
                continue
            fi
            if [ "$spec" = cpu ] && [ -z "$on_cpu" ]; then
                on_cpu="$(ls -l "/proc/$pid/fd" 2> /dev/null | grep -cE "$devices") device fds"
            fi
            total=$(grep -oE 'local in [0-9.]+ ms' <<< "$out" | head -1)
            total=${total#local in }
            suspend_ms+=("$spec:${total% ms}")
            echo "$p move $((cycles + 1)) to $spec: $out" >> "${MOVES_LOG:-/dev/null}"
            cycles=$((cycles + 1))
            continue
        fi
        if ! out=$("$dir/cranectl" suspend "$pid" 2>&1); then
            # The program ended meanwhile, or was inside a long call.
            [ -z "$refused" ] && refused=$out
            continue
        fi
        fds=$(ls -l "/proc/$pid/fd" 2> /dev/null | grep -cE "$devices")
        maps=$(grep -cE "$devices|$vendor_libs" "/proc/$pid/maps" 2> /dev/null)
        left=$(grep -o 'device fds left [0-9]*, device mappings left [0-9]*, vendor threads left [0-9]*' <<< "$out")
        if [ "$fds" != 0 ] || [ "$maps" != 0 ] ||
            [ "$left" != "device fds left 0, device mappings left 0, vendor threads left 0" ]; then
            problems+=("after suspend $((cycles + 1)): /proc: $fds device fds, $maps device or vendor mappings; crane: ${left:-no residue line}")
        fi
        total=$(grep -oE 'suspended in [0-9.]+ ms' <<< "$out" | head -1)
        if [ -n "$total" ]; then
            total=${total#suspended in }
            suspend_ms+=("${total% ms}")
        fi
        if ! "$dir/cranectl" resume "$pid" > /dev/null 2>&1; then
            problems+=("resume $((cycles + 1)) failed")
            break
        fi
        cycles=$((cycles + 1))
    done
    wait "$pid"
    status=$?
    what="suspend/resume cycles (--iters $n; suspend ms"
    [ ${#moves[@]} -gt 0 ] && what="moves, $refusals refused (--iters $n; stoppage ms"
    if [ "$status" = 0 ] && same=$(same_output "$work/$p.native" "$work/$p.crane") && [ ${#problems[@]} = 0 ] &&
        { [ "$cycles" -gt 0 ] || { [ ${#moves[@]} -gt 0 ] && [ -n "$refused" ]; }; }; then
        echo "$p: $same to native after $cycles $what: ${suspend_ms[*]:-n/a})"
        [ "$cycles" = 0 ] && echo "    every move refused: $refused"
        [ -n "$on_cpu" ] && echo "    on the CPU it held $on_cpu"
        passed=$((passed + 1))
    else
        echo "$p: FAILED (status $status, $cycles cycles, --iters $n)"
        for x in "${problems[@]}"; do echo "    $x"; done
        cmp "$work/$p.native" "$work/$p.crane" | sed 's/^/    /'
        [ -n "$refused" ] && echo "    first refused suspend: $refused"
        tail -5 "$work/$p.err" | sed 's/^/    stderr: /'
        failed=$((failed + 1))
    fi
done
rm -rf "$work"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
