#!/usr/bin/env bash
# Every shipped config passes `urnicd --check-config`; every broken config
# in tests/config-bad fails with exit 2 and its expected message.
# usage: check_config.sh URNICD SOURCE_DIR
set -uo pipefail
URNICD=$1
SRC=$2
pass=0
fail=0
for f in "$SRC"/config/urnicd.yaml "$SRC"/config/examples/*.yaml; do
  if out=$("$URNICD" -c "$f" --check-config 2>&1); then
    pass=$((pass + 1))
  else
    echo "FAIL - $f: $out"; fail=$((fail + 1))
  fi
done
for f in "$SRC"/tests/config-bad/*.yaml; do
  expect=$(sed -n 's/^# expect: //p' "$f" | head -1)
  out=$("$URNICD" -c "$f" --check-config 2>&1)
  rc=$?
  if [ $rc = 2 ] && [[ "$out" == *"$expect"* ]]; then
    pass=$((pass + 1))
  else
    echo "FAIL - $f: rc=$rc, want message containing '$expect', got: $out"
    fail=$((fail + 1))
  fi
done
# The embedded default and an override error.
"$URNICD" --check-config >/dev/null && pass=$((pass + 1)) || { echo "FAIL - embedded"; fail=$((fail + 1)); }
out=$("$URNICD" --check-config -o port.mtu=99 2>&1)
if [ $? = 2 ] && [[ "$out" == *"port.mtu"* ]]; then pass=$((pass + 1)); else echo "FAIL - override: $out"; fail=$((fail + 1)); fi
# What only the host can tell, refused at start before DPDK (exit 1) and
# naming the key: an account the host lacks, an lcore that is no CPU this
# process may run on, a control.socket path holding someone's file (left
# as it was).
TMPD=$(mktemp -d /tmp/urnic-cc.XXXXXX)
trap 'rm -rf "$TMPD"' EXIT
host_check() {  # host_check NAME EXPECT [urnicd -o options]
  local name=$1 expect=$2 out rc
  shift 2
  out=$(timeout 30 "$URNICD" -o "control.socket=$TMPD/c.sock" "$@" 2>&1)
  rc=$?
  if [ $rc = 1 ] && [[ "$out" == *"$expect"* ]]; then
    pass=$((pass + 1))
  else
    echo "FAIL - $name: rc=$rc, want 1 and '$expect', got: $out"
    fail=$((fail + 1))
  fi
}
host_check "unknown user" 'control.allow_users: no user "no-such-user-urnic"' \
  -o 'control.allow_users=[no-such-user-urnic]'
cpu=$(/usr/bin/python3 -c 'import os; a = os.sched_getaffinity(0); print(next((c for c in range(1, 128) if c not in a), ""))')
if [ -n "$cpu" ]; then
  host_check "lcore $cpu" "eal.workers: lcore $cpu is no CPU urnicd may run on" \
    -o "eal.workers=[$cpu]"
fi
echo precious >"$TMPD/file"
host_check "socket path is a file" "exists and is not a socket" \
  -o "control.socket=$TMPD/file"
if [ "$(cat "$TMPD/file")" = precious ]; then pass=$((pass + 1)); else
  echo "FAIL - the file at control.socket was changed"; fail=$((fail + 1)); fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
