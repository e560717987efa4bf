#!/usr/bin/env bash
# Builds the crane OpenCL test corpus into OUT_DIR.
#   testapps/build.sh OUT_DIR
# C programs: gcc -std=c11 -O2 -Wall -Wextra -Werror, linked dynamically with
# -lOpenCL -lm (libOpenCL.so.1, the ICD loader).  The Rust program is a separate
# cargo package (not in the main workspace); CARGO_TARGET_DIR defaults to
# <repo>/target/testapps-rust.  Set CRANE_TESTAPPS_SKIP_RUST=1 to build only the
# C programs (e.g. on a machine without cargo).
# Writes OUT_DIR/programs.list with one program name per line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
CC=${CC:-gcc}
CFLAGS=${CFLAGS:--O2}

list=()
for src in "$here"/c/*.c; do
    name=$(basename "$src" .c)
    echo "build.sh: cc $name"
    $CC -std=c11 $CFLAGS -Wall -Wextra -Werror -o "$out/$name" "$src" -lOpenCL -lm
    list+=("$name")
done

if [ "${CRANE_TESTAPPS_SKIP_RUST:-0}" != 1 ]; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/../target/testapps-rust}
    echo "build.sh: cargo build rust (target dir $CARGO_TARGET_DIR)"
    cargo build --release --locked --manifest-path "$here/rust/Cargo.toml"
    for bin in rustpipe; do
        cp "$CARGO_TARGET_DIR/release/$bin" "$out/$bin"
        list+=("$bin")
    done
else
    echo "build.sh: skipping the Rust program (CRANE_TESTAPPS_SKIP_RUST=1)"
fi

printf '%s\n' "${list[@]}" > "$out/programs.list"
echo "build.sh: built ${#list[@]} programs into $out"
