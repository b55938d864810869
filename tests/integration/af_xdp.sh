#!/usr/bin/env bash
# Integration: urnicd on net_af_xdp (an AF_XDP socket on a kernel
# interface), two services on the two ends of a veth pair in one network
# namespace. net_af_xdp transmits one buffer per frame (no MULTI_SEGS): a
# payload chained after the header mbuf (zero-copy TX) left with the first
# segment's bytes in its place, and the peer counted every such frame as an
# ICRC error. So:
#  - each service says zero-copy TX is off, and why;
#  - urnic-perf WRITE, READ and SEND, 64 KiB, 4 QPs, every message's data
#    checked (--verify), both ends exit 0;
#  - neither service counted a malformed frame, and RoCE frames crossed;
#  - idle, a worker waits on its AF_XDP socket (no timed sleep).
# SKIP when the kernel, the container or DPDK cannot give urnicd an AF_XDP
# socket (the reason from urnicd's log is printed).
# Every started process is stopped by PID on exit, pass or fail.
# usage: af_xdp.sh URNICD URNICCTL SHIM_SO URNIC_PERF
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
shim_test_init xdp-$$ "$@"

NS=urnic-xdp-$$
ip netns add "$NS"
NETNS+=("$NS")
ip -n "$NS" link set lo up
ip -n "$NS" link add xa type veth peer name xb
ip -n "$NS" link set xa up
ip -n "$NS" link set xb up
SA=$TMP/a.sock
SB=$TMP/b.sock
# No port.mac: the PMD cannot set one; the interface's own is used.
for side in a b; do
  if [ $side = a ]; then ip=10.86.0.1 s=$SA ifc=xa; else ip=10.86.0.2 s=$SB ifc=xb; fi
  IN_NS=$NS urnicd_start $side $ip "$s" -o "port.vdev=net_af_xdp0,iface=$ifc"
  if ! wait_sock "$s"; then
    # net_af_xdp's own probe failures (DPDK 22.11's messages): the kernel,
    # the container or libbpf gave no socket. Anything else fails.
    if grep -qE 'Failed to (create xsk socket|configure xdp socket|init internals|create umem|probe)' \
      "$TMP/urnicd-$side.log"; then
      echo "SKIP: no AF_XDP socket here:"
      grep -iE 'xdp|xsk|bpf|fail' "$TMP/urnicd-$side.log" | head -5
      exit 77
    fi
    cat "$TMP/urnicd-$side.log"
    exit 1
  fi
done
check "both services up on net_af_xdp, links up" wait_link "$SA"
check "  on both services" wait_link "$SB"
no_zc() {  # the service's log: zero-copy TX off, for want of MULTI_SEGS
  grep -q "zero-copy TX off: net_af_xdp cannot transmit chained mbufs" \
    "$TMP/urnicd-$1.log"
}
check "zero-copy TX is off, and the log says why (A)" no_zc a
check "  (B)" no_zc b

ON_A=(ip netns exec "$NS" env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)
ON_B=(ip netns exec "$NS" env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)
port=19300
run() {  # run OP: a verified 4-QP run over the veth; both ends exit 0
  port=$((port + 1))
  "${ON_A[@]}" timeout 90 "$UPERF" --server -p "$port" --period 0 --verify \
    >"$TMP/$1-s.out" 2>&1 &
  local sp=$! rc=0
  PIDS+=("$sp")
  sleep 0.5
  "${ON_B[@]}" timeout 90 "$UPERF" -p "$port" -o "$1" -q 4 -s 65536 -D 1 \
    --warmup 0 --period 0 --verify 127.0.0.1 >"$TMP/$1-c.out" 2>&1 || rc=$?
  wait "$sp" || rc=$((rc ? rc : $?))
  [ "$rc" = 0 ] || tail -n 3 "$TMP/$1-s.out" "$TMP/$1-c.out"
  return $rc
}
m0=$(($(counter "$SA" malformed) + $(counter "$SB" malformed)))
r0=$(counter "$SA" roce_rx)
for op in write read send; do
  check "urnic-perf $op 64 KiB x 4 QPs, data verified, both exit 0" run $op
done
clean() {  # no malformed frame at either end; RoCE frames reached A
  local m r
  m=$(($(counter "$SA" malformed) + $(counter "$SB" malformed)))
  r=$(counter "$SA" roce_rx)
  echo "  malformed $((m - m0)), A's roce_rx +$((r - r0))"
  [ "$m" = "$m0" ] && [ "$r" -gt $((r0 + 1000)) ]
}
check "  no malformed frame at either service, RoCE frames crossed" clean
idle() {  # idle, the worker waits on its AF_XDP socket: no timed sleep in 2 s
  local s0 w0 s1 w1
  s0=$(counter "$SA" idle_sleeps) w0=$(counter "$SA" idle_waits)
  sleep 2
  s1=$(counter "$SA" idle_sleeps) w1=$(counter "$SA" idle_waits)
  echo "  idle_sleeps $s0 -> $s1, idle_waits $w0 -> $w1"
  [ "$s1" = "$s0" ] && [ "$w1" -gt "$w0" ]
}
check "idle, A's worker waits for its socket (wake.h), no timed sleep" idle

finish
