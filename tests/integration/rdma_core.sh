#!/usr/bin/env bash
# Integration: rdma-core's own test suite (the pyverbs tests Debian ships
# with python3-pyverbs in /usr/share/doc/rdma-core/tests, the suite
# rdma-core's providers are held to) against one urnicd through the shim,
# unmodified: every test passes or skips for a feature urnic does not
# have (mlx5/efa-only verbs, ODP, device memory, XRC, timestamps). The
# suite's own RC/UC/UD/SRQ/atomic/MR/CQ traffic checks its data.
#  - the suite ends OK, with at least 60 tests run and passed;
#  - urnicd is still serving afterwards.
# Topology: one namespace with a veth pair, urnicd on net_af_packet over
# one end; the suite's two sides are QPs of the one device. Every started
# process is stopped by PID, the namespace deleted, on exit, pass or fail.
# usage: rdma_core.sh URNICD URNICCTL SHIM_SO
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
ID=rc-$$
URNICD=$1
URNICCTL=$2
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
SUITE=/usr/share/doc/rdma-core/tests
/usr/bin/python3 -c "import pyverbs" 2>/dev/null ||
  { echo "SKIP: python3-pyverbs not installed"; exit 77; }
[ -f "$SUITE/run_tests.py" ] ||
  { echo "SKIP: $SUITE missing (python3-pyverbs without its docs)"; exit 77; }
shim_preload "$(realpath "$3")"
lib_init

cp -r "$SUITE" "$TMP/tests"
gunzip -f "$TMP"/tests/*.gz 2>/dev/null || true

NS=urnic-$ID
ip netns add "$NS"
NETNS+=("$NS")
ip link add "rc$$a" netns "$NS" type veth peer name "rc$$b" netns "$NS"
for i in lo "rc$$a" "rc$$b"; do ip -n "$NS" link set "$i" up; done
SOCK=$TMP/s.sock
afp_start a "$NS" "rc$$a" 10.99.0.1 "$SOCK"
check "urnicd serves" wait_link "$SOCK"

# The suite takes a second or two; 300 s bounds a hang.
run_suite() {
  local rc=0
  ip netns exec "$NS" timeout 300 env $CLIENT_ENV LD_PRELOAD="$PRELOAD" \
    URNIC_SOCKET="$SOCK" URNIC_POLL_YIELD=16 /usr/bin/python3 \
    "$TMP/tests/run_tests.py" --dev urnic0 --gid 0 -v >"$TMP/suite.out" 2>&1 ||
    rc=$?
  local ran ok
  ran=$(sed -n 's/^Ran \([0-9]*\) tests.*/\1/p' "$TMP/suite.out")
  ok=$(grep -c '\.\.\. ok$' "$TMP/suite.out" || true)
  echo "  rc $rc, $ran tests, $ok ok; $(tail -n 1 "$TMP/suite.out")"
  grep -E '\.\.\. (FAIL|ERROR)' "$TMP/suite.out" | head -20 || true
  [ "$rc" = 0 ] && [ "${ran:-0}" -gt 0 ] && [ "$ok" -ge 60 ] &&
    tail -n 1 "$TMP/suite.out" | grep -q '^OK'
}
check "rdma-core's tests (run_tests.py --dev urnic0) pass or skip" run_suite
check "urnicd still serves" "$URNICCTL" -s "$SOCK" stats
finish
