#!/usr/bin/env bash
# zero-estimate --config: a DeepSpeed-style config stands for the flags it
# sets: the estimate (--json) equals the one from the same settings given as
# flags; a flag given as well overrides the config; no precision key is
# fp32 (DeepSpeed's default); a config that does not fit --world is the
# config's error.
# usage: estimate_config_test.sh ZERO_ESTIMATE WORK
set -u
est=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
same() {  # same NAME CONFIG-JSON FLAGS...: --config's JSON equals the flags'
  local name=$1 json=$2
  shift 2
  printf '%s' "$json" >"$work/$name.json"
  "$est" --model gpt2-small-test --world 2 --json --config "$work/$name.json" >"$work/$name.cfg.out" 2>&1 \
    || { cat "$work/$name.cfg.out"; fail "$name: --config failed"; }
  "$est" --model gpt2-small-test --world 2 --json "$@" >"$work/$name.flags.out" 2>&1 \
    || { cat "$work/$name.flags.out"; fail "$name: the flags failed"; }
  [ "$(tail -1 "$work/$name.cfg.out")" = "$(tail -1 "$work/$name.flags.out")" ] \
    || { tail -1 "$work/$name.cfg.out"; tail -1 "$work/$name.flags.out"; fail "$name: --config and the flags differ"; }
  grep -q '^{"params"' "$work/$name.cfg.out" || fail "$name: no JSON line"
}
same offload_dpu '{"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": true}, "optimizer": {"type": "Adagrad", "params": {"lr": 0.01}},
  "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e6, "offload_optimizer": {"device": "cpu", "delayed_param_update": true}}}' \
  --stage 2 --offload --dpu --precision bf16 --optimizer Adagrad --micro 4 --bucket 2000000
same stage3_param '{"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true}, "activation_checkpointing": {"cpu_checkpointing": true},
  "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1000, "stage3_param_persistence_threshold": 10,
  "offload_optimizer": {"device": "cpu", "ratio": 0.5}, "offload_param": {"device": "cpu"}}}' \
  --stage 3 --offload --offload-ratio 0.5 --offload-param --precision fp16 --micro 2 --prefetch 1000 \
  --persistence-threshold 10 --cpu-checkpointing
same lion_offload '{"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}, "optimizer": {"type": "lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99]}},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}' \
  --stage 3 --offload --precision bf16 --optimizer Lion --micro 2
same fp32_default '{"train_batch_size": 8, "zero_optimization": {"stage": 1}}' --stage 1 --precision fp32 --micro 4
grep -q "^config .*fp32_default.json: stage 1, fp32, AdamW, micro-batch 4" "$work/fp32_default.cfg.out" \
  || { cat "$work/fp32_default.cfg.out"; fail "the config's line does not say what it set"; }
# A flag overrides the config.
"$est" --model gpt2-small-test --world 2 --config "$work/offload_dpu.json" --stage 3 >"$work/override.out" 2>&1 \
  || { cat "$work/override.out"; fail "--stage over a config failed"; }
grep -q "^stage 3 + offload " "$work/override.out" && ! grep -q "^stage 2" "$work/override.out" \
  || { cat "$work/override.out"; fail "--stage 3 did not override the config's stage 2"; }
# --stage below 3 over a stage-3 config: its stage-3 keys are left out (as
# the engine leaves them), not refused.
"$est" --model gpt2-small-test --world 2 --config "$work/stage3_param.json" --stage 2 >"$work/s3to2.out" 2>&1 \
  || { cat "$work/s3to2.out"; fail "--stage 2 over a stage-3 config with offload_param failed"; }
grep -q "^stage 2 + offload " "$work/s3to2.out" || { cat "$work/s3to2.out"; fail "--stage 2 did not give stage 2 + offload"; }
# --params with a config that checkpoints activations on the host: model states only.
"$est" --params 7B --world 2 --config "$work/stage3_param.json" >"$work/params.out" 2>&1 \
  || { cat "$work/params.out"; fail "--params with a config failed"; }
# The config is read for --world: a batch that does not divide is its error.
printf '{"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2}' >"$work/batch.json"
"$est" --model gpt2-small-test --world 2 --config "$work/batch.json" >"$work/batch.out" 2>&1 && fail "a batch 6 = 2 x 2 x k was taken"
grep -q "batch.json: batch sizes: " "$work/batch.out" || { cat "$work/batch.out"; fail "no batch-size error naming the config"; }
# A Hugging Face Trainer config ("auto" batch and schedule) is read as
# zero-train reads it: the batch from --micro (else 1), said so.
printf '{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
  "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"},
  "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": "auto"}}}' >"$work/hf.json"
"$est" --model gpt2-small-test --world 2 --config "$work/hf.json" --micro 4 >"$work/hf.out" 2>&1 \
  || { cat "$work/hf.out"; fail "a Hugging Face config with --micro failed"; }
grep -q '"auto" filled: train_micro_batch_size_per_gpu = 4 (--micro)' "$work/hf.out" && grep -q "^stage 3 " "$work/hf.out" \
  && ! grep -q "total_num_steps" "$work/hf.out" || { cat "$work/hf.out"; fail "the \"auto\" batch was not filled from --micro"; }
grep -q "the scheduler's \"auto\" values do not change the memory" "$work/hf.out" \
  || { cat "$work/hf.out"; fail "the scheduler's filled autos were not said"; }
# An "auto" total with a warm-up given: the stand-in total is no warning.
printf '{"train_batch_size": 32, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 1000}}}' \
  >"$work/sched_auto.json"
"$est" --params 1K --world 4 --config "$work/sched_auto.json" >"$work/sched_auto.out" 2>&1 \
  || { cat "$work/sched_auto.out"; fail "an \"auto\" total_num_steps failed"; }
grep -q "warning" "$work/sched_auto.out" && { cat "$work/sched_auto.out"; fail "the stand-in total_num_steps was warned about"; }
# ... but a key the user wrote is still warned about beside it.
printf '{"train_batch_size": 32, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_step": 100}}}' \
  >"$work/sched_typo.json"
"$est" --params 1K --world 4 --config "$work/sched_typo.json" >"$work/sched_typo.out" 2>&1 \
  || { cat "$work/sched_typo.out"; fail "a scheduler with a typo failed"; }
grep -q "unknown key 'scheduler.params.warmup_num_step' is ignored; did you mean 'warmup_num_steps'" "$work/sched_typo.out" \
  || { cat "$work/sched_typo.out"; fail "the typo beside a filled auto was not warned about"; }
"$est" --model gpt2-small-test --world 2 --config "$work/hf.json" >"$work/hf1.out" 2>&1 \
  || { cat "$work/hf1.out"; fail "a Hugging Face config without --micro failed"; }
grep -q "train_micro_batch_size_per_gpu = 16 (zero-train's default micro-batch)" "$work/hf1.out" \
  || { cat "$work/hf1.out"; fail "the \"auto\" batch without --micro was not zero-train's, 16"; }
grep -q "activations of micro-batch 16 x" "$work/hf1.out" || { cat "$work/hf1.out"; fail "the activations are not of micro-batch 16"; }
# gradient_accumulation_steps: on a GPU with offload the device keeps the
# window's fp32 gradient sum (4 bytes per element of the rank's partition),
# from the config as from --accumulation; on the CPU nothing changes.
field() { tail -1 "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"; }
printf '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' >"$work/accum.json"
"$est" --model gpt2-small-test --world 2 --gpu --json --config "$work/accum.json" >"$work/accum.cfg.out" 2>&1 \
  || { cat "$work/accum.cfg.out"; fail "a config with accumulation 4 failed"; }
grep -q "^config .*accum.json: .*micro-batch 2, accumulation 4," "$work/accum.cfg.out" \
  || { cat "$work/accum.cfg.out"; fail "the config's line does not say accumulation 4"; }
for a in 1 4; do
  "$est" --model gpt2-small-test --world 2 --gpu --json --stage 2 --offload --micro 2 --accumulation $a \
    >"$work/accum$a.out" 2>&1 || { cat "$work/accum$a.out"; fail "--accumulation $a failed"; }
  "$est" --model gpt2-small-test --world 2 --json --stage 2 --offload --micro 2 --accumulation $a \
    >"$work/accum$a.cpu.out" 2>&1 || { cat "$work/accum$a.cpu.out"; fail "--accumulation $a without --gpu failed"; }
done
[ "$(tail -1 "$work/accum.cfg.out")" = "$(tail -1 "$work/accum4.out")" ] \
  || { tail -1 "$work/accum.cfg.out" "$work/accum4.out"; fail "the config's accumulation 4 is not --accumulation 4"; }
grep -q "^(with gradient_accumulation_steps 4 on a GPU, dev states includes .* the window's fp32 gradient sum" \
  "$work/accum4.out" || { cat "$work/accum4.out"; fail "--accumulation 4 --gpu: no note on the device's fp32 sum"; }
! grep -q "gradient_accumulation_steps" "$work/accum1.out" "$work/accum4.cpu.out" \
  || fail "the note on the device's fp32 sum where there is none (accumulation 1, or the CPU)"
params=$(field "$work/accum1.out" params)
d1=$(field "$work/accum1.out" device_model_states) d4=$(field "$work/accum4.out" device_model_states)
h1=$(field "$work/accum1.out" host_model_states) h4=$(field "$work/accum4.out" host_model_states)
# (bf16: 2 bytes per parameter on the device; the fp32 sum of one of 2
# partitions, within one bucket's padding of half the model.)
[ "$d1" = $((2 * params)) ] || fail "device model states at accumulation 1: $d1, want 2 x $params"
sum=$((d4 - d1))
[ "$sum" -ge $((2 * params)) ] && [ "$sum" -le $((2 * params + 4 * 2 * 32 * 64)) ] \
  || fail "the device's fp32 sum at accumulation 4 is $sum B, want about 4 x $params / 2"
# The host gradients come down as the window's fp32 sum, not in bf16.
[ "$h4" -gt "$h1" ] || fail "host model states at accumulation 4 ($h4) not above accumulation 1's ($h1)"
[ "$(tail -1 "$work/accum1.cpu.out")" = "$(tail -1 "$work/accum4.cpu.out")" ] \
  || fail "--accumulation changed the estimate on the CPU, where the host sums in fp32 at any accumulation"
"$est" --model gpt2-small-test --accumulation 0 >"$work/accum0.out" 2>&1 && fail "--accumulation 0 was taken"
grep -q -- "--accumulation (gradient_accumulation_steps) must be at least 1, got 0" "$work/accum0.out" \
  || { cat "$work/accum0.out"; fail "--accumulation 0: no error naming it"; }
# Nothing fits: exit status 3 (not 2, a usage error), and the JSON still the last line.
"$est" --model gpt2-small-test --device-mem 1MB --json >"$work/nofit.out" 2>&1
rc=$?
[ "$rc" = 3 ] && grep -q "^nothing fits" "$work/nofit.out" && tail -1 "$work/nofit.out" | grep -q '^{"params"' \
  || { cat "$work/nofit.out"; fail "nothing fits: exit status $rc (want 3), or the JSON is not the last line"; }
# --host-mem counts each process's runtime (--runtime-mem, 512 MiB by
# default) beside the engine's buffers: 700 MiB does not hold gpt2-tiny's
# 504 MiB of stage 2 + offload with it (an outside probe measured 1070 MiB
# resident), 1200 MiB does, and --runtime-mem 0 leaves it out.
tiny=(--model gpt2 --n-layer 4 --n-embd 768 --n-head 12 --seq 64 --stage 2 --offload --json)
"$est" "${tiny[@]}" --host-mem 700MiB >"$work/rt700.out" 2>&1
[ $? = 3 ] && tail -1 "$work/rt700.out" | grep -q '"fits":false' \
  && grep -q "plus 512.0 MiB of each process's own runtime, LibTorch and MPI (--runtime-mem), within --host-mem" "$work/rt700.out" \
  || { cat "$work/rt700.out"; fail "--host-mem 700MiB took no runtime into account"; }
"$est" "${tiny[@]}" --host-mem 1200MiB >"$work/rt1200.out" 2>&1 && tail -1 "$work/rt1200.out" | grep -q '"fits":true' \
  || { cat "$work/rt1200.out"; fail "--host-mem 1200MiB does not fit"; }
"$est" "${tiny[@]}" --host-mem 700MiB --runtime-mem 0 >"$work/rt0.out" 2>&1 && tail -1 "$work/rt0.out" | grep -q '"fits":true' \
  && ! grep -q "own runtime" "$work/rt0.out" && tail -1 "$work/rt0.out" | grep -q '"runtime_mem":0,' \
  || { cat "$work/rt0.out"; fail "--runtime-mem 0 still counted a runtime"; }
"$est" "${tiny[@]}" --host-mem 700MiB --runtime-mem 0MiB >"$work/rt0m.out" 2>&1 && tail -1 "$work/rt0m.out" | grep -q '"fits":true' \
  || { cat "$work/rt0m.out"; fail "--runtime-mem 0MiB was not 0"; }
# A --host-mem no larger than the runtime: said so, not "add ranks".
"$est" "${tiny[@]}" --host-mem 256MiB >"$work/rt256.out" 2>&1
[ $? = 3 ] && grep -q "^nothing fits: --host-mem is no more than each process's own runtime (--runtime-mem 512.0 MiB)" "$work/rt256.out" \
  || { cat "$work/rt256.out"; fail "--host-mem below the runtime: not said"; }
# --offload given is offload_optimizer.device "cpu", over a config's "nvme" too.
printf '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "%s"}}}' \
  "$work" >"$work/nvme_cfg.json"
"$est" --params 1M --config "$work/nvme_cfg.json" --offload >"$work/nvme_off.out" 2>&1 \
  || { cat "$work/nvme_off.out"; fail "--offload over an nvme config failed"; }
grep -q "^stage 2 + offload  " "$work/nvme_off.out" && ! grep -q "(nvme)" "$work/nvme_off.out" \
  || { cat "$work/nvme_off.out"; fail "--offload did not override the config's nvme"; }
"$est" --params 1M --config "$work/nvme_cfg.json" | grep -q "^stage 2 + offload (nvme)" \
  || fail "the config's nvme was not taken without --offload"
# ... and --offload-param is offload_param.device "cpu" over the config's "nvme".
printf '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme", "nvme_path": "%s"}}}' \
  "$work" >"$work/pnvme_cfg.json"
"$est" --params 1M --config "$work/pnvme_cfg.json" | grep -q "(params nvme)" || fail "the config's param nvme was not taken"
"$est" --params 1M --config "$work/pnvme_cfg.json" --offload-param >"$work/pnvme_off.out" 2>&1 \
  && ! grep -q "(params nvme)" "$work/pnvme_off.out" || { cat "$work/pnvme_off.out"; fail "--offload-param did not override the config's param nvme"; }
# Nothing fits: the advice names only what makes one fit, each alone, tried
# through the same formulas: the fewest ranks, offload on a GPU, a
# micro-batch of 1, checkpointing; where none does, the least need.
"$est" --model gpt2-xl --world 1 --device-mem 12GiB --gpu --stage 3 >"$work/adv_ranks.out" 2>&1
[ $? = 3 ] && grep -q "^nothing fits: no configuration fits --device-mem (dev total); add ranks: stage 3 fits from --world 7; or offload: stage 3 + offload fits (--offload)$" "$work/adv_ranks.out" \
  || { cat "$work/adv_ranks.out"; fail "the advice for gpt2-xl at stage 3 on 12 GiB is not the fewest ranks and offload"; }
"$est" --model gpt2-xl --world 6 --device-mem 12GiB --gpu --stage 3 --json | tail -1 | grep -q '"fits":false' \
  && "$est" --model gpt2-xl --world 7 --device-mem 12GiB --gpu --stage 3 --json | tail -1 | grep -q '"fits":true' \
  || fail "--world 7 is not the fewest ranks at which gpt2-xl fits 12 GiB at stage 3"
# Stage 0 replicates: more ranks never help, and are not named.
"$est" --model gpt2 --stage 0 --world 1024 --device-mem 2GiB >"$work/adv_s0.out" 2>&1
[ $? = 3 ] && grep -q "^nothing fits: .*; stage 0 fits with --checkpoint-activations$" "$work/adv_s0.out" \
  || { cat "$work/adv_s0.out"; fail "stage 0's advice is not checkpointing alone"; }
# The construction peak, whole on every rank, is the device total at any world size.
"$est" --params 7.5e9 --world 64 --device-mem 32GB --gpu >"$work/adv_built.out" 2>&1
[ $? = 3 ] && grep -q "neither more ranks (up to 1048576) nor offload alone makes one fit; the nearest to fitting, stage 1 + offload, needs 41.91 GiB of device memory (while the engine is built" "$work/adv_built.out" \
  || { cat "$work/adv_built.out"; fail "a model whose construction peak does not fit was told to add ranks"; }
# Both memories short: the nearest configuration's need of each, and more of both.
"$est" --model gpt2-xl --gpu --world 2 --stage 3 --offload --device-mem 4GiB --host-mem 8GiB --runtime-mem 0 >"$work/adv_both.out" 2>&1
[ $? = 3 ] && grep -q "^nothing fits: no configuration fits --device-mem nor --host-mem; .*the nearest to fitting, stage 3 + offload, needs .* of device memory and .* of host memory: use more device and host memory$" "$work/adv_both.out" \
  || { cat "$work/adv_both.out"; fail "both memories short: not both said"; }
echo "zero-estimate --config: equal to its flags, overridden by flags, fp32 by default, accumulation on a GPU, Hugging Face autos filled, errors named"
