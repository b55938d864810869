#!/usr/bin/env bash
# Integration: a jumbo MTU on the virtual ports whose DPDK 22.11 PMDs report
# a 1518 B frame and refuse any MTU above 1500 (ethdev checks it against
# that), though they carry any frame that fits their buffers: net_memif
# (devarg bsize) and net_af_packet (its kernel ring's framesz). urnicd
# sizes those buffers for port.mtu (memif corrupts frames split over
# buffers, dataplane/NOTES.md) and, on af_packet, raises the kernel
# interface's MTU as the PMD's own mtu_set would.
#  - two services, port.mtu 9000, no buffer size given: both take MTU
#    9000, the RoCE path MTU is 4096;
#  - ibv_rc_pingpong and ibv_ud_pingpong at 4096 (buffers validated),
#    urnic-perf WRITE, READ and SEND on 4 QPs with every byte checked;
#  - no frame arrives twice: the RoCE frames each service received are at
#    most what the other sent;
#  - a buffer size of the spec's own bounds the MTU, and urnicd says so.
# TOPO memif: a memif pair; af_packet: two namespaces joined by a veth
# pair, kernel addresses for the programs' TCP exchange. Every started
# process is stopped by PID, every namespace deleted, on exit, pass or
# fail.
# usage: jumbo_mtu.sh URNICD URNICCTL SHIM_SO URNIC_PERF [memif|af_packet]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
TOPO=${5:-memif}
shim_test_init "mtu-$$" "$1" "$2" "$3" "$4"
for p in ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong; do
  command -v "$p" >/dev/null || { echo "SKIP: $p not installed (ibverbs-utils)"; exit 77; }
done

SA=$TMP/a.sock
SB=$TMP/b.sock
# memif needs mbufs of MTU + 146 B (no RX scatter), af_packet of its ring
# frame + 96 (9216 B frames for MTU 9000).
JUMBO=(-o port.mtu=9000 -o mempool.data_room=9400)
NSA=() NSB=() HOST=127.0.0.1
case $TOPO in
  memif)
    memif_start server 02:00:00:00:96:01 10.96.0.1 "$SA" "${JUMBO[@]}"
    memif_start client 02:00:00:00:96:02 10.96.0.2 "$SB" "${JUMBO[@]}"
    LOG_A=$TMP/urnicd-server.log LOG_B=$TMP/urnicd-client.log ;;
  af_packet)
    veth_pair
    ip -n "$NS_A" addr add 10.96.0.11/24 dev "$IF_A"
    ip -n "$NS_B" addr add 10.96.0.12/24 dev "$IF_B"
    afp_start a "$NS_A" "$IF_A" 10.96.0.1 "$SA" "${JUMBO[@]}" -o port.mac=02:00:00:00:96:01
    afp_start b "$NS_B" "$IF_B" 10.96.0.2 "$SB" "${JUMBO[@]}" -o port.mac=02:00:00:00:96:02
    NSA=(ip netns exec "$NS_A") NSB=(ip netns exec "$NS_B") HOST=10.96.0.11
    LOG_A=$TMP/urnicd-a.log LOG_B=$TMP/urnicd-b.log ;;
  *) echo "jumbo_mtu.sh: TOPO is memif or af_packet, not $TOPO"; exit 2 ;;
esac
check "the links are up" wait_link "$SA"
check "  on both services" wait_link "$SB"
check "both ports take MTU 9000" \
  test "$(cat "$LOG_A" "$LOG_B" | grep -c "^urnicd: port MTU 9000 on net_$TOPO (")" = 2
if [ "$TOPO" = af_packet ]; then
  check "  ... in 9216 B ring frames, four to a 36 KiB block" \
    grep -q "frame its buffers hold: framesz=9216,blocksz=36864,framecnt=908;" "$LOG_A"
  check "  ... and the kernel interfaces' MTU is raised to 9000" \
    test "$(ip -n "$NS_A" -o link show "$IF_A" | grep -o 'mtu [0-9]*')" = "mtu 9000"
fi

# shellcheck disable=SC2206
ON_A=("${NSA[@]}" env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)
# shellcheck disable=SC2206
ON_B=("${NSB[@]}" env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)
active_mtu() {  # active_mtu SOCK
  # shellcheck disable=SC2086
  env $CLIENT_ENV URNIC_SOCKET="$1" LD_PRELOAD="$PRELOAD" ibv_devinfo -v 2>/dev/null |
    sed -n 's/.*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p' | head -1
}
check "the RoCE path MTU is 4096 (ibv_devinfo active_mtu)" test "$(active_mtu "$SA")" = 4096

port=18800
# pair NAME CMD ARGS...: the server (SERVER_ARG after CMD, if set) on A,
# the client on B ($HOST for the exchange); both must exit 0.
pair() {
  local name=$1 cmd=$2 rs=0 rc=0 sp
  shift 2
  port=$((port + 1))
  # shellcheck disable=SC2086
  "${ON_A[@]}" timeout 60 "$cmd" ${SERVER_ARG:-} "$@" -p $port >"$TMP/$name-s.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  wait_tcp "$port" "${NS_A:-}" "$sp" || true  # (NS_A: af_packet's namespaces)
  "${ON_B[@]}" timeout 60 "$cmd" "$@" -p $port "$HOST" >"$TMP/$name-c.out" 2>&1 || rc=$?
  wait "$sp" || rs=$?
  [ $rs = 0 ] && [ $rc = 0 ] || {
    echo "  $name: server exit $rs, client exit $rc"
    tail -n 3 "$TMP/$name-s.out" "$TMP/$name-c.out"
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
# each service received at most the RoCE frames the other sent.
rx_a=$(counter "$SA" roce_rx)
tx_b=$(counter "$SB" tx_packets)
rx_b=$(counter "$SB" roce_rx)
tx_a=$(counter "$SA" tx_packets)
echo "  A received $rx_a RoCE frames of B's $tx_b frames; B received $rx_b of A's $tx_a"
check "no frame received twice (A rx <= B tx, B rx <= A tx)" \
  test "$rx_a" -le "$tx_b" -a "$rx_b" -le "$tx_a" -a "$rx_a" -gt 1000

# A buffer size of the spec's own bounds the MTU: 4096 B memif buffers or
# af_packet ring frames hold a 4078 / 4026 B MTU, whose RoCE path MTU is
# 2048. (A memif server alone; an af_packet service on a third veth.)
log_says() {  # log_says FILE PATTERN: within 10 s
  for _ in $(seq 100); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  return 1
}
SC=$TMP/c.sock
if [ "$TOPO" = memif ]; then
  urnicd_start small 10.96.1.1 "$SC" "${JUMBO[@]}" \
    -o "port.vdev=net_memif0,role=server,socket=$TMP/m2.sock,id=0,bsize=4096,mac=02:00:00:00:96:03"
  want=4078
else
  ip link add "u$$c" netns "$NS_A" type veth peer name "u$$d" netns "$NS_B"
  ip -n "$NS_A" link set "u$$c" up
  IN_NS=$NS_A urnicd_start small 10.96.1.1 "$SC" "${JUMBO[@]}" \
    -o "port.vdev=net_af_packet0,iface=u$$c,framesz=4096,blocksz=4096" -o port.mac=02:00:00:00:96:03
  want=4026
fi
check "a spec's own buffer size (4096) keeps port.mtu 9000 to $want, and says so" \
  log_says "$TMP/urnicd-small.log" "^urnicd: port MTU $want on net_$TOPO ("
wait_sock "$SC" || true
check "  ... whose path MTU is 2048" test "$(active_mtu "$SC")" = 2048

finish
