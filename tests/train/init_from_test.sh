#!/usr/bin/env bash
# zero-train --init-from: a run trained and consolidated (zero-ckpt
# consolidate) is the start of a new run, on 2 ranks at stage 3 (each rank
# fills its partition from the file): after one step at lr 0 (the warm-up's
# first) its checkpoint consolidates to the same bytes, tensor for tensor.
# A file of another model's shape, a file that is not safetensors, a missing
# one, and --init-from with --resume are refused, naming the problem.
# usage: init_from_test.sh MPIRUN ZERO_TRAIN ZERO_CKPT CORPUS WORK
set -u
mpirun=$1 train=$2 ckpt=$3 corpus=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/../support/expect.sh"  # fail, expect_fail
model=(--model gpt2-tiny --eval-every 0)
printf '{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.1}}, "zero_optimization": {"stage": 2}}' \
  >"$work/s2.json"
printf '{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Lion", "params": {"lr": 0.001, "weight_decay": 0.1}}, "zero_optimization": {"stage": 3}}' \
  >"$work/s3_lion.json"

ZERO_COMM_BACKEND=single "$train" "$corpus" "${model[@]}" --config "$work/s2.json" --steps 4 --save-every 4 \
  --save-dir "$work/ck" --out "$work/out1" >"$work/first.log" 2>&1 || { cat "$work/first.log"; fail "the first run"; }
"$ckpt" consolidate "$work/ck" --out "$work/w.safetensors" >"$work/cons1.log" 2>&1 || { cat "$work/cons1.log"; fail "consolidate"; }

# Another optimizer (Lion; AdamW's checkpoint would be refused) on 2 ranks at stage 3.
timeout 300 $mpirun -np 2 "$train" "$corpus" "${model[@]}" --config "$work/s3_lion.json" --steps 1 --save-every 1 \
  --save-dir "$work/ck2" --out "$work/out2" --init-from "$work/w.safetensors" >"$work/second.log" 2>&1 \
  || { cat "$work/second.log"; fail "the run from the weights"; }
grep -q "^init: the weights of $work/w.safetensors (28 parameters, 120576 elements; consolidated from checkpoint step-4); the optimizer, the schedule and the step start fresh" \
  "$work/second.log" || { cat "$work/second.log"; fail "the run did not say where its weights came from"; }
grep -q "^step 1/1 .* lr 0.000e+00 " "$work/second.log" || { cat "$work/second.log"; fail "step 1 did not run at lr 0"; }
"$ckpt" consolidate "$work/ck2" --out "$work/w2.safetensors" >"$work/cons2.log" 2>&1 || { cat "$work/cons2.log"; fail "consolidate 2"; }
python3 - "$work/w.safetensors" "$work/w2.safetensors" <<'PY' || fail "the weights did not carry over"
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
differ = [k for k in a if a[k] != b.get(k)]
if len(a) != 28 or set(a) != set(b) or differ:
    sys.exit("FAIL: %d tensors, %d after; differ: %s" % (len(a), len(b), differ[:5]))
PY

# What is refused.
export ZERO_COMM_BACKEND=single
expect_fail "$work/shape.log" "--init-from .*w.safetensors does not fit this model \(16 parameters\): .*'h1.ln1.weight' is no parameter of this model" \
  "$train" "$corpus" "${model[@]}" --n-layer 1 --steps 1 --out "$work/out3" --init-from "$work/w.safetensors"
expect_fail "$work/width.log" "'wte.weight' is \[256, 64\] there, \[256, 32\] here" \
  "$train" "$corpus" "${model[@]}" --n-embd 32 --steps 1 --out "$work/out3" --init-from "$work/w.safetensors"
grep -q "^step " "$work/width.log" && fail "a file of another shape was found only after training"
printf 'not a safetensors file' >"$work/text.safetensors"
expect_fail "$work/text.log" "--init-from: .*text.safetensors is not a safetensors file" \
  "$train" "$corpus" "${model[@]}" --steps 1 --out "$work/out3" --init-from "$work/text.safetensors"
expect_fail "$work/none.log" "--init-from: cannot open .*nothing.safetensors: No such file" \
  "$train" "$corpus" "${model[@]}" --steps 1 --out "$work/out3" --init-from "$work/nothing.safetensors"
"$train" "$corpus" "${model[@]}" --steps 6 --save-dir "$work/ck" --resume latest --init-from "$work/w.safetensors" \
  >"$work/both.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "give one of them" "$work/both.log" || { cat "$work/both.log"; fail "--init-from with --resume: exit $rc"; }
echo "--init-from: the weights carried over bitwise (Lion, stage 3, 2 ranks); wrong files refused"
