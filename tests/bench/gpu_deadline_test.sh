#!/usr/bin/env bash
# bench/gpu's deadline (ZERO_GPU_DEADLINE), on the CPU: run_part shortens a
# part's timeout to the time left before the deadline, skips a part that
# would start with too little time (its log says so, and the report shows it
# skipped), passes over a part not in ZERO_GPU_PARTS, and leaves the timeout
# alone without a deadline. A device call is cut off at its limit: this is
# what lets bench/gpu hand back its report inside one call.
set -euo pipefail
root=$1 python=$2
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
stamp=t parts=all report_reserve_s=0 min_part_s=5
# shellcheck source=../../bench/gpu_parts.sh
source "$root/bench/gpu_parts.sh"

# report_with_variant DIR STAMP PART OLD_MS NEW_MS VARIANT: DIR's report after
# PART's log is copied as VARIANT's (a part run at another value), its step
# OLD_MS made NEW_MS.
report_with_variant() {
  sed "s/\"step_ms\":$4/\"step_ms\":$5/" "$1/$3-$2.log" >"$1/$6-$2.log"
  "$python" "$root/bench/gpu_report.py" --dir "$1" --stamp "$2" --out "$1/gpu.json"
}

# No deadline: the part's own timeout (a 1 s part at 60 s runs whole).
deadline=0 t_start=$(date +%s)
out=$(run_part cpp-engine 60 bash -c 'sleep 1; echo "{\"bench\": \"x\", \"sizes\": []}"')
[[ $out != *"gets"* ]] || fail "no deadline, yet the timeout was shortened: $out"
grep -q '"bench"' "$results/cpp-engine-t.log" || fail "the part's JSON line is not in its log"

# 8 s left: a part asking 60 s gets 8 and is cut off there.
deadline=100 t_start=$(($(date +%s) - 92))
begin=$(date +%s)
out=$(run_part cpp-engine-offload-dpu 60 sleep 30)
took=$(($(date +%s) - begin))
[[ $out == *"gets 8s of its 60s"* || $out == *"gets 7s of its 60s"* ]] || fail "the timeout was not shortened to the time left: $out"
[[ $out == *"cut off by its"* ]] || fail "the shortened part was not reported cut off: $out"
((took <= 12)) || fail "the part ran ${took}s, past the deadline"

# 3 s left, 5 s the least a part may start with: not run, and said so in its log.
deadline=100 t_start=$(($(date +%s) - 97))
out=$(run_part deepspeed-offload 240 sleep 30)
[[ $out == *"deepspeed-offload not run"*"ZERO_GPU_DEADLINE=100s"* ]] || fail "a part with too little time left was not skipped: $out"
grep -q '"skipped": "not run: ' "$results/deepspeed-offload-t.log" || fail "the skipped part's log lacks its reason"

# A part not in ZERO_GPU_PARTS: passed over, no log.
parts=python-plain deadline=0
out=$(run_part fsdp2-offload 60 sleep 30)
[[ $out == "(fsdp2-offload: not in ZERO_GPU_PARTS)" ]] || fail "a part outside ZERO_GPU_PARTS: $out"
[[ ! -e $results/fsdp2-offload-t.log ]] || fail "a part outside ZERO_GPU_PARTS left a log"

# ctest's share: the time left, capped by ZERO_GPU_TEST_LIMIT when set.
deadline=100 t_start=$(date +%s)
limit=$(gpu_test_limit); ((limit >= 99 && limit <= 100)) || fail "ctest without a cap should get the time left, got $limit"
limit=$(ZERO_GPU_TEST_LIMIT=20 gpu_test_limit); ((limit == 20)) || fail "ZERO_GPU_TEST_LIMIT=20 gave ctest $limit s"
deadline=100 t_start=$(($(date +%s) - 90))
limit=$(ZERO_GPU_TEST_LIMIT=20 gpu_test_limit); ((limit <= 10)) || fail "a cap above the time left gave ctest $limit s"

# A device seen: gtest's own skips in the verbose log are not ctest's.
# (The lines of the H200's run: GTEST_SKIP's "file:line: Skipped" and the
# summary's "[  SKIPPED ]" of cases that skip where a device is seen.)
printf '%s\n' '160: /work/main/tests/cuda/cuda_host_test.cpp:74: Skipped' \
  '160: [  SKIPPED ] CudaHost.WithoutADeviceCudaFailuresAreZeroErrors (0 ms)' \
  '1/3 Test #160: cuda_host_test ...................   Passed    0.53 sec' >"$results/ctest.log"
! ctest_skipped "$results/ctest.log" || fail "gtest's [  SKIPPED ] read as ctest's Skipped"
echo '2/3 Test #161: cuda_test ........................***Skipped   0.50 sec' >>"$results/ctest.log"
ctest_skipped "$results/ctest.log" || fail "ctest's ***Skipped not seen"
echo '3/3 Test #162: engine_cuda_test .................***Not Run   0.00 sec' >"$results/ctest.log"
ctest_skipped "$results/ctest.log" || fail "ctest's ***Not Run not seen"

report=$("$python" "$root/bench/gpu_report.py" --dir "$results" --stamp t --out "$results/gpu.json")
grep -qF "deepspeed-offload: skipped: not run: " <<<"$report" || fail "the report does not show the skipped part: $report"
grep -qF "cpp-engine-offload-dpu: cut off" <<<"$report" || fail "the report does not show the cut-off part: $report"
# ZERO_GPU_OFFLOAD_RATIO: a ratio or a list of them, each in (0, 1].
[[ "$(share_ratios 0.6,0.8 | tr '\n' ' ')" == "0.6 0.8 " ]] || fail "share_ratios 0.6,0.8: $(share_ratios 0.6,0.8)"
[[ "$(share_ratios 1 | tr '\n' ' ')" == "1 " && "$(share_ratios .5)" == ".5" ]] || fail "share_ratios 1 / .5"
for bad in 0 0.0 1.5 abc 0.6,2; do
  ! share_ratios "$bad" >/dev/null 2>&1 || fail "share_ratios accepted '$bad'"
done
# keep_share_log: each ratio's log under its own name.
echo '{"skipped": "x"}' >"$results/cpp-engine-offload-share-t.log"
keep_share_log 0.6
[[ -e $results/cpp-engine-offload-share-r0.6-t.log && ! -e $results/cpp-engine-offload-share-t.log ]] ||
  fail "keep_share_log did not move the log to its ratio's name"

# The report over the H200's own logs (2026-11-28): one row per Twin-Flow
# ratio, in ratio order, each against plain PyTorch of the same run.
fixture=$root/tests/bench/fixtures/h200-20261128
real=$(mktemp -d)
trap 'rm -rf "$results" "$real"' EXIT
cp "$fixture"/*.log "$real/"
sed 's/"step_ms":665.97693/"step_ms":700.0/' "$fixture/cpp-engine-offload-share-r0.7-20261128-143738.log" \
  >"$real/cpp-engine-offload-share-r0.85-20261128-143738.log"
report=$("$python" "$root/bench/gpu_report.py" --dir "$real" --stamp 20261128-143738 --out "$real/gpu.json")
grep -qE "^40x3072 +4535.4 plain PyTorch +574.1 +399 +1.000" <<<"$report" || fail "plain PyTorch's row: $report"
grep -qE "^40x3072 +4535.4 zerocpp Z2 \+ offload \+ DPU +889.0 +258 +0.646" <<<"$report" || fail "the DPU row: $report"
grep -qE "^40x3072 +4535.4 zerocpp Z2 \+ offload \+ DPU, ratio 0.7 +666.0 +344 +0.862" <<<"$report" ||
  fail "the ratio 0.7 row: $report"
grep -qE "ratio 0.85 +700.0 " <<<"$report" || fail "the ratio 0.85 row: $report"
[[ $(grep -n "ratio 0.7 " <<<"$report" | cut -d: -f1) -lt $(grep -n "ratio 0.85 " <<<"$report" | cut -d: -f1) ]] ||
  fail "the ratios are not in order: $report"
grep -qE "^40x3072 +4535.4 DeepSpeed Z2 \+ CPU offload +2755.7 +83 +0.208" <<<"$report" || fail "DeepSpeed's row: $report"
! grep -q "ratio<1" <<<"$report" || fail "the single-ratio row shown beside the per-ratio rows: $report"
# The second H200 session's logs (2026-11-28, 19:26): no Python part ran, so
# the device and torch come from bench/gpu's own record of the machine.
second=$(mktemp -d)
trap 'rm -rf "$results" "$real" "$second"' EXIT
cp "$root"/tests/bench/fixtures/h200-20261128-b/* "$second/"
report=$("$python" "$root/bench/gpu_report.py" --dir "$second" --stamp 20261128-192601 --out "$second/gpu.json")
grep -qF "device: NVIDIA H200   torch: 2.11.0+cu130" <<<"$report" || fail "the machine's record unused: $report"
grep -qE "^40x3072 +4535.4 zerocpp Z3 \+ offload_param \+ DPU +1233.5 +186 +- +3.3 +77.0" <<<"$report" ||
  fail "the stage 3 row: $report"
grep -qE "ratio 0.6 +681.8 " <<<"$report" && grep -qE "ratio 0.8 +746.1 " <<<"$report" || fail "the ratio rows: $report"
# ZERO_GPU_STAGE3_PREFETCH: one row per value beside the default's.
report=$(report_with_variant "$second" 20261128-192601 cpp-engine-stage3-param 1233.498142 1100.0 \
  cpp-engine-stage3-param-p120000000)
grep -qE "^40x3072 +4535.4 zerocpp Z3 \+ offload_param \+ DPU, prefetch 120000000 +1100.0 " <<<"$report" ||
  fail "the prefetch row: $report"
grep -qE "^40x3072 +4535.4 zerocpp Z3 \+ offload_param \+ DPU +1233.5 " <<<"$report" || fail "the default's row: $report"
rm "$second/machine-20261128-192601.json"
report=$("$python" "$root/bench/gpu_report.py" --dir "$second" --stamp 20261128-192601 --out "$second/gpu.json")
grep -qF "device: ?   torch: ?" <<<"$report" || fail "a missing machine record should show '?': $report"
# The third H200 session's logs (2026-11-28, 21:42): every offload loop and
# peer in one run at 1.21B, with DeepSpeed's step over each (x DS).
third=$(mktemp -d)
trap 'rm -rf "$results" "$real" "$second" "$third"' EXIT
cp "$root"/tests/bench/fixtures/h200-20261128-c/* "$third/"
report=$("$python" "$root/bench/gpu_report.py" --dir "$third" --stamp 20261128-214257 --out "$third/gpu.json")
for row in "plain PyTorch +171.8 +361 +1.000 +18.8 +- +4.61" \
  "zerocpp Z2 \+ CPU offload +390.0 +159 +0.441 +6.8 +16.8 +2.03" \
  "zerocpp Z2 \+ offload \+ DPU +261.3 +237 +0.657 +6.8 +19.0 +3.03" \
  "zerocpp Z3 \+ offload_param \+ DPU +718.1 +86 +0.239 +1.8 +21.2 +1.10" \
  "zerocpp Z2 \+ offload \+ DPU, ratio 0.7 +182.0 +341 +0.944 +10.2 +13.6 +4.35" \
  "DeepSpeed Z2 \+ CPU offload +792.3 +78 +0.217 +4.5 +30.7 +1.00" \
  "FSDP2 \+ CPUOffloadPolicy +2161.8 +29 +0.079 +1.7 +20.0 +0.37"; do
  grep -qE "^24x2048 +1211.2 $row\$" <<<"$report" || fail "the 1.21B row '$row': $report"
done
# cpp-engine-share-published (publish_in_backward): a row per ratio of its own.
report=$(report_with_variant "$third" 20261128-214257 cpp-engine-offload-share-r0.7 181.96158200000002 160.0 \
  cpp-engine-share-published-r0.7)
grep -qE "^24x2048 +1211.2 zerocpp Z2 \+ offload \+ DPU, ratio 0.7, in backward +160.0 .* 4.95\$" <<<"$report" ||
  fail "the publish_in_backward row: $report"
grep -qE "^24x2048 +1211.2 zerocpp Z2 \+ offload \+ DPU, ratio 0.7 +182.0 " <<<"$report" || fail "the share row beside it: $report"
# No DeepSpeed row for a size: x DS is "-" (the 19:26 logs ran no DeepSpeed).
report=$("$python" "$root/bench/gpu_report.py" --dir "$second" --stamp 20261128-192601 --out "$second/gpu.json")
grep -qE "^40x3072 +4535.4 zerocpp Z3 \+ offload_param \+ DPU +1233.5 .* -\$" <<<"$report" ||
  fail "x DS without a DeepSpeed row: $report"
echo "gpu deadline: ok"
