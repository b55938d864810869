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
echo "$pass passed, $fail failed"
[ $fail = 0 ]
