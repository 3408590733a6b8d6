#!/usr/bin/env bash
# zero-ckpt and zero-train --resume on a real checkpoint folder, one process:
#  - the messages when `latest` is missing or a tag is wrong list the tags
#    there and say how to pick one (--tag for zero-ckpt, --resume for
#    zero-train); a tag's own folder is accepted by zero-ckpt;
#  - a checkpoint at or past --steps is refused before anything trains;
#  - a resume with another global batch warns;
#  - inspect (without --verify) refuses a missing or truncated shard;
#  - export-hf refuses an --n-head that contradicts the checkpoint, and 0;
#  - an export-hf or consolidate that fails (here: past `ulimit -f`) leaves
#    the earlier export as it was and no temporaries;
#  - a run without validation plots no empty validation series;
#  - a resume with other --n-head, an export into the checkpoint folder and
#    an unknown command are refused (usage errors exit 2);
#  - the config's seed is zero-train's without --seed; wall_clock_breakdown
#    prints the phases of a step;
#  - a complete run with --save-every leaves its last step saved; with
#    --save-dir alone it says that only signals save;
#  - an export's --out that is a device, a pipe or the wrong kind is refused;
#    one beside a tag folder copied alone is written, one into it refused;
#    a required argument given as "" is not told it may be left out;
#  - a failed export into new folders leaves none of them; a checkpoint
#    whose shapes are not the GPT's is refused before anything is written;
#  - a resume with another optimizer is refused in zero-train's words.
# usage: ckpt_cli_test.sh ZERO_TRAIN ZERO_CKPT CORPUS WORK
set -u
train=$1 ckpt=$2 corpus=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/../support/expect.sh"  # fail, expect_fail
export ZERO_COMM_BACKEND=single
ck=$work/ck
base=("$corpus" --model gpt2-tiny --out "$work/out" --save-dir "$ck")

"$train" "${base[@]}" --steps 4 --save-every 2 --eval-every 0 --sync-save >"$work/train.log" 2>&1 \
  || { cat "$work/train.log"; fail "the training run failed"; }
[ -d "$ck/step-2" ] && [ -d "$ck/step-4" ] || fail "the run did not save step-2 and step-4"
grep -q "Skipping data file" "$work/train.log" && fail "a run without validation plotted an empty validation series"
# --decay matrices (the default): the weight matrices and embeddings (2 + 4 per block) decay, biases and
# LayerNorm gains (the other 18) do not.
grep -qE "zerocpp: weight decay 0.01 on 10 parameters \([0-9.]+K elements\), 0 on 18 \(" "$work/train.log" \
  || { cat "$work/train.log"; fail "the default run did not say which parameters take weight decay"; }
grep -q "'validation'" "$work/out/plot.gp" && fail "plot.gp has a validation series without validation points"

# Resume at or past --steps: refused before the model is built, with the fix.
expect_fail "$work/past.log" "checkpoint .*step-4 is at step 4, past --steps 3: nothing left to train; raise --steps above 4" \
  "$train" "${base[@]}" --steps 3 --resume latest
grep -q "^model:" "$work/past.log" && fail "a resume past --steps built the model before refusing"
expect_fail "$work/equal.log" "is at step 4 and --steps is 4: nothing left to train" \
  "$train" "${base[@]}" --steps 4 --resume latest
# A resume whose global batch differs from the saved run's says so.
printf '{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}' \
  >"$work/batch32.json"
cp -r "$ck" "$work/ck_batch"
"$train" "${base[@]/$ck/$work/ck_batch}" --config "$work/batch32.json" --steps 3 --eval-every 0 --resume step-2 \
  --seq-len 32 --save-every 2 >"$work/batch.log" 2>&1 \
  || { cat "$work/batch.log"; fail "the resume with another batch failed"; }
grep -q "warning: the checkpoint was trained with a global batch of 16 sequences, this run has 32" "$work/batch.log" \
  || { cat "$work/batch.log"; fail "a resume with another global batch gave no warning"; }
# ... with another sequence length and lr (the config's 1e-3, the default's 3e-3) too; and the later
# checkpoint there (step-4) that this branch's saves would replace is named before training.
grep -q "warning: the checkpoint was trained with --seq-len 64, this run has 32" "$work/batch.log" \
  || { cat "$work/batch.log"; fail "a resume with another --seq-len gave no warning"; }
grep -q "warning: the checkpoint was trained with lr 0.003, this run's config has 0.001" "$work/batch.log" \
  || { cat "$work/batch.log"; fail "a resume with another lr gave no warning"; }
# ... and another weight decay (the default config's 0.01, batch32.json's AdamW default 0), with the --config fix.
grep -q "warning: the checkpoint was trained with weight_decay 0.01, this run's config has 0: to continue as it was, give a --config whose optimizer.params.weight_decay is 0.01" \
  "$work/batch.log" || { cat "$work/batch.log"; fail "a resume with another weight decay gave no zero-train warning"; }
# ... once: the engine's line on the same change (in EngineOptions' terms) is not said again.
grep -q "was trained with other optimizer settings" "$work/batch.log" \
  && { cat "$work/batch.log"; fail "a resume with another weight decay was warned of twice"; }
grep -q "warning: --save-dir .*ck_batch holds checkpoints past step 2, where this run starts (step-4): this run's saves replace" \
  "$work/batch.log" || { cat "$work/batch.log"; fail "the later checkpoint of the run resumed from was not named"; }
grep -q "another corpus" "$work/batch.log" && fail "the same corpus was called another"
# Another corpus: said.
cp -r "$ck" "$work/ck_corpus"
tr 'a-y' 'b-z' <"$corpus" >"$work/other_corpus.txt"  # (the same size: told apart by its bytes)
"$train" "$work/other_corpus.txt" --model gpt2-tiny --out "$work/out_corpus" --save-dir "$work/ck_corpus" --steps 5 \
  --eval-every 0 --sample 0 --resume latest --decay all >"$work/corpus.log" 2>&1 || { cat "$work/corpus.log"; fail "the resume on another corpus failed"; }
# ... with --decay all: every parameter takes the config's decay (no per-parameter line), and the change is said.
grep -q "zerocpp: weight decay" "$work/corpus.log" && fail "--decay all still gave parameters decays of their own"
grep -q "zero-train: weight decay 0.01 on all 28 parameters (0.12M elements; --decay all)" "$work/corpus.log" \
  || { cat "$work/corpus.log"; fail "--decay all did not say that every parameter takes the decay"; }
grep -q "warning: the checkpoint was trained with --decay matrices, this run has --decay all" "$work/corpus.log" \
  || { cat "$work/corpus.log"; fail "a resume with another --decay gave no warning"; }
grep -q "warning: the checkpoint was trained on another corpus" "$work/corpus.log" \
  || { cat "$work/corpus.log"; fail "a resume on another corpus gave no warning"; }
# The optimizer's betas, eps and clipping, and the schedule (--warmup),
# changed at a resume: each said with the way back; the same ones: nothing.
cp -r "$ck" "$work/ck_opt"
printf '{"train_micro_batch_size_per_gpu": 16, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.5, 0.9], "eps": 0.01, "weight_decay": 0.01}}, "gradient_clipping": 0.05}' \
  >"$work/opt.json"
"$train" "$corpus" --model gpt2-tiny --out "$work/out_opt" --save-dir "$work/ck_opt" --steps 5 --eval-every 0 \
  --resume step-2 --warmup 3 --config "$work/opt.json" >"$work/opt.log" 2>&1 || { cat "$work/opt.log"; fail "the resume with other optimizer settings failed"; }
for said in "betas \[0.9,0.95\], this run's config has \[0.5,0.9\]: .* whose optimizer.params.betas is \[0.9,0.95\]" \
            "eps 1e-08, this run's config has 0.01" "gradient_clipping 1.0, this run's config has 0.05" \
            "the lr schedule \"linear warm-up from 0 to 0.003 over 2 steps.*\", this run's is \"linear warm-up from 0 to 0.003 over 3 steps, then cosine down to 0.0003 at step 5\": step 3 trains at lr 0.002 (the saved run's next: 0.00"; do
  grep -q "warning: the checkpoint was trained with $said" "$work/opt.log" || { cat "$work/opt.log"; fail "no warning: $said"; }
done
grep -q "to continue as it was, give the saved run's --steps, --warmup and --min-lr-ratio" "$work/opt.log" \
  || { cat "$work/opt.log"; fail "a schedule changed mid-run was not told how to continue as it was"; }
cp -r "$ck" "$work/ck_same"
"$train" "$corpus" --model gpt2-tiny --save-dir "$work/ck_same" --steps 4 --eval-every 0 --resume step-2 \
  --out "$work/out_same" >"$work/same.log" 2>&1 \
  || { cat "$work/same.log"; fail "the resume with the same settings failed"; }
grep -q "warning: the checkpoint was trained with" "$work/same.log" && { cat "$work/same.log"; fail "a resume with the same settings warned"; }
# Another optimizer: refused, in zero-train's words (not only the engine's
# EngineOptions and "fresh engine").
cp -r "$ck" "$work/ck_lion"
printf '{"train_micro_batch_size_per_gpu": 16, "optimizer": {"type": "Lion", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' >"$work/lion.json"
expect_fail "$work/lion.log" "holds the state of optimizer AdamW, this engine's is Lion.*In zero-train the optimizer is the config's optimizer.type: resume with a --config whose optimizer is the checkpoint's .*, or start a new run from its weights with this one \(zero-ckpt consolidate .* --out w.safetensors, then --init-from w.safetensors instead of --resume\)" \
  "$train" "$corpus" --model gpt2-tiny --out "$work/out_lion" --save-dir "$work/ck_lion" --steps 5 --eval-every 0 \
  --sample 0 --resume latest --config "$work/lion.json"
# A complete run that saves every K steps leaves its last step saved, also
# where K does not divide --steps (the resume above: step-3); with
# --save-dir alone only signals save, said at the start.
[ "$(cat "$work/ck_batch/latest")" = "step-3" ] || fail "the resumed run to step 3 did not save its last step"
grep -q "checkpoint step-3: saving to .* (the last step)" "$work/batch.log" || fail "the last step's save was not said"
"$train" "$corpus" --model gpt2-tiny --out "$work/out_last" --save-dir "$work/ck_last" --steps 1 --eval-every 0 \
  --sample 0 >"$work/last.log" 2>&1 || { cat "$work/last.log"; fail "a run with --save-dir alone failed"; }
[ -e "$work/ck_last/latest" ] && fail "a run with --save-dir and no --save-every saved its last step"
grep -q "checkpoints: --save-dir without --save-every: saved only when a signal asks" "$work/last.log" \
  || { cat "$work/last.log"; fail "a run with --save-dir alone did not say when it saves"; }
# A tag that is not there: the tags that are.
expect_fail "$work/tag99.log" "no checkpoint 'step-99' in .*holds step-2, step-4: give --resume step-4" \
  "$train" "${base[@]}" --steps 6 --resume step-99
expect_fail "$work/tag99c.log" "no checkpoint 'step-99' in .*holds step-2, step-4: give --tag step-4" \
  "$ckpt" inspect "$ck" --tag step-99

# No `latest`, tags there: each tool says how to pick one.
cp -r "$ck" "$work/nolatest" && rm "$work/nolatest/latest"
expect_fail "$work/nolatest_ckpt.log" "no 'latest' file in .*holds step-2, step-4: give --tag step-4" \
  "$ckpt" inspect "$work/nolatest"
grep -q "resume" "$work/nolatest_ckpt.log" && fail "zero-ckpt's message speaks of --resume, which it does not have"
expect_fail "$work/nolatest_train.log" "no 'latest' file in .*holds step-2, step-4: give --resume step-4" \
  "$train" "${base[@]/$ck/$work/nolatest}" --steps 6 --resume latest
# An empty folder: nothing to pick.
mkdir "$work/empty"
expect_fail "$work/empty.log" "holds no finished checkpoint: start without --resume" \
  "$train" "${base[@]/$ck/$work/empty}" --steps 6 --resume latest

# Without --config, a changed global batch's fix is a whole config (the default with the saved batch):
# following it resumes with no warning.
printf '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16, "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' \
  >"$work/tb32.json"
"$train" "$corpus" --model gpt2-tiny --out "$work/out_tb" --save-dir "$work/ck_tb" --steps 2 --save-every 2 --eval-every 0 \
  --config "$work/tb32.json" >"$work/tb.log" 2>&1 || { cat "$work/tb.log"; fail "the batch-32 run"; }
"$train" "$corpus" --model gpt2-tiny --out "$work/out_tb2" --save-dir "$work/ck_tb" --steps 3 --eval-every 0 \
  --resume latest >"$work/tb2.log" 2>&1 || { cat "$work/tb2.log"; fail "the default-config resume"; }
grep -o "give a --config file holding zero-train's default config with that batch: {.*}" "$work/tb2.log" \
  | sed 's/^[^{]*//' >"$work/tb_fix.json"
grep -q '"train_batch_size":32' "$work/tb_fix.json" || { cat "$work/tb2.log"; fail "no config given as the batch's fix"; }
"$train" "$corpus" --model gpt2-tiny --out "$work/out_tb3" --save-dir "$work/ck_tb" --steps 3 --eval-every 0 \
  --resume latest --config "$work/tb_fix.json" >"$work/tb3.log" 2>&1 || { cat "$work/tb3.log"; fail "the resume with the fix"; }
# (--steps 3 against the saved 2 changes the schedule, and says so: that warning is the test's own;
# the saved run had ended, so no advice to give its --steps back.)
grep -q "the saved run had ended, so a longer run's schedule is its own" "$work/tb3.log" \
  || { cat "$work/tb3.log"; fail "extending an ended run was told to give its --steps back"; }
grep "warning: the checkpoint was trained with" "$work/tb3.log" | grep -qv "the lr schedule" \
  && { cat "$work/tb3.log"; fail "the fix's config still differs"; }
# ... and a damaged manifest, found before the model is built.
cp -r "$ck" "$work/ck_manifest" && sed -i 's/"step": 4/"step": 5/' "$work/ck_manifest/step-4/manifest.json"
expect_fail "$work/manifest_bad.log" "manifest.*Load another tag.*The other checkpoints in --save-dir .*ck_manifest, newest first: step-2; resume from one with --resume step-2" \
  "$train" "$corpus" --model gpt2-tiny --out "$work/out_manifest" --save-dir "$work/ck_manifest" --steps 6 --resume latest
grep -q "^model:" "$work/manifest_bad.log" && fail "a damaged manifest was found only after the model was built"
# A branch from an older tag that may save nothing (no --save-every): `latest` still names the newest.
cp -r "$ck" "$work/ck_branch"
"$train" "$corpus" --model gpt2-tiny --out "$work/out_branch" --save-dir "$work/ck_branch" --steps 3 --eval-every 0 \
  --resume step-2 >"$work/branch.log" 2>&1 || { cat "$work/branch.log"; fail "the branch resume failed"; }
grep -q "\`latest\` names step-4 until this run saves (without --save-every only a signal saves" "$work/branch.log" \
  || { cat "$work/branch.log"; fail "a branch without --save-every was told latest would name its newest"; }
[ "$(cat "$work/ck_branch/latest")" = step-4 ] || fail "latest moved though the branch saved nothing"
# A checkpoint with a shard missing: the resume names the other tags, newest first, and the way to one.
cp -r "$ck" "$work/ck_missing" && rm "$work/ck_missing/step-4/"rank-*.bin && cp -r "$ck/step-2" "$work/ck_missing/step-1"
expect_fail "$work/missing.log" "a shard is missing\): load another tag. The other checkpoints in --save-dir .*ck_missing, newest first: step-2, step-1; resume from one with --resume step-2" \
  "$train" "$corpus" --model gpt2-tiny --out "$work/out_missing" --save-dir "$work/ck_missing" --steps 6 --resume latest
# A tag's own folder: zero-ckpt reads it; zero-train's --save-dir says what to give.
"$ckpt" inspect "$ck/step-2" >"$work/tagdir.log" 2>&1 || { cat "$work/tagdir.log"; fail "inspect of a tag folder failed"; }
grep -q '"step":2' "$work/tagdir.log" || fail "inspect $ck/step-2 did not show step-2"
grep -q "settings per parameter: weight decay 0.01 on 10, 0 on 18; lr scale 1 on 28" "$work/tagdir.log" \
  || { cat "$work/tagdir.log"; fail "inspect did not show the weight decay per parameter that --decay matrices recorded"; }
expect_fail "$work/tagdir2.log" "is checkpoint 'step-2' itself .*--tag says 'step-4'" \
  "$ckpt" inspect "$ck/step-2" --tag step-4
# --tag latest is the default spelt out: the tag folder given is read where it is the latest, and
# refused where `latest` names another.
"$ckpt" inspect "$ck/step-4" --tag latest >"$work/tagdir4.log" 2>&1 && grep -q '"step":4' "$work/tagdir4.log" \
  || { cat "$work/tagdir4.log"; fail "inspect of the latest tag's folder with --tag latest"; }
expect_fail "$work/tagdir5.log" "is checkpoint 'step-2' itself .*--tag says 'latest'" "$ckpt" inspect "$ck/step-2" --tag latest
expect_fail "$work/tagdir3.log" "is one checkpoint .*give its parent folder .* and --resume step-2" \
  "$train" "${base[@]/$ck/$ck/step-2}" --steps 6 --resume latest

# A shard truncated or deleted: inspect without --verify says so, non-zero.
cp -r "$ck" "$work/short"
shard=$(ls "$work/short/step-4"/rank-*.bin | head -1)
truncate -s 1000 "$shard"
expect_fail "$work/short.log" "is incomplete: 1 of 1 file\(s\) missing or not their recorded size; rank-.*: 1000 bytes, .*\(truncated\)" \
  "$ckpt" inspect "$work/short"
rm "$shard"
expect_fail "$work/missing.log" "rank-[0-9-]*of-[0-9]*\.bin: missing" "$ckpt" inspect "$work/short"
expect_fail "$work/missing2.log" "is incomplete" "$ckpt" consolidate "$work/short" --out "$work/x.safetensors" --no-verify

# --n-head: the checkpoint records 2 (gpt2-tiny).
expect_fail "$work/nhead.log" "--n-head 4 contradicts the checkpoint: .* was trained with n_head 2" \
  "$ckpt" export-hf "$ck" --out "$work/hf_bad" --n-head 4
[ -e "$work/hf_bad" ] && fail "a refused export-hf left its --out folder"
# The heads are no parameter's shape: a resume with others is refused by name.
expect_fail "$work/resume_nhead.log" "is of another model: 2 layers x 64 wide, 2 heads, context 64, vocabulary 256 \(gpt2-tiny\); this run's: 2 layers x 64 wide, 4 heads, .*Resume with --model gpt2-tiny \(without --n-head\), or start" \
  "$train" "${base[@]}" --steps 6 --resume latest --n-head 4
# ... and another preset, or another shape, named with the options that give the saved one, before the model is built.
expect_fail "$work/resume_preset.log" "is of another model: .*; this run's: 4 layers x 128 wide, 4 heads, context 128, .*Resume with --model gpt2-tiny, or start" \
  "$train" "$corpus" --model gpt2-small-test --out "$work/out_preset" --save-dir "$ck" --steps 6 --resume latest
grep -q "^model:" "$work/resume_preset.log" && fail "a resume of another preset built the model before refusing"
expect_fail "$work/resume_shape.log" "this run's: 3 layers x 64 wide, 2 heads, context 32, .*Resume with --model gpt2-tiny \(without --n-layer, --block-size\)" \
  "$train" "${base[@]}" --steps 6 --resume latest --n-layer 3 --block-size 32
# Never an export into the checkpoint folder (over a shard, `latest`, a tag).
for out in "$ck/step-4/rank-00000-of-00001.bin" "$ck/latest" "$ck/step-2"; do
  expect_fail "$work/into.log" "is inside the checkpoint folder" "$ckpt" consolidate "$ck" --out "$out"
done
"$ckpt" inspect "$ck" --verify >"$work/after_into.log" 2>&1 || { cat "$work/after_into.log"; fail "a refused --out damaged the checkpoint"; }
# A tag's folder copied alone (a download, no `latest` beside it) protects itself only: an export beside it is
# written, one into it refused.
mkdir -p "$work/dl" && cp -r "$ck/step-4" "$work/dl/step-4"
"$ckpt" export-hf "$work/dl/step-4" --out "$work/dl/hf" >"$work/dl.log" 2>&1 \
  || { cat "$work/dl.log"; fail "an export beside a lone tag folder was refused"; }
[ -f "$work/dl/hf/config.json" ] || fail "the export beside a lone tag folder wrote no config.json"
expect_fail "$work/dl_into.log" "is inside the checkpoint .*dl/step-4 \(its shards\)" \
  "$ckpt" consolidate "$work/dl/step-4" --out "$work/dl/step-4/m.safetensors"
# An unfinished save's own folder is named as such, with the tags there.
cp -r "$ck/step-2" "$work/ck_partial" && mkdir -p "$work/ck_partial_dir" && mv "$work/ck_partial" "$work/ck_partial_dir/step-6.partial"
cp -r "$ck/step-4" "$work/ck_partial_dir/step-4"
expect_fail "$work/partial.log" "ck_partial_dir/step-6.partial is an unfinished save of 'step-6' .*holds step-4: give .*ck_partial_dir --tag step-4" \
  "$ckpt" inspect "$work/ck_partial_dir/step-6.partial"
# Never a rename over what is not what the export writes: a device, a pipe,
# a folder for consolidate, a file for export-hf.
mkfifo "$work/pipe"
ln -s /dev/null "$work/null_link"
for out in "$work/null_link" "$work/pipe" "$work/out"; do
  expect_fail "$work/kind.log" "--out .* is (a character device|a pipe \(FIFO\)|a folder): consolidate writes a .safetensors file" \
    "$ckpt" consolidate "$ck" --out "$out"
done
[ -c /dev/null ] && [ -p "$work/pipe" ] || fail "a refused --out replaced /dev/null or the pipe"
expect_fail "$work/kind_hf.log" "--out .*afile_hf is a file: export-hf writes a folder" \
  bash -c "echo x >'$work/afile_hf' && '$ckpt' export-hf '$ck' --out '$work/afile_hf'"
# A --save-dir that cannot be a folder is refused before anything trains.
echo x >"$work/afile"
expect_fail "$work/savedir.log" "--save-dir .*afile is a file, not a folder" \
  "$train" "$corpus" --model gpt2-tiny --out "$work/out" --steps 4 --save-every 2 --save-dir "$work/afile/ck"
grep -q "^step 1" "$work/savedir.log" && fail "a --save-dir below a file was found only after training"
# Usage errors exit 2 (a failure is 1), an unknown command is named.
"$ckpt" frobnicate "$ck" >"$work/unknown.log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "unknown command 'frobnicate'" "$work/unknown.log" || { cat "$work/unknown.log"; fail "unknown command: exit $rc"; }
# An empty value (an unset shell variable) is a usage error naming the
# option, not a filesystem exception.
for args in "consolidate $ck --out" "export-hf $ck --out" "inspect $ck --tag" "inspect"; do
  "$ckpt" $args "" >"$work/empty.log" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q ": is empty: give " "$work/empty.log" || { cat "$work/empty.log"; fail "zero-ckpt $args '': exit $rc"; }
  # ... and a required one is not told it may be left out.
  [ "$args" != "inspect $ck --tag" ] && grep -q "leave the option out" "$work/empty.log" \
    && { cat "$work/empty.log"; fail "zero-ckpt $args '': a required argument was told it may be left out"; }
done
"$train" --steps 1e3 >"$work/usage.log" 2>&1; rc=$?
[ $rc -eq 2 ] || { cat "$work/usage.log"; fail "zero-train usage error: exit $rc, expected 2"; }
# The config's seed is zero-train's without --seed (the same run as --seed 7),
# and wall_clock_breakdown prints the phases every steps_per_print steps.
echo '{"train_micro_batch_size_per_gpu": 4, "seed": 7, "wall_clock_breakdown": true, "steps_per_print": 2}' >"$work/seed.json"
"$train" "$corpus" --model gpt2-tiny --steps 2 --eval-every 0 --sample 0 --config "$work/seed.json" --out "$work/s1" \
  >"$work/s1.log" 2>&1 || { cat "$work/s1.log"; fail "the run with a config seed failed"; }
"$train" "$corpus" --model gpt2-tiny --steps 2 --eval-every 0 --sample 0 --config "$work/seed.json" --seed 7 --out "$work/s2" \
  >"$work/s2.log" 2>&1 || { cat "$work/s2.log"; fail "the run with --seed 7 failed"; }
[ "$(grep -o '"loss":[^,]*' "$work/s1/metrics.jsonl")" = "$(grep -o '"loss":[^,]*' "$work/s2/metrics.jsonl")" ] \
  || fail "the config's seed 7 and --seed 7 trained differently"
grep -qE "step 2: time per step over the last 2 \(wall_clock_breakdown, rank 0\): forward [0-9.]+ ms, backward [0-9.]+ ms" "$work/s1.log" \
  || { cat "$work/s1.log"; fail "no wall_clock_breakdown line"; }
"$train" "$corpus" --model gpt2-tiny --steps 1 --eval-every 0 --sample 0 --config "$work/seed.json" --seed 8 --out "$work/s3" \
  >"$work/s3.log" 2>&1
grep -q "config warning: --seed 8 overrides the config's seed 7" "$work/s3.log" || { cat "$work/s3.log"; fail "no warning for --seed over the config's"; }
expect_fail "$work/nhead0.log" "--n-head: must be >= 1, got 0" "$ckpt" export-hf "$ck" --out "$work/hf_bad" --n-head 0

# A failed export over an earlier one leaves that one whole, and no temporaries.
"$ckpt" export-hf "$ck" --tag step-2 --out "$work/hf" >"$work/hf.log" 2>&1 || { cat "$work/hf.log"; fail "export-hf failed"; }
before=$(cd "$work/hf" && md5sum config.json model.safetensors)
limited() { ( trap '' XFSZ; ulimit -f 100; exec "$@" ); }  # 100 KiB: the safetensors file is ~480 KiB
expect_fail "$work/hf_full.log" "model.safetensors.tmp: File too large; free space or choose another --out" \
  limited "$ckpt" export-hf "$ck" --out "$work/hf"
[ "$(cd "$work/hf" && md5sum config.json model.safetensors)" = "$before" ] || fail "a failed export-hf changed the earlier export"
[ -z "$(ls "$work/hf" | grep -v '^config.json$\|^model.safetensors$')" ] || fail "a failed export-hf left $(ls "$work/hf")"
expect_fail "$work/hf_new.log" "File too large" limited "$ckpt" export-hf "$ck" --out "$work/hf_new/a/b"
[ -e "$work/hf_new" ] && fail "a failed export-hf into a new folder left the folders it made"
# A checkpoint whose shapes are not the GPT's (a manifest edited, its checksum recomputed) is refused before anything
# is written.
cp -r "$ck" "$work/ck_shape"
python3 - "$work/ck_shape/step-4/manifest.json" <<'PY'
import json, sys
def crc32c(data):
    c = 0xFFFFFFFF
    for x in data:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF
p = sys.argv[1]
m = json.load(open(p))
for q in m["params"]:
    if q["name"] == "h0.ln1.weight":
        q["shape"] = [8, 8]  # (the same 64 elements)
m.pop("manifest_crc32c")
m["manifest_crc32c"] = "%08x" % crc32c(json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
json.dump(m, open(p, "w"))
PY
expect_fail "$work/shape.log" "'h0.ln1.weight' has the shape \\[8, 8\\], a GPT of width 64 has \\[64\\]" \
  "$ckpt" export-hf "$work/ck_shape" --out "$work/hf_shape"
[ -e "$work/hf_shape" ] && fail "a refused export-hf left its --out folder"
expect_fail "$work/con_full.log" "File too large" limited "$ckpt" consolidate "$ck" --out "$work/m.safetensors"
[ -z "$(ls "$work" | grep safetensors)" ] || fail "a failed consolidate left $(ls "$work" | grep safetensors)"

echo "zero-ckpt / --resume: tags listed, tag folders read, incomplete shards, contradicting --n-head and exports into the checkpoint refused, failed exports leave nothing; the config's seed and wall_clock_breakdown"
rm -rf "$work"
