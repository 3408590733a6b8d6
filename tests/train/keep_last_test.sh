#!/usr/bin/env bash
# zero-train --keep-last N on 2 ranks: once a checkpoint is committed, the
# step-<K> tags older than the N newest are removed (rank 0, from the folder
# every rank saved into); other tags, and an earlier run's tags past this
# run's newest, are left; --keep-last without --save-dir is a usage error.
# usage: keep_last_test.sh MPIRUN ZERO_TRAIN CORPUS WORK
set -u
mpirun=$1 train=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
tags() { (cd "$work/ck" && ls -d */ 2>/dev/null | tr -d / | sort -V | tr '\n' ' '); }
model=(--model gpt2-tiny --n-layer 1 --n-embd 32 --n-head 2 --block-size 32 --eval-every 0)

timeout 200 $mpirun -np 2 "$train" "$corpus" "${model[@]}" --steps 10 --save-every 2 --keep-last 2 \
  --save-dir "$work/ck" --out "$work/out1" >"$work/run1.log" 2>&1 || { tail -5 "$work/run1.log"; fail "run 1 failed"; }
[ "$(tags)" = "step-8 step-10 " ] || fail "after run 1 (--keep-last 2): tags '$(tags)', not 'step-8 step-10'"
[ "$(cat "$work/ck/latest")" = step-10 ] || fail "latest is $(cat "$work/ck/latest"), not step-10"
grep -q "checkpoint step-10 saved in .*; removed step-6 (--keep-last 2)" "$work/run1.log" \
  || fail "the save line does not name what it removed"

# Another tag, and an earlier run's checkpoint past where the next run ends.
cp -r "$work/ck/step-8" "$work/ck/best"
cp -r "$work/ck/step-10" "$work/ck/step-40"
timeout 200 $mpirun -np 2 "$train" "$corpus" "${model[@]}" --steps 12 --save-every 2 --keep-last 1 \
  --save-dir "$work/ck" --resume step-8 --out "$work/out2" >"$work/run2.log" 2>&1 \
  || { tail -5 "$work/run2.log"; fail "run 2 failed"; }
[ "$(tags)" = "best step-12 step-40 " ] || fail "after run 2 (--keep-last 1): tags '$(tags)', not 'best step-12 step-40'"
[ "$(cat "$work/ck/latest")" = step-12 ] || fail "latest is $(cat "$work/ck/latest"), not step-12"

ZERO_COMM_BACKEND=single "$train" "$corpus" --keep-last 2 --steps 1 >"$work/usage.log" 2>&1; rc=$?
[ $rc = 2 ] || fail "--keep-last without --save-dir: exit $rc, not 2"
grep -q "zero-train: error: --keep-last needs --save-dir" "$work/usage.log" || fail "the usage error does not say --save-dir"
echo "keep-last: pruned as asked"
