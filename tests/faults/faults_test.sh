#!/usr/bin/env bash
# Faults on 4 ranks (docs/reliability.md): each case plants one fault with
# fault_driver and checks that the job ends as it must — exit status, within
# how long, the one error line and what it names, the flight-recorder files.
#   faults_test.sh MPIEXEC FAULT_DRIVER [CASE...]
set -u
MPIEXEC=$1
DRIVER=$2
shift 2
CASES=${*:-"none stop kill sleep mismatch count_mismatch kind_mismatch unit_order_same unit_order_differ nan_skip nan_stop backward_throw nvme_read_fail nvme_read_retry"}
TIMEOUT=5  # comm_timeout of the driver, seconds
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
failures=0
work=$(mktemp -d)
export TMPDIR=$work  # (nvme_read_fail: its swap folder)
tag=faults-$$
trap 'pkill -CONT -f "$DRIVER --tag $tag" 2>/dev/null; pkill -9 -f "$DRIVER --tag $tag" 2>/dev/null; rm -rf "$work"' EXIT

fail() {
  echo "FAIL [$case]: $*"
  echo "---- output ----"
  cat "$work/$case.log"
  echo "----------------"
  failures=$((failures + 1))
}

# run CASE EXPECT(ok|error|killed) MAX_SECONDS -- driver args...
run() {
  case=$1 expect=$2 max=$3
  shift 4
  export ZERO_FLIGHT_RECORDER_DIR="$work/$case.fr"
  local start=$(date +%s)
  timeout 150 "$MPIEXEC" -np 4 --bind-to none "$DRIVER" --tag $tag "$@" >"$work/$case.log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  # A stopped rank may outlive mpirun: end it before the next case.
  pkill -CONT -f "$DRIVER --tag $tag" 2>/dev/null
  pkill -9 -f "$DRIVER --tag $tag" 2>/dev/null
  if [ "$expect" = ok ]; then
    [ $rc -eq 0 ] || fail "exit status $rc, expected 0"
  elif [ "$expect" = killed ]; then
    # The launcher ends the job and names the rank; nobody is left to print.
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit status $rc (124: hung), expected a failure"
  else
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit status $rc (124: hung), expected a failure"
    local n
    n=$(grep -c "error on rank" "$work/$case.log")
    [ "$n" -eq 1 ] || fail "the error was printed $n times, expected once"
  fi
  [ $took -le "$max" ] || fail "took ${took}s, more than ${max}s"
  echo "[$case] exit $rc after ${took}s"
}

expect_line() {  # expect_line REGEX WHAT
  grep -qE "$1" "$work/$case.log" || fail "no line names $2 (regex: $1)"
}

expect_recorder() {  # expect_recorder RANK
  local f="$work/$case.fr/flight-recorder-rank-$(printf %05d "$1").txt"
  [ -s "$f" ] || { fail "no flight recorder $f"; return; }
  grep -qE "^  #[0-9]+ " "$f" || fail "flight recorder $f lists no op"
}

for c in $CASES; do
  case $c in
    none)
      run none ok 120 -- --inject none --steps 4 --timeout $TIMEOUT
      expect_line "trained 4 steps, skipped 0" "the finished run" ;;
    stop)
      # A stopped rank answers nothing: the others time out and name it.
      run stop error $((TIMEOUT + 30)) -- --inject stop --rank 3 --step 3 --timeout $TIMEOUT
      expect_line "error on rank [0-2] of 4: collective #[0-9]+, [a-z_]+ .*did not complete within comm_timeout = 5 s" "the timed-out op and its number"
      expect_line "bytes sent per rank" "the byte count"
      expect_line "rank 3 has not joined it; rank 3 does not answer" "the stopped rank"
      expect_line "Flight recorder: .*flight-recorder-rank-0000[0-2].txt" "the flight-recorder file"
      expect_recorder 0 ;;
    kill)
      run kill killed 30 -- --inject kill --rank 2 --step 3 --timeout 60
      expect_line "rank 2 .*exited on signal 9" "the killed rank" ;;
    sleep)
      # Alive but elsewhere: its watchdog answers, so the error says so.
      run sleep error $((TIMEOUT + 30)) -- --inject sleep --rank 1 --step 2 --timeout $TIMEOUT
      expect_line "rank 1 has not joined it; rank 1 has issued [0-9]+ ops, its last #[0-9]+ .*it is alive but has not reached this op" "the rank that is alive but busy"
      expect_recorder 0 ;;
    mismatch)
      run mismatch error 60 -- --inject mismatch --rank 2 --step 3 --timeout $TIMEOUT
      expect_line "collective-sequence check failed: the ranks' collective sequences diverge at op #[0-9]+: ranks 0, 1, 3 issued all_reduce sum fp32 x 4; rank 2 issued all_reduce max fp32 x 4" "the divergent op and each side"
      expect_recorder 2 ;;
    count_mismatch)
      # MPI fails the op (truncation) on the ranks that receive too much:
      # an error naming the divergence, not MPI's abort of the job.
      run count_mismatch error 60 -- --inject count-mismatch --rank 2 --step 3 --timeout $TIMEOUT
      expect_line "error on rank [0-3] of 4: collective-sequence check failed: the ranks' collective sequences diverge at op #[0-9]+: ranks? [0-9, ]*issued all_reduce sum fp32 x 4; rank 2 issued all_reduce sum fp32 x 8 .*found when collective #[0-9]+ failed on rank [0-3] \\(MPI all_reduce" "the op that failed and how the ranks differ"
      if grep -q "MPI_ERRORS_ARE_FATAL" "$work/$case.log"; then fail "MPI aborted the job itself"; fi ;;
    kind_mismatch)
      # One rank in an all-gather where the others are in an all-reduce: on
      # one MPI communicator MPI matched the two (and wrote past the smaller
      # buffer); on one per kind they wait, and the timeout names the op.
      run kind_mismatch error $((TIMEOUT + 40)) -- --inject kind-mismatch --rank 2 --step 3 --timeout $TIMEOUT
      expect_line "collective-sequence check failed: the ranks' collective sequences diverge at op #([0-9]+): ranks 0, 1, 3 issued all_reduce sum fp32 x 4; rank 2 issued all_gather fp32 x 4 per rank .*found when collective #[0-9]+ did not complete within comm_timeout" "the op of the other kind and each side"
      # The op that did not complete is the divergent one itself (matched
      # with the other kind, it completed and the next one hung).
      ops=$(grep -oE "diverge at op #[0-9]+|found when collective #[0-9]+" "$work/$case.log" | head -2 | grep -oE "[0-9]+" | tr '\n' ' ')
      set -- $ops
      [ $# = 2 ] && [ "$1" = "$2" ] || fail "the divergent op and the op that did not complete differ: $ops"
      expect_recorder 2 ;;
    unit_order_same)
      # Stage 3, one rank calls two units of the same size in the other
      # order: MPI completes the swapped gathers; only their tags tell.
      run unit_order_same error $((TIMEOUT + 40)) -- --inject unit-order --unit-sizes same --rank 1 --step 2 --timeout $TIMEOUT
      expect_line "collective-sequence check failed: the ranks' collective sequences diverge at op #[0-9]+: ranks? [0-9, ]*issued all_gather fp32 x [0-9]+ per rank, tag 2; rank 1 issued all_gather fp32 x [0-9]+ per rank, tag 1 .*at stage 3, units called in another order" "the swapped units' gathers"
      expect_recorder 1 ;;
    unit_order_differ)
      run unit_order_differ error $((TIMEOUT + 40)) -- --inject unit-order --unit-sizes differ --rank 1 --step 2 --timeout $TIMEOUT
      expect_line "collective-sequence check failed: the ranks' collective sequences diverge at op #[0-9]+: ranks? [0-9, ]*issued all_gather fp32 x 96 per rank, tag 2; rank 1 issued all_gather fp32 x 160 per rank, tag 1" "the swapped units' gathers"
      if grep -q "MPI_ERRORS_ARE_FATAL" "$work/$case.log"; then fail "MPI aborted the job itself"; fi ;;
    nan_skip)
      run nan_skip ok 120 -- --inject nan --rank 2 --step 3 --steps 5 --timeout $TIMEOUT
      expect_line "step 3 skipped: the gradient norm is not finite .*1 step\(s\) skipped so far, 1 in a row" "the skipped step"
      expect_line "trained 5 steps, skipped 1" "the run that went on"
      [ "$(grep -c 'step 3 skipped' "$work/$case.log")" -eq 1 ] || fail "the skip was reported more than once" ;;
    nan_stop)
      run nan_stop error 60 -- --inject nan --rank 2 --step 3 --steps 5 --timeout $TIMEOUT --policy stop --stop-after 1
      expect_line "error on rank 0 of 4: step 3: the gradient norm was not finite \(NaN or inf\) in 1 consecutive step" "the step that stopped the run" ;;
    backward_throw)
      # Stage 3: one rank's backward fails between its units while the
      # others go on into the next unit's gather: its own error, at once
      # (well inside comm_timeout), not the others' timeout.
      run backward_throw error $((TIMEOUT + 25)) -- --inject backward-throw --rank 2 --step 2 --steps 4 --timeout 60
      expect_line "error on rank 2 of 4: fault_driver: this rank's backward failed \(planted\)" "the failing rank's own error"
      if grep -q "did not complete within" "$work/$case.log"; then fail "the others timed out instead"; fi ;;
    nvme_read_fail)
      # Stage 3, parameters on NVMe: one rank's swap-file reads fail from
      # one backward on. Where the read fails first (a unit fetched ahead),
      # that rank must not go on without the gather the others issued: its
      # I/O error ends the job at once, not the others' timeout.
      run nvme_read_fail error $((TIMEOUT + 25)) -- --inject nvme-read-fail --rank 1 --step 3 --steps 5 --timeout 60
      expect_line "error on rank 1 of 4: .*NVMe swap file '.*zerocpp-params-rank1.swap': reading [0-9]+ bytes at offset [0-9]+ failed: Input/output error" "the failing rank's read error"
      if grep -q "did not complete within" "$work/$case.log"; then fail "the others timed out instead"; fi ;;
    nvme_read_retry)
      # Alone (no collective), a unit whose read fails while it is fetched
      # ahead is read again by its own gather: the run trains on, to the
      # same weights as a run whose reads all succeed.
      case=nvme_read_retry
      : >"$work/$case.log"
      for r in -1 0; do
        ZERO_COMM_BACKEND=single timeout 60 "$DRIVER" --tag $tag --inject nvme-read-fail --rank $r --step 3 --steps 5 \
          >"$work/$case.$r.log" 2>&1
        rc=$?
        cat "$work/$case.$r.log" >>"$work/$case.log"
        [ $rc -eq 0 ] || fail "exit status $rc with --rank $r"
      done
      clean=$(grep "^trained" "$work/$case.-1.log") failed_once=$(grep "^trained" "$work/$case.0.log")
      [ -n "$clean" ] && [ "$clean" = "$failed_once" ] || fail "a read that failed once changed the weights: '$clean' vs '$failed_once'"
      echo "[$case] $failed_once" ;;
    *)
      echo "unknown case $c"; exit 2 ;;
  esac
done
[ $failures -eq 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "all fault cases passed"
