#!/usr/bin/env bash
# zero-train's validation loss depends on the weights, the corpus, the seed
# and the global batch alone: with the weights frozen (lr 1e-30), one rank
# with micro-batches of 4, two ranks with micro-batches of 2, and two ranks
# with micro-batches of 1 and 2 accumulation steps evaluate the same
# sequences and report the same validation loss (to fp32 rounding; the
# sample used to follow the ranks and the micro-batch size, and moved the
# loss by ~1%).
# usage: validation_ranks_test.sh MPIRUN ZERO_TRAIN CORPUS WORK
set -u
mpirun=$1 train=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/../support/expect.sh"  # fail
config() {  # micro accumulation ranks
  printf '{"train_batch_size": 4, "train_micro_batch_size_per_gpu": %s, "gradient_accumulation_steps": %s, "optimizer": {"type": "AdamW", "params": {"lr": 1e-30}}, "zero_optimization": {"stage": 2}}' \
    "$1" "$2" >"$work/c_$1_$2_$3.json"
}
run() {  # micro accumulation ranks
  config "$@"
  local out="$work/out_$1_$2_$3"
  timeout 300 $mpirun -np "$3" "$train" "$corpus" --model gpt2-tiny --config "$work/c_$1_$2_$3.json" --steps 1 \
    --warmup 0 --eval-every 1 --eval-batches 3 --out "$out" >"$out.log" 2>&1 || { cat "$out.log"; fail "run $*"; }
}
run 4 1 1
run 2 1 2
run 1 2 2
python3 - "$work"/out_4_1_1/metrics.jsonl "$work"/out_2_1_2/metrics.jsonl "$work"/out_1_2_2/metrics.jsonl <<'PY' || exit 1
import json, sys
vals = []
for path in sys.argv[1:]:
    rows = [json.loads(l) for l in open(path) if l.strip()]
    v = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    if len(v) != 1:
        sys.exit(f"FAIL: {path}: {len(v)} validation losses")
    vals.append(v[0])
if max(vals) - min(vals) > 1e-5 * abs(vals[0]):
    sys.exit(f"FAIL: the validation loss follows the ranks or the micro-batch: {vals}")
print(f"validation loss on 1 rank x 4, 2 ranks x 2, 2 ranks x 1 x 2 accumulation: {vals}")
PY
echo "validation: the same sequences on any number of ranks and micro-batch size"
