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

# Test binaries run several at a time (cargo xtask test) and each builds the
# corpus: one build at a time, a program rebuilt only when its source or a
# header is newer, and replaced by a rename, so that a program another test is
# running is never rewritten under it.
exec 9>"$out/.build.lock"
flock 9

# A different compiler or flags rebuild everything.
stamp="$CC $CFLAGS"
rebuild=${CRANE_TESTAPPS_REBUILD:-}
if [ "$(cat "$out/.flags" 2>/dev/null)" != "$stamp" ]; then
    rebuild=1
fi

list=()
for src in "$here"/c/*.c; do
    name=$(basename "$src" .c)
    list+=("$name")
    newest=$(ls -t "$src" "$here"/c/*.h "$0" 2>/dev/null | head -n1)
    if [ -x "$out/$name" ] && [ "$out/$name" -nt "$newest" ] && [ -z "$rebuild" ]; then
        continue
    fi
    echo "build.sh: cc $name"
    $CC -std=c11 $CFLAGS -Wall -Wextra -Werror -o "$out/.$name.new" "$src" -lOpenCL -lm
    mv -f "$out/.$name.new" "$out/$name"
done
printf '%s\n' "$stamp" > "$out/.flags"

if [ "${CRANE_TESTAPPS_SKIP_RUST:-0}" != 1 ]; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/../target/testapps-rust}
    echo "build.sh: cargo build rust (target dir $CARGO_TARGET_DIR)"
    cargo build --release --locked --manifest-path "$here/rust/Cargo.toml"
    for bin in rustpipe; do
        cp "$CARGO_TARGET_DIR/release/$bin" "$out/.$bin.new"
        mv -f "$out/.$bin.new" "$out/$bin"
        list+=("$bin")
    done
else
    echo "build.sh: skipping the Rust program (CRANE_TESTAPPS_SKIP_RUST=1)"
fi

printf '%s\n' "${list[@]}" > "$out/.programs.list.new"
mv -f "$out/.programs.list.new" "$out/programs.list"
echo "build.sh: built ${#list[@]} programs into $out"
