#!/usr/bin/env bash
# zero-bench's commands that run on several ranks (step, ckpt) report an
# error once, marked with the rank that raised it (and naming the others
# that raised the same one), and the job exits non-zero (comm/fail_job.h), instead of
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
  # (The same error on both ranks names the other; where one rank's error
  # names the rank it is raised for, as the host-memory check's does, the
  # job's one line is that rank's.)
  grep -qE "zero-bench $name: error on rank [01] of 2: .*(\(rank [01] raised the same error\)|$says)" "$dir/$name.out" ||
    fail "$name: the line does not name its rank: $(cat "$dir/$name.out")"
  echo "$name: ok ($(grep -- "$says" "$dir/$name.out"))"
}

# (Errors of the run, not of the command line, which are usage errors said
# before MPI starts: tests/bench/usage_errors_test.sh.) Every rank short of
# host memory; every rank's NVMe folder taken by a file.
check ckpt "host memory: the engine's buffers need" env ZERO_HOST_MEMORY_LIMIT=1K \
  "$bench" ckpt --layers 1 --embd 32 --heads 2 --rounds 1 --dir "$dir/ckpt"
mkdir -p "$dir/nvme" && touch "$dir/nvme/stage2-nvme"
check step "stage2-nvme' is a file, not a folder" "$bench" step --layers 1 --embd 32 --heads 2 --steps 1 --warmup 0 \
  --nvme-path "$dir/nvme"
