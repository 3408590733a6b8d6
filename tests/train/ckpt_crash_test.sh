#!/usr/bin/env bash
# kill -9 of one rank during a save (mid-file, or after its file is complete
# and before the commit) leaves `latest` naming the earlier checkpoint, which
# verifies and resumes. Then a resumed run on the same folder saves again.
# Last, a damaged file fails the resume with one error line.
# usage: ckpt_crash_test.sh ZERO_TRAIN ZERO_CKPT MPIEXEC CORPUS WORK
set -u
train=$1 ckpt=$2 mpiexec=$3 corpus=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
run() { timeout 200 "$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "$corpus" --model gpt2-tiny \
          --eval-every 0 --out "$work/out" "$@"; }
fail() { echo "FAIL: $*"; exit 1; }
for when in 3000 end; do
  d="$work/ck_$when"
  # The second file rank 1 writes (the save of step 4) dies.
  ZERO_CKPT_TEST_KILL="2:rank-00001:$when" run --steps 6 --save-every 2 --save-dir "$d" >"$work/crash_$when.log" 2>&1 \
    && fail "the run whose rank 1 was killed during a save exited 0"
  [ "$(cat "$d/latest")" = "step-2" ] || fail "kill at $when: latest is '$(cat "$d/latest" 2>/dev/null)', not step-2"
  [ -d "$d/step-4" ] && fail "kill at $when: step-4 exists although its save was killed"
  "$ckpt" inspect --verify "$d" >"$work/inspect_$when.log" 2>&1 || { cat "$work/inspect_$when.log"; fail "kill at $when: latest does not verify"; }
  run --steps 4 --save-every 2 --save-dir "$d" --resume latest >"$work/resume_$when.log" 2>&1 \
    || { tail -5 "$work/resume_$when.log"; fail "kill at $when: resume from latest failed"; }
  grep -q "resuming at step 2 of 4" "$work/resume_$when.log" || fail "kill at $when: the resumed run did not start at step 2"
  [ "$(cat "$d/latest")" = "step-4" ] || fail "kill at $when: the resumed run's save did not become latest"
  [ -d "$d/step-4.partial" ] && fail "kill at $when: the killed save's .partial folder was not cleaned up by the next save"
  echo "kill -9 at $when: latest stayed step-2, verified, resumed, saved step-4"
done

# A damaged file of rank 1: the resume fails on both ranks, and the job
# shows the error once, from rank 1 (rank 0's "failed on rank 1" is not
# printed again).
d="$work/ck_end"
f="$d/step-4/rank-00001-of-00002.bin"
printf 'XXXX' | dd of="$f" bs=1 seek=3000 conv=notrunc 2>/dev/null
run --steps 6 --save-dir "$d" --resume latest >"$work/damaged.log" 2>&1 && fail "a resume from a damaged file exited 0"
[ "$(grep -c "zero-train: error on rank" "$work/damaged.log")" = 1 ] \
  || { cat "$work/damaged.log"; fail "the damaged file's error was not printed once"; }
grep -q "zero-train: error on rank 1 of 2: checkpoint file .*rank-00001-of-00002.bin is damaged" "$work/damaged.log" \
  || { cat "$work/damaged.log"; fail "the error is not rank 1's, naming the damaged file"; }
echo "a damaged file of rank 1: one error line, from rank 1"
rm -rf "$work"
