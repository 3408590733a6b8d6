#!/usr/bin/env bash
# One job per --save-dir (and per --out): while a 2-rank run saves to a
# folder, a second run given the same folder is refused before it trains, naming the first job's
# pid and what to do, and the first run's checkpoints are untouched; once the
# first is killed (kill -9: its lock file stays), the folder is free again.
# usage: save_dir_lock_test.sh MPIRUN ZERO_TRAIN CORPUS WORK
set -u
mpirun=$1 train=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; kill -9 "${first:-0}" 2>/dev/null; exit 1; }
model=(--model gpt2-tiny --n-layer 1 --n-embd 32 --n-head 2 --block-size 32 --eval-every 0)

# The first job: long enough to be running while the second starts.
$mpirun -np 2 "$train" "$corpus" "${model[@]}" --steps 100000 --save-every 5 --save-dir "$work/ck" \
  --out "$work/out1" >"$work/first.log" 2>&1 &
first=$!
for _ in $(seq 1 600); do
  [ -s "$work/ck/latest" ] && grep -q "^pid [0-9]* on " "$work/ck/.lock" 2>/dev/null && break
  sleep 0.1
done
[ -s "$work/ck/latest" ] || { cat "$work/first.log"; fail "the first job saved nothing in 60 s"; }
holder=$(sed "s/ on .*//" "$work/ck/.lock")

"$train" "$corpus" "${model[@]}" --steps 4 --save-every 2 --seed 99 --save-dir "$work/ck" --out "$work/out2" \
  >"$work/second.log" 2>&1; rc=$?
[ $rc -eq 1 ] || { cat "$work/second.log"; fail "the second job on one --save-dir: exit $rc, expected 1"; }
grep -q "zero-train: error: --save-dir $work/ck is in use by another running job ($holder on .*Give this job another --save-dir" \
  "$work/second.log" || { cat "$work/second.log"; fail "the refusal does not name the first job ($holder)"; }
grep -q "^step " "$work/second.log" && fail "the second job trained before it was refused"
[ -e "$work/out2/metrics.jsonl" ] && fail "the second job wrote metrics"
kill -0 $first 2>/dev/null || { cat "$work/first.log"; fail "the first job did not outlive the second's refusal"; }
# ... and one per --out: a second run given the first's --out (its own --save-dir) is refused before it
# writes there; the first run's metrics go on, one line per step.
"$train" "$corpus" "${model[@]}" --steps 4 --seed 99 --out "$work/out1" >"$work/second_out.log" 2>&1; rc=$?
[ $rc -eq 1 ] || { cat "$work/second_out.log"; fail "the second job on one --out: exit $rc, expected 1"; }
grep -q "zero-train: error: --out $work/out1 is in use by another running job ($holder on .*mix their metrics.jsonl.*Give this job another --out" \
  "$work/second_out.log" || { cat "$work/second_out.log"; fail "the --out refusal does not name the first job ($holder)"; }
[ "$(grep -cE '"step":1[,}]' "$work/out1/metrics.jsonl")" = 1 ] \
  || fail "the refused second job wrote into the first job's metrics.jsonl"

# The first job dies hard: its lock file stays, and locks nothing.
pkill -9 -P $first 2>/dev/null
kill -9 $first 2>/dev/null
wait $first 2>/dev/null
[ -e "$work/ck/.lock" ] || fail "the lock file went with the killed job (it should stay, unlocked)"
"$train" "$corpus" "${model[@]}" --steps 4 --save-every 2 --save-dir "$work/ck2" --out "$work/out3" >"$work/third.log" 2>&1 \
  || { cat "$work/third.log"; fail "a fresh folder"; }
"$train" "$corpus" "${model[@]}" --steps 4 --save-every 2 --save-dir "$work/ck" --keep-last 1 --out "$work/out4" \
  >"$work/fourth.log" 2>&1 || { cat "$work/fourth.log"; fail "the killed job's folder stayed locked"; }
echo "save-dir lock: ok (second job refused naming $holder; free again after kill -9)"
