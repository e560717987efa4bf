#!/bin/bash
# Fuzz the six crane-fuzz targets side by side under libFuzzer, then merge
# (minimise) each target's grown corpus (docs/reliability.md, "Fuzzing").
#
# Usage: run-many.sh SECONDS WORKERS, from a folder holding this script, the
# six targets (`cargo +nightly fuzz build -O`, then
# fuzz/target/x86_64-unknown-linux-gnu/release/TARGET, stripped if need be)
# and corpus.tgz (`tar czf corpus.tgz corpus` in fuzz/). Needs 6 x (WORKERS
# + 1) cores. Writes $OUT/merged.tgz (m/TARGET: the minimised corpora, to
# replace fuzz/corpus/TARGET), the logs and any crash under $OUT/art.
set -u
S=${1:-500}; W=${2:-5}
D=$(cd "$(dirname "$0")" && pwd)
T=/tmp/fz; rm -rf $T; mkdir -p $T && cd $T
tar xzf $D/corpus.tgz
nproc; lscpu | grep -m1 "Model name"
mkdir -p log art m
for t in config control source wire_answer wire_call xenstore; do
  mkdir -p art/$t
  before=$(ls corpus/$t | wc -l)
  echo "$t corpus before: $before" >> log/summary
  $D/$t corpus/$t -fork=$W -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
     -max_total_time=$S -timeout=10 -rss_limit_mb=2048 -artifact_prefix=art/$t/ \
     > log/$t.log 2>&1 &
done
wait
for t in config control source wire_answer wire_call xenstore; do
  mkdir -p m/$t
  $D/$t -merge=1 m/$t corpus/$t > log/$t.merge 2>&1
  echo "$t grown: $(ls corpus/$t | wc -l) merged: $(ls m/$t | wc -l) last: $(grep -a '^#' log/$t.log | tail -1)" >> log/summary
  echo "$t merge: $(grep -a 'MERGE-OUTER: [0-9]* new files' log/$t.merge | tail -1)" >> log/summary
done
cat log/summary
ls -R art | head -50
OUT=${OUT:-$D/out}; mkdir -p $OUT
tar czf $OUT/merged.tgz m
cp -r log art $OUT/
