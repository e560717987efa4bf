# The corpus programs the GPU scripts run, and the iterations each gets
# (sourced by gpu-corpus.sh and tracking-overhead.sh).
# shellcheck shell=bash
corpus_programs=(pingpong subbuffers images localmem maps copies events programs frameloop multictx)
declare -A corpus_iters=([pingpong]=30000 [subbuffers]=6000 [images]=20000 [localmem]=6000 [maps]=6000
    [copies]=6000 [events]=4000 [programs]=2000 [frameloop]=3000 [multictx]=4000)
