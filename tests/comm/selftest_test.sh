#!/usr/bin/env bash
# zero-comm-selftest, the tool that checks a setup: it passes on odd rank
# counts and sizes; a --size past what a host holds is a usage error (it
# wrapped to 0 elements and "passed" before); ranks given other --size end
# at once with one line each, not in Open MPI's crash of mismatched
# collectives; ZERO_COMM_BACKEND=single under mpirun -np 2 is refused.
# usage: selftest_test.sh MPIEXEC ZERO_COMM_SELFTEST WORK
set -u
mpiexec=$1 tool=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/../support/expect.sh"  # fail, expect_fail
run() { timeout 120 "$mpiexec" --oversubscribe --bind-to none "$@"; }

run -np 3 "$tool" --size 7 --iters 2 >"$work/three.log" 2>&1 || { cat "$work/three.log"; fail "3 ranks, --size 7"; }
grep -q "all checks passed" "$work/three.log" || { cat "$work/three.log"; fail "3 ranks did not pass"; }

for size in 17179869184G 99999999999G 18446744073709551617; do
  "$tool" --size $size --iters 1 >"$work/big.log" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q -- "--size $size is more elements than a host holds" "$work/big.log" \
    || { cat "$work/big.log"; fail "--size $size: exit $rc"; }
done

run -np 1 "$tool" --size 1K --iters 2 : -np 1 "$tool" --size 2K --iters 2 >"$work/differ.log" 2>&1; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$work/differ.log"; fail "ranks with different --size: exit $rc"; }
grep -q "rank 1: --size 2048 --iters 2): give every rank the same arguments" "$work/differ.log" \
  || { cat "$work/differ.log"; fail "ranks with different --size were not named"; }
grep -q "double free" "$work/differ.log" && fail "the mismatched collectives ran"

ZERO_COMM_BACKEND=single run -np 2 "$tool" --size 1K --iters 1 >"$work/single.log" 2>&1 \
  && { cat "$work/single.log"; fail "ZERO_COMM_BACKEND=single under mpirun -np 2 passed"; }
grep -q "ZERO_COMM_BACKEND=single, but the launcher started this process as one of 2 (OMPI_COMM_WORLD_SIZE=2)" \
  "$work/single.log" || { cat "$work/single.log"; fail "single under mpirun -np 2 was not named"; }
grep -q "all checks passed" "$work/single.log" && fail "single under mpirun -np 2 passed a check"
echo "zero-comm-selftest: 3 ranks pass; a huge --size, ranks' different sizes and single under mpirun are refused"
rm -rf "$work"
