#!/usr/bin/env bash
# The installed zerocpp, used as a downstream project would: `cmake --install`
# the build into a fresh prefix, configure examples/ against that prefix only
# (find_package(zerocpp)), build both examples, and run each on 2 MPI ranks:
# their loss must fall (each exits non-zero otherwise).
#   install_examples_test.sh SOURCE_DIR BUILD_DIR [FLAGS]
# FLAGS: compile and link flags for the examples (a sanitizer build's).
set -euo pipefail
src=$1 build=$2 flags=${3:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$dir/prefix" >"$dir/install.log" || { cat "$dir/install.log"; fail "cmake --install"; }
cfg=$dir/prefix/lib/cmake/zerocpp/zerocppConfig.cmake
[[ -f $cfg && -f $dir/prefix/lib/cmake/zerocpp/zerocppConfigVersion.cmake ]] || fail "no package config in the prefix"
[[ -f $dir/prefix/include/zero/engine/engine.h ]] || fail "headers missing"
# Every tool the README names is installed, and runs from the prefix (its
# LibTorch found without the build tree's environment).
for tool in zero-train zero-estimate zero-bench zero-ckpt zero-comm-selftest; do
  [[ -x $dir/prefix/bin/$tool ]] || fail "$tool is not installed in \$prefix/bin"
  (cd / && env -u LD_LIBRARY_PATH "$dir/prefix/bin/$tool" --help >/dev/null 2>&1) || fail "installed $tool --help failed"
done
# The installed package must not point back into the build tree.
if grep -rqF -- "$build" "$dir/prefix/lib/cmake/zerocpp"; then fail "the package config refers to the build tree $build"; fi
# Nor name a library file of this machine in its targets (LibTorch's libc10.so
# by path would be linked beside a project's own LibTorch): imported targets
# only, found again by the config.
if grep -nE '"/|;/' "$dir"/prefix/lib/cmake/zerocpp/zerocppTargets.cmake | grep -v '_IMPORT_PREFIX STREQUAL'; then
  fail "zerocppTargets.cmake names absolute paths (above)"
fi
# The version: the header's, the library's (tools' --version) and the package's agree.
version=$(sed -n 's/^#define ZERO_VERSION_STRING "\(.*\)"$/\1/p' "$dir/prefix/include/zero/version.h")
[[ -n $version ]] || fail "zero/version.h has no ZERO_VERSION_STRING"
grep -qF "set(PACKAGE_VERSION \"$version\")" "$dir/prefix/lib/cmake/zerocpp/zerocppConfigVersion.cmake" \
  || fail "zerocppConfigVersion.cmake is not version $version"
for tool in zero-train zero-estimate zero-bench zero-ckpt; do
  got=$("$dir/prefix/bin/$tool" --version 2>&1) || fail "$tool --version failed: $got"
  [[ $got == "$tool (zerocpp $version)" ]] || fail "$tool --version says '$got', not version $version"
done
# find_package(zerocpp QUIET) where a dependency is missing (Highway: no
# pkg-config file found) is a package not found, not a failed configure.
mkdir -p "$dir/optional"
printf '%s\n' 'cmake_minimum_required(VERSION 3.25)' 'project(optional LANGUAGES CXX)' \
  'find_package(zerocpp 0.1 QUIET)' 'message(STATUS "zerocpp_FOUND=${zerocpp_FOUND}")' >"$dir/optional/CMakeLists.txt"
out=$(PKG_CONFIG_LIBDIR=$dir/empty PKG_CONFIG_PATH= cmake -S "$dir/optional" -B "$dir/optional/build" \
        -DCMAKE_PREFIX_PATH="$dir/prefix" 2>&1) || { echo "$out"; fail "find_package(zerocpp QUIET) without Highway failed the configure"; }
grep -q "zerocpp_FOUND=0" <<<"$out" || { echo "$out"; fail "find_package(zerocpp QUIET) without Highway did not say not found"; }

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src/examples" -B "$dir/examples" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$dir/prefix" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
      >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; fail "configure"; }
cmake --build "$dir/examples" >"$dir/build.log" 2>&1 || { tail -40 "$dir/build.log"; fail "build"; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for ex in image_classifier frozen_mlp_regression; do
  out=$(mpirun -np 2 --oversubscribe --bind-to none "$dir/examples/$ex" 2>&1) || { echo "$out"; fail "$ex on 2 ranks"; }
  echo "$out" | tail -3
  grep -q "on 2 rank(s)" <<<"$out" || fail "$ex did not run on 2 ranks"
  grep -q "^the loss fell" <<<"$out" || fail "$ex: the loss did not fall"
done
# The frozen layer under a half-precision config (cast, not trained): the
# example's own settings in bf16, at stage 2 with the CPU offload.
printf '%s' '{"train_micro_batch_size_per_gpu": 64, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
  "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}' >"$dir/bf16.json"
out=$(mpirun -np 2 --oversubscribe --bind-to none "$dir/examples/frozen_mlp_regression" "$dir/bf16.json" 2>&1) \
  || { echo "$out"; fail "frozen_mlp_regression with a bf16 config"; }
grep -q "frozen layer unchanged" <<<"$out" || { echo "$out"; fail "frozen_mlp_regression: bf16 called the frozen layer changed"; }
# The installed tools as a user runs them: zero-train from the prefix, away
# from the source tree, saves a checkpoint that the installed zero-ckpt reads.
out=$(cd / && mpirun -np 2 --oversubscribe --bind-to none "$dir/prefix/bin/zero-train" --steps 3 --save-every 3 --eval-every 0 \
        --out "$dir/run" --save-dir "$dir/ckpt" 2>&1) || { echo "$out"; fail "the installed zero-train on 2 ranks"; }
[[ -s $dir/run/metrics.jsonl ]] || { echo "$out"; fail "the installed zero-train wrote no metrics.jsonl"; }
out=$(cd / && "$dir/prefix/bin/zero-ckpt" inspect "$dir/ckpt" 2>&1) || { echo "$out"; fail "the installed zero-ckpt inspect"; }
grep -q "^  step 3 (optimizer step 3)" <<<"$out" || { echo "$out"; fail "zero-ckpt inspect does not show step 3"; }
echo "install + examples: ok"
