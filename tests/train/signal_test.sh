#!/usr/bin/env bash
# zero-train and a scheduler's signals (apps/zero-train/stop_signals.h):
# SIGUSR1 saves a checkpoint and training goes on; SIGUSR2 (forwarded by
# mpirun) and SIGTERM stop the run after the step in progress with a
# checkpoint, a report and exit status 75, also when the signal reaches one
# rank only; the run resumed from that checkpoint has the losses of a run
# that was never stopped; a stop at the very end (the report being written)
# still saves the last step; SIGHUP stops as SIGTERM does (unless ignored
# by nohup); a second SIGINT ends the process at once.
# usage: signal_test.sh ZERO_TRAIN ZERO_CKPT MPIEXEC CORPUS WORK
set -u
train=$1 ckpt=$2 mpiexec=$3 corpus=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
# fp32 (bitwise resume on any CPU), ZeRO-2 + CPU offload.
cat >"$work/fp32.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
JSON
steps=400
args=("$corpus" --model gpt2-tiny --config "$work/fp32.json" --eval-every 0 --steps $steps)
lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
# The children of process $1, from /proc (no procps needed).
children() {
  local stat
  for stat in /proc/[0-9]*/stat; do
    awk -v p="$1" '{ if ($4 == p) print $1 }' "$stat" 2>/dev/null
  done
}
wait_lines() {  # FILE N: until FILE has N lines (at most 120 s)
  for _ in $(seq 1200); do [ "$(lines "$1")" -ge "$2" ] && return 0; sleep 0.1; done
  fail "$1 did not reach $2 lines"
}
wait_grep() {  # FILE PATTERN: until FILE has a line matching PATTERN (at most 120 s)
  for _ in $(seq 1200); do grep -qE "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "$1 has no line matching '$2'"
}
# The loss is printed with %.17g by nlohmann::json: compare the text.
losses() { sed -E 's/.*"loss":([^,]*),.*"step":([0-9]+).*/\2 \1/' "$1" | sort -n; }

# 1. Two ranks under mpirun: SIGUSR1, then SIGUSR2, both to mpirun.
out=$work/stopped
# (No `timeout` in front of a job that is sent signals: it would take them;
# ctest's TIMEOUT bounds the test.)
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "${args[@]}" --out "$out" \
  --save-dir "$work/ck" --report "$work/stopped.json" >"$work/stopped.log" 2>&1 &
job=$!
wait_lines "$out/metrics.jsonl" 20
kill -USR1 $job
# SIGUSR1's save seen before SIGUSR2 is sent: on a loaded machine mpirun
# may forward both within one step, and the stop's save then serves both.
wait_grep "$work/stopped.log" 'saving to .* \(asked for by SIGUSR1\)'
k1=$(lines "$out/metrics.jsonl")
wait_lines "$out/metrics.jsonl" $((k1 + 5))
kill -USR2 $job
wait $job; rc=$?
[ $rc = 75 ] || { tail -20 "$work/stopped.log"; fail "the run stopped by SIGUSR2 exited $rc, not 75"; }
usr1=$(sed -nE 's/^checkpoint (step-[0-9]+): saving to .* \(asked for by SIGUSR1\).*/\1/p' "$work/stopped.log")
[ -n "$usr1" ] || { cat "$work/stopped.log"; fail "SIGUSR1 saved no checkpoint"; }
[ -d "$work/ck/$usr1" ] || fail "the checkpoint SIGUSR1 asked for ($usr1) is not in the folder"
k=$(lines "$out/metrics.jsonl")
[ "step-$k" != "$usr1" ] || fail "training did not go on after SIGUSR1's save"
[ "$(cat "$work/ck/latest")" = "step-$k" ] || fail "latest is '$(cat "$work/ck/latest")', not step-$k, the step the run stopped after"
grep -q "zero-train: stopped by SIGUSR2 at step $k of $steps: resume with --save-dir $work/ck --resume latest (exit status 75)" \
  "$work/stopped.log" || { tail "$work/stopped.log"; fail "no line saying where the run stopped and how to resume"; }
grep -q '"stopped_by_signal": "SIGUSR2"' "$work/stopped.json" || fail "the report does not name the signal"
grep -q "\"last_step\": $k" "$work/stopped.json" || fail "the report does not name the last step $k"
"$ckpt" inspect --verify "$work/ck" >"$work/inspect.log" 2>&1 || { cat "$work/inspect.log"; fail "the stop's checkpoint does not verify"; }

# 2. Resumed to the end (into the same --out), the losses are those of a run
# never stopped, and metrics.jsonl holds every step once, in order.
timeout 300 "$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "${args[@]}" --out "$out" \
  --save-dir "$work/ck" --resume latest >"$work/resumed.log" 2>&1 || { tail "$work/resumed.log"; fail "resume failed"; }
[ "$(losses "$out/metrics.jsonl" | awk '{print $1}' | tr '\n' ' ')" = "$(seq -s ' ' 1 $steps) " ] \
  || fail "metrics.jsonl after the resume does not hold steps 1..$steps once each"
[ "$(wc -l <"$out/loss.dat")" = $steps ] || fail "loss.dat after the resume does not hold $steps steps"
timeout 300 "$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "${args[@]}" --out "$work/whole" \
  >"$work/whole.log" 2>&1 || { tail "$work/whole.log"; fail "the uninterrupted run failed"; }
losses "$work/whole/metrics.jsonl" | awk -v k=$k '$1 > k' >"$work/whole.txt"
losses "$out/metrics.jsonl" | awk -v k=$k '$1 > k' >"$work/resumed.txt"
[ "$(wc -l <"$work/resumed.txt")" = $((steps - k)) ] || fail "the resumed run trained $(wc -l <"$work/resumed.txt") steps, not $((steps - k))"
diff -q "$work/whole.txt" "$work/resumed.txt" >/dev/null \
  || { diff "$work/whole.txt" "$work/resumed.txt" | head; fail "stopped + resumed losses differ from the uninterrupted run's"; }
echo "SIGUSR1 saved $usr1 and training went on; SIGUSR2 stopped at step $k with a checkpoint; resumed bitwise"

# 3. SIGTERM to rank 1 alone: both ranks stop after the same step, and save.
out=$work/one
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "${args[@]}" --out "$out" \
  --save-dir "$work/ck_one" >"$work/one.log" 2>&1 &
job=$!
wait_lines "$out/metrics.jsonl" 20
rank1=""
for p in $(children $job); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$p
done
[ -n "$rank1" ] || fail "rank 1's process not found among mpirun's children"
kill -TERM "$rank1"
wait $job; rc=$?
[ $rc = 75 ] || { tail -20 "$work/one.log"; fail "the run whose rank 1 got SIGTERM exited $rc, not 75"; }
k=$(lines "$out/metrics.jsonl")
[ "$(cat "$work/ck_one/latest")" = "step-$k" ] || fail "SIGTERM to rank 1: latest is not step-$k"
"$ckpt" inspect --verify "$work/ck_one" >"$work/inspect_one.log" 2>&1 \
  || { cat "$work/inspect_one.log"; fail "SIGTERM to rank 1: the checkpoint does not verify"; }
echo "SIGTERM to rank 1 alone: both ranks stopped after step $k and saved it"

# 4. A signal during the final evaluation, after the last step's all-reduce:
# the last step is saved, the evaluation abandoned, the sample skipped, and
# the run, complete, exits 0.
out=$work/late
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" \
  --steps 20 --eval-every 1000 --eval-batches 3000 --sample 40 --out "$out" --save-dir "$work/ck_late" \
  --report "$work/late.json" >"$work/late.log" 2>&1 &
job=$!
wait_lines "$out/metrics.jsonl" 19
sleep 1  # (step 20 takes milliseconds, the final evaluation of 3000 batches seconds)
kill -USR2 $job
wait $job; rc=$?
[ $rc = 0 ] || { tail -20 "$work/late.log"; fail "a stop during the final evaluation exited $rc, not 0 (training was complete)"; }
# (The final evaluation is abandoned, as any evaluation a stop signal comes in.)
grep -q "zero-train: SIGUSR2 after the last step: training is complete; the final evaluation and the sample are skipped" \
  "$work/late.log" || { tail -20 "$work/late.log"; fail "no line saying the run was complete and the rest skipped"; }
grep -q -- "---- sample" "$work/late.log" && fail "the sample ran after the stop signal"
[ "$(cat "$work/ck_late/latest")" = "step-20" ] || fail "the last step was not saved after a late stop signal"
grep -q '"stopped_by_signal": "SIGUSR2"' "$work/late.json" || fail "the report does not name the late signal"
echo "a stop during the final evaluation: step-20 saved, sample skipped, exit 0"

# 4b. A stop after everything the run does at its end but the sample (here:
# while the report is written, into a pipe that nobody reads yet), without
# --save-every or a sample: still the last step is saved, and the exit is 0.
out=$work/end
mkfifo "$work/end.json.partial"
ZERO_COMM_BACKEND=single "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" --steps 20 --eval-every 0 \
  --sample 0 --out "$out" --save-dir "$work/ck_end" --report "$work/end.json" >"$work/end.log" 2>&1 &
job=$!
wait_grep "$work/end.log" "^metrics: "
sleep 0.5  # (blocked opening the pipe)
kill -TERM $job
cat "$work/end.json.partial" >/dev/null
wait $job; rc=$?
[ $rc = 0 ] || { tail -20 "$work/end.log"; fail "a stop while the report was written exited $rc, not 0 (training was complete)"; }
grep -q "checkpoint step-20: saving to .* (asked for by SIGTERM)" "$work/end.log" \
  || { tail -20 "$work/end.log"; fail "a stop after the end's agreement did not save the last step"; }
[ "$(cat "$work/ck_end/latest")" = "step-20" ] || fail "a stop at the end left no step-20 checkpoint"
echo "a stop while the report was written: step-20 saved, exit 0"
# ... and on 2 ranks, the signal sent to mpirun (forwarded to both: rank 1,
# which writes no report, is in the last agreement already and counts it
# after it): one stop, saved once, and no rank killed by the late copy.
out=$work/end2
mkfifo "$work/end2.json.partial"
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" \
  --steps 20 --eval-every 0 --sample 0 --out "$out" --save-dir "$work/ck_end2" --report "$work/end2.json" \
  >"$work/end2.log" 2>&1 &
job=$!
wait_grep "$work/end2.log" "^metrics: "
sleep 1  # (rank 0 blocked opening the pipe, rank 1 waiting for it in the agreement)
kill -USR2 $job
sleep 1
cat "$work/end2.json.partial" >/dev/null
wait $job; rc=$?
[ $rc = 0 ] || { tail -20 "$work/end2.log"; fail "2 ranks, a stop while the report was written: exit $rc, not 0"; }
[ "$(cat "$work/ck_end2/latest")" = "step-20" ] || fail "2 ranks: a stop at the end left no step-20 checkpoint"
grep -q "exited on signal" "$work/end2.log" && { tail -20 "$work/end2.log"; fail "a rank was killed by the late copy of the stop"; }
echo "2 ranks, a stop while the report was written: step-20 saved, exit 0"

# 5. A signal during an evaluation in the middle of the run stops the run at
# that step, not after the next one.
out=$work/mid
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" \
  --steps 20 --eval-every 10 --eval-batches 3000 --out "$out" --save-dir "$work/ck_mid" >"$work/mid.log" 2>&1 &
job=$!
wait_lines "$out/metrics.jsonl" 9
sleep 1  # (step 10 takes milliseconds, its evaluation of 3000 batches seconds)
kill -TERM "$(children $job | head -1)"
wait $job; rc=$?
[ $rc = 75 ] || { tail -20 "$work/mid.log"; fail "a stop during an evaluation exited $rc, not 75"; }
[ "$(lines "$out/metrics.jsonl")" = 10 ] || fail "a stop during step 10's evaluation trained on to step $(lines "$out/metrics.jsonl")"
[ "$(cat "$work/ck_mid/latest")" = "step-10" ] || fail "a stop during step 10's evaluation did not save step-10"
# ... at once: the rest of the evaluation is abandoned (no validation loss
# for step 10), not waited for (a scheduler's grace period is short).
grep -q "zero-train: SIGTERM during the evaluation after step 10: the evaluation is abandoned" "$work/mid.log" \
  || { tail -20 "$work/mid.log"; fail "a stop during an evaluation did not abandon it"; }
grep -q '"val_loss"' "$out/metrics.jsonl" && fail "the abandoned evaluation still recorded a validation loss"
echo "a stop during an evaluation: abandoned, stopped and saved at that step"

# 6. One process: SIGTERM without --save-dir says nothing is saved; a second
# SIGINT after the first ends the process at once.
# (An evaluation every 300 steps: the stop comes before the first.)
ZERO_COMM_BACKEND=single "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" --eval-every 300 \
  --steps $steps --out "$work/nosave" >"$work/nosave.log" 2>&1 &
job=$!
wait_lines "$work/nosave/metrics.jsonl" 5
kill -TERM $job
wait $job; rc=$?
[ $rc = 75 ] || fail "SIGTERM without --save-dir: exit $rc, not 75"
grep -q "nothing is saved" "$work/nosave.log" || fail "SIGTERM without --save-dir does not say that nothing is saved"
# The end says why there is no validation loss: the stop, not --eval-every 0.
grep -q "no validation loss: no evaluation ran (stopped by SIGTERM before the first, at step 300)" "$work/nosave.log" \
  || { tail -5 "$work/nosave.log"; fail "the end does not say the stop came before the first evaluation"; }
# SIGHUP (a closed terminal) stops with a checkpoint like SIGTERM; started
# with it ignored (nohup), it is left ignored and the run goes on to its end.
ZERO_COMM_BACKEND=single "$train" "${args[@]}" --out "$work/hup" --save-dir "$work/ck_hup" >"$work/hup.log" 2>&1 &
job=$!
wait_lines "$work/hup/metrics.jsonl" 5
kill -HUP $job
wait $job; rc=$?
[ $rc = 75 ] || { tail -5 "$work/hup.log"; fail "SIGHUP: exit $rc, not 75"; }
k=$(lines "$work/hup/metrics.jsonl")
[ "$(cat "$work/ck_hup/latest")" = "step-$k" ] || fail "SIGHUP did not save step-$k"
( trap '' HUP; exec env ZERO_COMM_BACKEND=single "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" \
  --eval-every 0 --steps 30 --sample 0 --out "$work/nohup" ) >"$work/nohup.log" 2>&1 &
job=$!
wait_lines "$work/nohup/metrics.jsonl" 5
kill -HUP $job
wait $job; rc=$?
[ $rc = 0 ] && [ "$(lines "$work/nohup/metrics.jsonl")" = 30 ] \
  || { tail -5 "$work/nohup.log"; fail "SIGHUP under nohup: exit $rc after $(lines "$work/nohup/metrics.jsonl") steps"; }
echo "SIGHUP stopped at step $k with a checkpoint; under nohup it was ignored"
# A background job of a script inherits SIGINT ignored (the shell's rule
# for `&` without job control): it stays ignored, at every moment (a Ctrl-C
# meant for the foreground is not for it), as under nohup for SIGHUP.
ZERO_COMM_BACKEND=single "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" \
  --eval-every 0 --steps 30 --sample 0 --out "$work/bgint" >"$work/bgint.log" 2>&1 &
job=$!
wait_lines "$work/bgint/metrics.jsonl" 5
kill -INT $job
wait $job; rc=$?
[ $rc = 0 ] && [ "$(lines "$work/bgint/metrics.jsonl")" = 30 ] \
  || { tail -5 "$work/bgint.log"; fail "SIGINT inherited ignored: exit $rc after $(lines "$work/bgint/metrics.jsonl") steps"; }
echo "SIGINT inherited ignored (a script's background job): ignored throughout"
# (Here SIGINT back to its default for the job: env --default-signal.)
env --default-signal=INT ZERO_COMM_BACKEND=single "$train" "${args[@]}" --out "$work/twice" >"$work/twice.log" 2>&1 &
job=$!
wait_lines "$work/twice/metrics.jsonl" 5
# (Two signals sent at once can merge into one: SIGINT every 5 ms, slept
# without a fork on a fifo, until the process is gone.)
mkfifo "$work/tick" && exec 3<>"$work/tick"
while kill -INT $job 2>/dev/null; do read -r -t 0.005 -u 3; done
exec 3>&-
wait $job; rc=$?
[ $rc = 130 ] || { tail -5 "$work/twice.log"; fail "two SIGINTs: exit $rc, not 130 (killed by SIGINT)"; }
echo "one process: SIGTERM without --save-dir stopped with exit 75; a second SIGINT killed at once"
rm -rf "$work"
