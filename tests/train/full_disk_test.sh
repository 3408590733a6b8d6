#!/usr/bin/env bash
# zero-train on a full disk and a read-only one, on small tmpfs mounts
# (root and mount(2) needed: skipped, exit 77, where they are not):
#  - a save whose manifest does not fit (the shard fills the disk) fails as
#    an error, not a crash (it segfaulted: std::filesystem::remove_all bound
#    libtorch's copy), and leaves no partial folder;
#  - with --on-save-error continue the run finishes and its last lines say
#    how many saves failed and which checkpoint is the newest committed;
#  - one more page: the checkpoint is in place and the error says `latest`
#    could not follow, naming the tag to resume from (with continue: counted
#    as saved);
#  - a read-only --save-dir is refused before anything trains;
#  - metrics that cannot be written (metrics.jsonl on /dev/full: no mount
#    needed, so checked first) warn once, training goes on, and the run ends
#    with exit status 1 naming the step they stop at; a --report on a full
#    disk is exit 1 and leaves no partial file.
# usage: full_disk_test.sh ZERO_TRAIN CORPUS WORK
set -u
train=$1 corpus=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$work/full_out" && ln -s /dev/full "$work/full_out/metrics.jsonl"
ZERO_COMM_BACKEND=single timeout 200 "$train" "$corpus" --model gpt2-tiny --steps 3 --eval-every 0 \
  --out "$work/full_out" --report "$work/full_out.json" >"$work/full_out.log" 2>&1; rc=$?
[ $rc = 1 ] || { tail -5 "$work/full_out.log"; fail "metrics that could not be written: exit $rc, not 1"; }
n=$(grep -c "zero-train: warning: --out .*full_out: writing metrics.jsonl, loss.dat and val.dat failed at step 1 (No space left on device)" "$work/full_out.log")
[ "$n" = 1 ] || { tail -5 "$work/full_out.log"; fail "the failed metrics were warned of $n times, not once at step 1"; }
grep -q "^zero-train: error: --out .*failed at step 1 .*Training itself finished" "$work/full_out.log" \
  || { tail -5 "$work/full_out.log"; fail "the run's last line does not say the metrics are incomplete"; }
grep -q "^metrics: " "$work/full_out.log" && fail "incomplete metrics were announced as written"
grep -q '"out_error": "--out .*failed at step 1' "$work/full_out.json" || fail "the report does not carry the metrics' failure"
disk=$work/disk
mkdir -p "$disk"
mount -t tmpfs -o size=64k tmpfs "$disk" 2>/dev/null || { echo "SKIP: cannot mount a tmpfs here (not root?)"; exit 77; }
trap 'umount "$disk" 2>/dev/null' EXIT
export ZERO_COMM_BACKEND=single
printf '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}' >"$work/fp32.json"
run() { timeout 200 "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" --steps 2 --save-every 2 \
          --sync-save --eval-every 0 --sample 0 --out "$work/out" "$@"; }
# The shard's size, from a save on the real disk.
run --save-dir "$work/ck" >"$work/size.log" 2>&1 || { cat "$work/size.log"; fail "the sizing run failed"; }
shard=$(stat -c %s "$work"/ck/step-2/rank-*.bin)
pages=$(( (shard + 4095) / 4096 ))
# (+1 page: --save-dir's lock file, .lock, holding its job's pid and host.)
resize() { rm -rf "${disk:?}"/*; mount -o remount,size=$(( ($1 + 1) * 4 ))k "$disk" || fail "cannot resize the tmpfs"; }

resize $pages  # the shard fits, its manifest does not
run --save-dir "$disk/ck" >"$work/manifest.log" 2>&1; rc=$?
[ $rc = 1 ] || { tail -5 "$work/manifest.log"; fail "a manifest that does not fit: exit $rc, not 1 (139 is the segfault)"; }
grep -q "checkpoint 'step-2' was not saved: writing .*manifest.json.tmp failed: No space left on device" "$work/manifest.log" \
  || { tail -5 "$work/manifest.log"; fail "no error naming the manifest's write"; }
[ -z "$(ls -A "$disk/ck" 2>/dev/null | grep -vx '.lock')" ] || fail "the failed save left $(ls -A "$disk/ck")"

resize $pages
run --save-dir "$disk/ck" --on-save-error continue >"$work/continue.log" 2>&1 \
  || { tail -5 "$work/continue.log"; fail "--on-save-error continue did not finish"; }
grep -q "zero-train: warning: 1 checkpoint save(s) of this run failed (--on-save-error continue); the newest checkpoint committed in .* is none" \
  "$work/continue.log" || { tail -5 "$work/continue.log"; fail "the end of the run does not say a save failed"; }

resize $(( pages + 2 ))  # the shard and the manifest fit, `latest` does not
run --save-dir "$disk/ck" >"$work/latest.log" 2>&1 && fail "a latest that could not be written exited 0"
grep -q "checkpoint 'step-2' is complete in .*step-2, but .*latest could not name it .*it still names nothing (no latest file)\. Free space, and resume from this one with its tag (--resume step-2)" \
  "$work/latest.log" || { tail -5 "$work/latest.log"; fail "the error does not say the checkpoint is complete and latest behind"; }
[ -f "$disk/ck/step-2/manifest.json" ] || fail "the complete checkpoint is not there"
[ -e "$disk/ck/latest.tmp" ] && fail "the failed write of latest left latest.tmp"
# ... which --on-save-error continue counts as saved, not as a failure.
resize $(( pages + 2 ))
run --save-dir "$disk/ck" --on-save-error continue --report "$work/latest.json" >"$work/latest_continue.log" 2>&1 \
  || { tail -5 "$work/latest_continue.log"; fail "continue with a latest that could not follow did not finish"; }
grep -q "zero-train: warning: checkpoint 'step-2' is complete in .*; training is complete (--on-save-error continue)" \
  "$work/latest_continue.log" || { tail -5 "$work/latest_continue.log"; fail "no warning that step-2 is complete"; }
grep -q "save(s) of this run failed" "$work/latest_continue.log" && fail "a complete checkpoint was counted as a failed save"
grep -q '"failed_saves": 0' "$work/latest.json" || fail "the report counts the complete checkpoint as a failed save"

resize 0  # the report does not fit in one page (the run's own files are elsewhere)
timeout 200 "$train" "$corpus" --model gpt2-tiny --config "$work/fp32.json" --steps 2 --eval-every 0 \
  --out "$work/out" --report "$disk/report.json" >"$work/report.log" 2>&1; rc=$?
[ $rc = 1 ] || { tail -5 "$work/report.log"; fail "a report that did not fit: exit $rc, not 1"; }
grep -q -- "--report .*report.json: writing the report failed (No space left on device)" "$work/report.log" \
  || { tail -5 "$work/report.log"; fail "no error naming the report's write"; }
[ -z "$(ls -A "$disk")" ] || fail "the failed report left $(ls -A "$disk")"

mount -o remount,ro "$disk" || fail "cannot make the tmpfs read-only"
run --save-dir "$disk/new" >"$work/ro.log" 2>&1 && fail "a read-only --save-dir was taken"
grep -q -- "--save-dir .*new: cannot write in .*disk (Read-only file system), so no checkpoint could be saved" "$work/ro.log" \
  || { tail -5 "$work/ro.log"; fail "no error naming the read-only folder"; }
grep -q "^step " "$work/ro.log" && fail "a read-only --save-dir was found only after training"
echo "full disk: errors, not crashes; nothing partial left; latest's failure named; read-only refused up front; lost metrics and reports are exit 1"
