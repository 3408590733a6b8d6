#!/usr/bin/env bash
# Usage errors of zero-bench and zero-estimate: exit 2, before anything runs,
# with a message that names the option (docs/train.md: "Exit status"). Each
# case was a crash, a nan table with exit 0, a cut message or exit 1.
# usage: usage_errors_test.sh ZERO_BENCH ZERO_ESTIMATE MPIEXEC
set -u
bench=$1 est=$2 mpiexec=$3
status=0
expect2() {  # expect2 REGEX CMD...
  local regex=$1
  shift
  local out rc
  out=$(timeout 60 "$@" 2>&1); rc=$?
  if [ $rc != 2 ] || ! grep -qE -- "$regex" <<<"$out"; then
    echo "FAIL: exit $rc (not 2) or no '$regex' from: $*"; echo "$out" | head -5; status=1
  fi
}
expect2 "--rounds: must be >= 1, got 0" "$bench" ckpt --layers 1 --embd 32 --heads 2 --rounds 0
expect2 "--stage: must be in \[0, 3\], got 4" "$bench" ckpt --stage 4
expect2 "--heads: 3 does not divide --embd 64" "$bench" ckpt --embd 64 --heads 3
expect2 "--param-nvme: .*needs --stage 3 and --nvme-path" "$bench" ckpt --param-nvme
expect2 "--dir: .*usage_errors_test.sh is a file, not a folder" "$bench" ckpt --dir "$0/ckpt"
expect2 "--dir: is empty: give a folder" "$bench" ckpt --dir ""
expect2 "--steps: must be >= 1, got 0" "$bench" step --steps 0
expect2 "--warmup: must be >= 0, got -1" "$bench" step --warmup -1
expect2 "--micro: must be >= 1, got 0" "$bench" step --micro 0
expect2 "--nvme-path: Directory does not exist" "$bench" step --nvme-path /nonexistent/x
expect2 "--n: counts must be >= 1, got '0'" "$bench" adam --n 0
expect2 "--n: '-5' is not a count" "$bench" adam --n -5
expect2 "--iters: must be >= 1, got 0" "$bench" adam --iters 0
expect2 "--matmul: 'abc' is not a positive matrix size" "$bench" fit-plain --matmul abc
expect2 "--stage: must be in \[0, 3\], got 5" "$bench" fit-plain --optimizer engine --stage 5
expect2 "--offload must be none or cpu, not 'nvme'" "$bench" fit-plain --optimizer engine --stage 2 --offload nvme
expect2 "--timeline .*: the folder /nonexistent/dir does not exist" "$bench" fit-plain --timeline /nonexistent/dir/tl
expect2 "unknown command 'nosuch': use adam, step, fit-plain or ckpt" "$bench" nosuch
expect2 "'--bogus' before a command" "$bench" --bogus
expect2 "zero-bench adam measures one process, and 2 are on this node" \
  "$mpiexec" -np 2 --oversubscribe --bind-to none "$bench" adam --n 1000
expect2 "--world: must be in \[1, 1048576\], got 0" "$est" --world 0
expect2 "--precision must be bf16, fp16 or fp32, got 'fp8'" "$est" --precision fp8
expect2 "--params '80G' is not a parameter count" "$est" --params 80G
expect2 "--device-mem '80G' is not a byte size" "$est" --device-mem 80G
[ $status = 0 ] && echo "usage errors: exit 2 with the option named, for all $(grep -c '^expect2 ' "$0") cases"
exit $status
