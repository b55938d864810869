#!/usr/bin/env bash
# Integration: a jumbo MTU on net_memif. DPDK 22.11's memif reports a
# 1518 B frame and cannot set an MTU, but carries any frame that fits one of
# its buffers (devarg bsize); urnicd gives it buffers that hold a frame of
# port.mtu (frames split over buffers are broken in that PMD: port.cc).
#  - two services, port.mtu 9000, no bsize given: both take MTU 9000, the
#    RoCE path MTU is 4096;
#  - ibv_rc_pingpong and ibv_ud_pingpong at 4096 (buffers validated),
#    urnic-perf WRITE, READ and SEND on 4 QPs with every byte checked;
#  - no frame arrives twice: what each port received is at most what the
#    other sent;
#  - a bsize too small for port.mtu keeps the MTU within it, and says so.
# Every started process is stopped by PID on exit, pass or fail.
# usage: memif_mtu.sh URNICD URNICCTL SHIM_SO URNIC_PERF
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
shim_test_init "mtu-$$" "$@"
for p in ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong; do
  command -v "$p" >/dev/null || { echo "SKIP: $p not installed (ibverbs-utils)"; exit 77; }
done

SA=$TMP/a.sock
SB=$TMP/b.sock
JUMBO=(-o port.mtu=9000 -o mempool.data_room=9300)
memif_start server 02:00:00:00:96:01 10.96.0.1 "$SA" "${JUMBO[@]}"
memif_start client 02:00:00:00:96:02 10.96.0.2 "$SB" "${JUMBO[@]}"
check "the memif pair's links are up" wait_link "$SA"
check "  on both services" wait_link "$SB"
check "both ports take MTU 9000 (buffers of 9088 B)" \
  test "$(grep -c '^urnicd: port MTU 9000 on net_memif (frames fit its 9088 B' \
    "$TMP/urnicd-server.log" "$TMP/urnicd-client.log" | awk -F: '{s += $2} END {print s}')" = 2

# shellcheck disable=SC2206
ON_A=(env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)
# shellcheck disable=SC2206
ON_B=(env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)
active_mtu() {  # active_mtu SOCK
  env $CLIENT_ENV URNIC_SOCKET="$1" LD_PRELOAD="$PRELOAD" ibv_devinfo -v 2>/dev/null |
    sed -n 's/.*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p' | head -1
}
check "the RoCE path MTU is 4096 (ibv_devinfo active_mtu)" test "$(active_mtu "$SA")" = 4096

port=18800
# pair NAME CMD ARGS...: the server (SERVER_ARG after CMD, if set) on A,
# the client on B (127.0.0.1 for the exchange); both must exit 0.
pair() {
  local name=$1 cmd=$2 rs=0 rc=0 sp
  shift 2
  port=$((port + 1))
  # shellcheck disable=SC2086
  "${ON_A[@]}" timeout 60 "$cmd" ${SERVER_ARG:-} "$@" -p $port >"$TMP/$name-s.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  sleep 1
  "${ON_B[@]}" timeout 60 "$cmd" "$@" -p $port 127.0.0.1 >"$TMP/$name-c.out" 2>&1 || rc=$?
  wait "$sp" || rs=$?
  [ $rs = 0 ] && [ $rc = 0 ] || {
    echo "  $name: server exit $rs, client exit $rc"
    tail -3 "$TMP/$name-s.out" "$TMP/$name-c.out"
    return 1
  }
}
uperf_pair() {
  local name=$1
  shift
  SERVER_ARG=--server pair "$name" "$UPERF" "$@"
}
check "ibv_rc_pingpong, 16 KiB messages in 4 KiB packets, buffers validated" \
  pair rc ibv_rc_pingpong -g 0 -m 4096 -s 16384 -n 200 -c
check "ibv_ud_pingpong, 4096 B datagrams, buffers validated" \
  pair ud ibv_ud_pingpong -g 0 -s 4096 -n 200 -c
for op in write read send; do
  check "urnic-perf $op 64 KiB on 4 QPs, every byte checked" \
    uperf_pair "up-$op" -o $op -s 65536 -q 4 -n 100 --period 0 --verify
done
check "  ... in 4096 B packets (urnic-perf's MTU)" grep -q ", mtu 4096, verified" "$TMP/up-write-c.out"

# A frame split over memif buffers was received many times (DPDK 22.11):
# each port received at most what the other sent.
rx_a=$(counter "$SA" rx_packets)
tx_b=$(counter "$SB" tx_packets)
rx_b=$(counter "$SB" rx_packets)
tx_a=$(counter "$SA" tx_packets)
echo "  A received $rx_a of B's $tx_b frames; B received $rx_b of A's $tx_a"
check "no frame received twice (A rx <= B tx, B rx <= A tx)" \
  test "$rx_a" -le "$tx_b" -a "$rx_b" -le "$tx_a" -a "$rx_a" -gt 1000

# A spec's own bsize bounds the MTU: 4096 B buffers hold a 4078 B MTU,
# whose RoCE path MTU is 2048. (A server alone: its link stays down.)
log_says() {  # log_says FILE PATTERN: within 10 s
  for _ in $(seq 100); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  return 1
}
SC=$TMP/c.sock
urnicd_start small 10.96.1.1 "$SC" "${JUMBO[@]}" \
  -o "port.vdev=net_memif0,role=server,socket=$TMP/m2.sock,id=0,bsize=4096,mac=02:00:00:00:96:03"
check "a spec's own bsize=4096 keeps port.mtu 9000 to 4078, and says so" \
  log_says "$TMP/urnicd-small.log" '^urnicd: port MTU 4078 on net_memif (frames fit its 4096 B'
wait_sock "$SC" || true
check "  ... whose path MTU is 2048" test "$(active_mtu "$SC")" = 2048

finish
