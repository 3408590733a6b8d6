# Shell helpers for the tool tests (sourced):
#   fail MESSAGE...               print FAIL and exit 1
#   expect_fail LOG REGEX CMD...  CMD exits non-zero and its output matches REGEX (grep -E)
fail() { echo "FAIL: $*"; exit 1; }
expect_fail() {
  local log=$1 regex=$2
  shift 2
  "$@" >"$log" 2>&1 && { cat "$log"; fail "exited 0: $*"; }
  grep -qE -- "$regex" "$log" || { cat "$log"; fail "no '$regex' from: $*"; }
}
