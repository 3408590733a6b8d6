#!/usr/bin/env bash
# zero-train --resume auto: one command for a job's first start and every
# restart (a scheduler's requeue). No checkpoint in --save-dir (no folder,
# an empty one, a save that never committed): a new run from step 0, from
# --init-from's weights where given; a checkpoint there: the newest, the
# --init-from unused, and the resumed losses bitwise those of a run never
# stopped, on 2 ranks. Tags without a readable `latest` are an error, never
# a silent new run over them.
# usage: resume_auto_test.sh MPIRUN ZERO_TRAIN ZERO_CKPT CORPUS WORK
set -u
mpirun=$1 train=$2 ckpt=$3 corpus=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/../support/expect.sh"  # fail, expect_fail
run=("$train" "$corpus" --model gpt2-tiny --eval-every 0 --sample 0)
loss_at() { grep "\"step\": *$2[,}]" "$1" | sed 's/.*"loss": *\([^,}]*\).*/\1/'; }

# The first start, on 2 ranks, into a folder that is not there yet; stopped
# (by its --steps) at step 2 ...
timeout 300 $mpirun -np 2 "${run[@]}" --steps 2 --save-every 2 --save-dir "$work/ck" --resume auto --out "$work/a" \
  >"$work/a.log" 2>&1 || { cat "$work/a.log"; fail "the first start with --resume auto"; }
grep -q "^resume: --resume auto: --save-dir $work/ck holds no checkpoint yet: a new run from step 0$" "$work/a.log" \
  || { cat "$work/a.log"; fail "the first start did not say it was a new run"; }
[ "$(cat "$work/ck/latest")" = step-2 ] || fail "the first start saved no step-2"
# ... the same command, requeued with the run's real --steps: from step-2.
timeout 300 $mpirun -np 2 "${run[@]}" --steps 4 --save-every 2 --save-dir "$work/ck" --resume auto --out "$work/b" \
  >"$work/b.log" 2>&1 || { cat "$work/b.log"; fail "the restart with --resume auto"; }
grep -q "^resume: --resume auto: --save-dir $work/ck holds checkpoints: resuming from latest$" "$work/b.log" \
  || { cat "$work/b.log"; fail "the restart did not say it resumed"; }
grep -q "loaded checkpoint $work/ck/step-2" "$work/b.log" || { cat "$work/b.log"; fail "the restart did not load step-2"; }
timeout 300 $mpirun -np 2 "${run[@]}" --steps 4 --out "$work/full" >"$work/full.log" 2>&1 \
  || { cat "$work/full.log"; fail "the unbroken run"; }
[ "$(grep -c . "$work/b/metrics.jsonl")" = 2 ] || { cat "$work/b/metrics.jsonl"; fail "the restart did not train steps 3 and 4 alone"; }
for step in 3 4; do
  a=$(loss_at "$work/full/metrics.jsonl" $step) b=$(loss_at "$work/b/metrics.jsonl" $step)
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "step $step: the restart's loss $b, the unbroken run's $a"
done
# (Both schedules warm up over steps 1 and 2, DeepSpeed's least, so the
# first start's steps are the unbroken run's whatever their --steps; steps 3
# and 4 follow --steps 4 in both.)

# ... and once more after the run finished (a requeue after the last save): nothing to train, exit 0.
timeout 300 $mpirun -np 2 "${run[@]}" --steps 4 --save-every 2 --save-dir "$work/ck" --resume auto --out "$work/b2" \
  >"$work/b2.log" 2>&1 || { cat "$work/b2.log"; fail "a finished run requeued with --resume auto did not exit 0"; }
grep -q "^resume: --resume auto: the newest checkpoint in $work/ck is at step 4, --steps: the run is complete; nothing to train" \
  "$work/b2.log" || { cat "$work/b2.log"; fail "a finished run requeued did not say it was complete"; }
grep -q "^step " "$work/b2.log" && fail "a finished run requeued trained"

# --init-from with --resume auto: the weights for the first start ...
"$ckpt" consolidate "$work/ck" --out "$work/w.safetensors" >"$work/cons.log" 2>&1 || { cat "$work/cons.log"; fail "consolidate"; }
ZERO_COMM_BACKEND=single "${run[@]}" --steps 1 --save-every 1 --save-dir "$work/ck_init" --resume auto \
  --init-from "$work/w.safetensors" --out "$work/c" >"$work/c.log" 2>&1 || { cat "$work/c.log"; fail "--init-from with --resume auto"; }
grep -q "a new run from step 0, from --init-from $work/w.safetensors$" "$work/c.log" \
  || { cat "$work/c.log"; fail "the first start did not say it starts from the weights"; }
grep -q "^init: the weights of $work/w.safetensors" "$work/c.log" || { cat "$work/c.log"; fail "the weights were not read"; }
# ... and not for a restart (a file gone since does not matter).
ZERO_COMM_BACKEND=single "${run[@]}" --steps 2 --save-every 1 --save-dir "$work/ck_init" --resume auto \
  --init-from "$work/gone.safetensors" --out "$work/d" >"$work/d.log" 2>&1 || { cat "$work/d.log"; fail "the restart with --init-from"; }
grep -q "resuming from latest (--init-from is for the first start: not used)" "$work/d.log" \
  || { cat "$work/d.log"; fail "the restart did not say --init-from is not used"; }
grep -q "^init:" "$work/d.log" && fail "the restart read --init-from's weights"

# An empty folder, and one holding only a save that never committed: new runs.
mkdir -p "$work/empty" "$work/partial/step-5.partial"
for dir in empty partial; do
  ZERO_COMM_BACKEND=single "${run[@]}" --steps 1 --save-dir "$work/$dir" --resume auto --out "$work/o_$dir" \
    >"$work/$dir.log" 2>&1 || { cat "$work/$dir.log"; fail "--resume auto on the $dir folder"; }
  grep -q "holds no checkpoint yet: a new run from step 0" "$work/$dir.log" || { cat "$work/$dir.log"; fail "$dir: not a new run"; }
done
# Tags but no `latest` (removed by hand): the error of --resume latest, not a new run over them.
cp -r "$work/ck" "$work/nolatest" && rm "$work/nolatest/latest"
expect_fail "$work/nolatest.log" "no 'latest' file in .*holds step-2, step-4: give --resume step-4" \
  env ZERO_COMM_BACKEND=single "${run[@]}" --steps 6 --save-dir "$work/nolatest" --resume auto --out "$work/o_nolatest"
grep -q "^step " "$work/nolatest.log" && fail "tags without latest started a new run"
# A tag's own folder as --save-dir, and a file: --resume latest's errors, not a new run inside them.
expect_fail "$work/tagdir.log" "ck/step-2 is .*checkpoint" \
  env ZERO_COMM_BACKEND=single "${run[@]}" --steps 6 --save-dir "$work/ck/step-2" --resume auto --out "$work/o_tagdir"
[ -e "$work/ck/step-2/latest" ] && fail "a new run was saved inside the tag folder"
touch "$work/afile"
expect_fail "$work/afile.log" "--save-dir .*afile is not a folder" \
  env ZERO_COMM_BACKEND=single "${run[@]}" --steps 6 --save-dir "$work/afile" --resume auto --out "$work/o_afile"
grep -q "holds no checkpoint yet" "$work/afile.log" && { cat "$work/afile.log"; fail "a file as --save-dir was called a new run"; }
# --init-from with a tag (not auto) is still refused, naming auto.
expect_fail "$work/both.log" "give one of them \(or --resume auto: --init-from for the first start" \
  "${run[@]}" --steps 6 --save-dir "$work/ck" --resume latest --init-from "$work/w.safetensors" --out "$work/o_both"
# Ranks that see --save-dir differently (a folder local to each node): two
# working folders and a relative --save-dir; an error that names a rank of
# each side, never a run that resumes on some ranks and starts anew on others.
mkdir -p "$work/nodeA" "$work/nodeB" && cp -r "$work/ck" "$work/nodeA/ck"
expect_fail "$work/split.log" "the ranks see --save-dir ck differently: on rank 0 it holds checkpoints, on rank 1 none" \
  timeout 120 $mpirun -np 1 -wdir "$work/nodeA" "${run[@]}" --steps 6 --save-dir ck --resume auto --out o \
  : -np 1 -wdir "$work/nodeB" "${run[@]}" --steps 6 --save-dir ck --resume auto --out o
grep -q "^step " "$work/split.log" && fail "ranks that disagree about --save-dir trained"
echo "--resume auto: new runs where nothing is saved, the newest otherwise, bitwise on 2 ranks"
