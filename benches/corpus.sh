# The corpus programs the GPU scripts run, and the iterations each gets
# (sourced by gpu-corpus.sh and tracking-overhead.sh).
# shellcheck shell=bash
corpus_programs=(pingpong subbuffers images localmem maps copies events programs frameloop multictx floatmath)
declare -A corpus_iters=([pingpong]=30000 [subbuffers]=6000 [images]=20000 [localmem]=6000 [maps]=6000
    [copies]=6000 [events]=4000 [programs]=2000 [frameloop]=3000 [multictx]=4000 [floatmath]=3000)

# same_output NATIVE CRANE: whether a run under crane printed what the native run
# printed. Lines are equal, except that `FLOAT <name> <bound> <sum>` lines
# (testapps/c/floatmath.c) of runs on different devices may differ by
# 2 * bound * 2^-23 relative. Prints "identical" or "within tolerance".
same_output() {
    if cmp -s "$1" "$2"; then
        echo identical
        return 0
    fi
    awk 'FNR == NR { a[FNR] = $0; n = FNR; next }
        { m = FNR
          if (a[FNR] == $0) next
          split(a[FNR], x, " ")
          if ($1 != "FLOAT" || x[1] != "FLOAT" || x[2] != $2 || x[3] != $3) exit 1
          d = x[4] - $4; if (d < 0) d = -d
          big = x[4] > $4 ? x[4] : $4
          if (d > 2 * $3 * 2 ^ -23 * big) exit 1 }
        END { if (m != n) exit 1 }' "$1" "$2" || return 1
    echo "within tolerance"
}
