# bench/gpu_parts.sh: how bench/gpu runs one benchmark part, sourced by it
# (and by tests/bench/gpu_deadline_test.sh, which checks it on the CPU).
#
# The caller sets:
#   t_start   the run's start (date +%s)
#   results   the folder of the logs; stamp: the run's time stamp
#   parts     "all" or ",name,name," of ZERO_GPU_PARTS
#   deadline  seconds after t_start by which the run must have written its
#             report (ZERO_GPU_DEADLINE; 0: none). A device call is cut off at
#             its limit, with what was written so far: with a deadline the run
#             shortens a part's timeout to the time left and skips a part that
#             would not get min_part_s, so the report always comes back.
#   report_reserve_s, min_part_s (defaults 30 and 45)

# Seconds left for parts before the deadline (the report's reserve kept);
# a large number when there is no deadline.
gpu_time_left() {
  if ((${deadline:-0} <= 0)); then echo 1000000; return; fi
  echo $((deadline - ($(date +%s) - t_start) - ${report_reserve_s:-30}))
}

# Seconds ctest -L cuda may take: the time left, and at most
# ZERO_GPU_TEST_LIMIT when that is set, so that the benchmarks keep their
# share of one device call.
gpu_test_limit() {
  local left cap=${ZERO_GPU_TEST_LIMIT:-0}
  left=$(gpu_time_left)
  ((left >= 1)) || left=1
  if ((cap > 0 && cap < left)); then echo "$cap"; else echo "$left"; fi
}

# ctest_skipped LOG: ctest reported a test Skipped or Not Run (no device
# visible). Only ctest's own result lines count: the verbose log also holds
# gtest's "[  SKIPPED ]" lines of cases that skip by design.
ctest_skipped() {
  grep -qE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*(Skipped|Not Run)' "$1"
}

# share_ratios LIST: ZERO_GPU_OFFLOAD_RATIO's ratios ("0.7", "0.6,0.8"), one
# per line; a value outside (0, 1] stops the run before anything is built.
share_ratios() {
  local r
  for r in ${1//,/ }; do
    if ! [[ $r =~ ^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]]; then
      echo "bench/gpu: ZERO_GPU_OFFLOAD_RATIO: '$r' is not a ratio in (0, 1] (a list: 0.6,0.8)" >&2
      return 1
    fi
    echo "$r"
  done
}

# keep_share_log R: cpp-engine-offload-share's log of ratio R under a name of
# its own (cpp-engine-offload-share-rR-STAMP.log), one row each in the report.
keep_share_log() {
  local log=$results/cpp-engine-offload-share-$stamp.log
  [[ -e $log ]] && mv "$log" "$results/cpp-engine-offload-share-r$1-$stamp.log"
  return 0
}

# run_part NAME TIMEOUT_S COMMAND...: stdout and stderr to $results/NAME-$stamp.log
# (and, but for JSON lines, to the terminal). A failure is reported, not
# fatal. A part not in ZERO_GPU_PARTS is passed over; one that would start
# with less than min_part_s left writes a {"skipped": ...} line in its log,
# which the report shows as skipped, with why.
run_part() {
  local name=$1 limit=$2 rc=0 left
  shift 2
  if [[ $parts != all && ",$parts," != *",$name,"* ]]; then echo "($name: not in ZERO_GPU_PARTS)"; return 0; fi
  left=$(gpu_time_left)
  if ((left < ${min_part_s:-45})); then
    echo "bench/gpu: $name not run: ${left}s left before ZERO_GPU_DEADLINE=${deadline}s"
    printf '{"skipped": "not run: %ss left before ZERO_GPU_DEADLINE=%ss"}\n' "$left" "$deadline" \
      >"$results/$name-$stamp.log"
    return 0
  fi
  if ((left < limit)); then
    echo "bench/gpu: $name gets ${left}s of its ${limit}s (ZERO_GPU_DEADLINE=${deadline}s)"
    limit=$left
  fi
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$results/$name-$stamp.log" | { grep -v '^{' || true; } || rc=${PIPESTATUS[0]}
  case $rc in
    0) ;;
    124|137) echo "bench/gpu: $name cut off by its ${limit}s timeout; the sizes it finished are kept" ;;
    *) echo "bench/gpu: $name exited with status $rc" ;;
  esac
  return 0
}
