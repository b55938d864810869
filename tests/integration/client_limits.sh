#!/usr/bin/env bash
# Integration: per-client limits (config client_limits) through the verbs
# shim, on one urnicd (net_tap port; urnic-perf's two ends are two clients
# talking over the service's own GID):
#  - within the limits a verified WRITE run completes, both ends exit 0;
#  - one QP more than client_limits.max_qp: ibv_create_qp fails with
#    ENOMEM, the shim says which limit, the service counts the refusal;
#  - registering more than client_limits.max_mr_bytes fails the same way;
#  - afterwards nothing is held (the failed clients' objects are gone) and
#    a verified run completes again.
# Every started process is stopped by PID on exit, pass or fail.
# usage: client_limits.sh URNICD URNICCTL SHIM_SO URNIC_PERF
set -euo pipefail
URNICD=$1
URNICCTL=$2
SHIM=$(realpath "$3")
UPERF=$(realpath "$4")
ID=cl-$$
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
shim_preload "$SHIM"
lib_init

S=$TMP/s.sock
ON_S=(env $CLIENT_ENV URNIC_SOCKET="$S" LD_PRELOAD="$PRELOAD")
# 2 QPs and 64 MiB of registered memory per client (urnic-perf -q 2 -s 65536
# registers 16 MiB per end, -s 8388608 1 GiB).
urnicd_start svc 10.94.0.1 "$S" -o "port.vdev=net_tap0,iface=ucl$$" \
  -o client_limits.max_qp=2 -o client_limits.max_mr_bytes=67108864
wait_sock "$S"

port=18900
run() {  # run NAME SERVER_ARGS -- CLIENT_ARGS: both ends' exit status
  local name=$1
  shift
  local sargs=()
  while [ "$1" != -- ]; do sargs+=("$1"); shift; done
  shift
  port=$((port + 1))
  "${ON_S[@]}" timeout 60 "$UPERF" --server -p "$port" -D 1 --warmup 0 \
    --verify "${sargs[@]}" >"$TMP/$name-s.out" 2>&1 &
  local sp=$!
  PIDS+=("$sp")
  sleep 0.5
  local rc=0
  "${ON_S[@]}" timeout 60 "$UPERF" -p "$port" -D 1 --warmup 0 --verify \
    "$@" 127.0.0.1 >"$TMP/$name-c.out" 2>&1 || rc=$?
  wait "$sp" || rc=$((rc ? rc : $?))
  return $rc
}
refused() {  # refused NAME TEXT: the client failed, saying TEXT and ENOMEM
  if grep -q "$2" "$TMP/$1-c.out" &&
    grep -q "Cannot allocate memory" "$TMP/$1-c.out"; then
    return 0
  fi
  cat "$TMP/$1-c.out"
  return 1
}
shim() { counter "$S" "$1"; }

check "within the limits: a verified run of 2 QPs completes" \
  run ok -q 2 -s 65536 -- -q 2 -s 65536
fails() { ! "$@"; }

r0=$(shim client_limit_refusals)
check "3 QPs: the run fails" fails run qp3 -q 3 -s 65536 -- -q 3 -s 65536
check "  ibv_create_qp said ENOMEM and named client_limits.max_qp" \
  refused qp3 "client_limits.max_qp is 2"
check "  the service counted the refusal" \
  test "$(shim client_limit_refusals)" -gt "$r0"

r0=$(shim client_limit_refusals)
check "8 MiB messages: the run fails" fails run big -s 8388608 -- -s 8388608
check "  ibv_reg_mr said ENOMEM and named client_limits.max_mr_bytes" \
  refused big "client_limits.max_mr_bytes is 67108864"
check "  the service counted the refusal" \
  test "$(shim client_limit_refusals)" -gt "$r0"

gone() {  # every failed client's objects were released
  for _ in $(seq 50); do
    [ "$(shim qps)$(shim mrs)" = 00 ] && return 0
    sleep 0.1
  done
  echo "qps $(shim qps) mrs $(shim mrs)"
  return 1
}
check "nothing left held by the failed clients" gone
check "a verified run of 2 QPs completes again" \
  run again -q 2 -s 65536 -- -q 2 -s 65536

finish
