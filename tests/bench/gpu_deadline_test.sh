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
echo "gpu deadline: ok"
