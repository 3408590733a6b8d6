#!/usr/bin/env bash
# bench/gpu-bundle --check on a bundle made of stand-in files (one per piece
# --list names): complete passes; a missing piece, a changed file and a file
# outside the MANIFEST each fail with a message naming it and the fix.
set -euo pipefail
script=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
b=$dir/gpu-bundle
mkdir -p "$b/debs" "$b/wheels"
while read -r kind name; do
  if [[ $kind == deb ]]; then echo "$name" >"$b/debs/${name}_1.0_amd64.deb"
  else echo "$name" >"$b/wheels/${name//-/_}-1.0-py3-none-any.whl"; fi
done < <("$script" --list)
(cd "$b" && find debs wheels -type f | sort | xargs sha256sum >MANIFEST)

fail() { echo "FAIL: $*" >&2; exit 1; }
expect_fail() {  # pattern: --check must fail and say it
  local out
  if out=$("$script" --check "$b" 2>&1); then fail "--check passed, expected: $1"; fi
  grep -q -- "$1" <<<"$out" || fail "expected '$1' in: $out"
}

"$script" --check "$b" | grep -q "is complete" || fail "a complete bundle was refused"
[[ $("$script" --list | grep -c .) -ge 3 ]] || fail "--list names too few pieces"

mv "$b/debs/libhwy-dev_1.0_amd64.deb" "$dir/"
expect_fail "missing libhwy-dev (Debian package).*apt-get download libhwy-dev"
mv "$dir/libhwy-dev_1.0_amd64.deb" "$b/debs/"

mv "$b"/wheels/deepspeed-*.whl "$dir/"
expect_fail "missing the DeepSpeed .* wheel"
mv "$dir"/deepspeed-*.whl "$b/wheels/"

mv "$b"/wheels/pydantic_core-*.whl "$dir/"
expect_fail "missing the pydantic-core wheel.*pip download"
mv "$dir"/pydantic_core-*.whl "$b/wheels/"

echo changed >>"$b/wheels/hjson-1.0-py3-none-any.whl"
expect_fail "differ from its MANIFEST"
echo hjson >"$b/wheels/hjson-1.0-py3-none-any.whl"

echo extra >"$b/wheels/extra-1.0-py3-none-any.whl"
expect_fail "extra-1.0-py3-none-any.whl is not in the MANIFEST"
rm "$b/wheels/extra-1.0-py3-none-any.whl"

rm "$b/MANIFEST"
expect_fail "MANIFEST is missing"
b=$dir/nowhere
expect_fail "no bundle at"
echo "gpu-bundle --check: all cases behave"
