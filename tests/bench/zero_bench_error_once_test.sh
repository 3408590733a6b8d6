#!/usr/bin/env bash
# zero-bench's commands that run on several ranks (step, ckpt) report an
# error once, marked with the rank that raised it and naming the others that
# raised it too, and the job exits non-zero (comm/fail_job.h), instead of
# every rank printing it.
set -uo pipefail
mpiexec=$1 bench=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

check() {  # name what-the-error-says command...
  local name=$1 says=$2
  shift 2
  "$mpiexec" -np 2 --oversubscribe --bind-to none "$@" >"$dir/$name.out" 2>&1
  local rc=$?
  ((rc != 0)) || fail "$name: exit status 0"
  local n
  n=$(grep -c -- "$says" "$dir/$name.out")
  ((n == 1)) || fail "$name: the error is printed $n times:
$(cat "$dir/$name.out")"
  grep -q "zero-bench $name: error on rank [01] of 2: .*(rank [01] raised the same error)" "$dir/$name.out" ||
    fail "$name: the line does not name its rank and the other: $(cat "$dir/$name.out")"
  echo "$name: ok ($(grep -- "$says" "$dir/$name.out"))"
}

check ckpt "zero_optimization.stage=7" "$bench" ckpt --stage 7 --layers 1 --embd 32 --heads 2 --rounds 1 --dir "$dir/ckpt"
check step "n_embd" "$bench" step --layers 1 --embd 32 --heads 3 --steps 1 --warmup 0
