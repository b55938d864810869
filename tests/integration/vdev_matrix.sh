#!/usr/bin/env bash
# Integration: urnicd comes up, serves and stops cleanly on each virtual PMD
# it supports besides af_packet: net_tap (kernel pings it), a net_memif pair
# (two services resolve and ping each other), net_ring and net_null (come
# up; null's flood of zero frames is counted, not fatal). Everything it
# starts or creates is removed on exit, pass or fail.
# usage: vdev_matrix.sh URNICD URNICCTL
set -euo pipefail
URNICD=$1
URNICCTL=$2
PY=/usr/bin/python3
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }

id=$$
TMP=$(mktemp -d /tmp/urnic-vdev.XXXXXX)
NS=urnic-vd-$id
PIDS=()
pass=0
fail=0

stop_pid() {  # stop_pid PID: TERM, then KILL after 5 s; returns its status
  local p=$1 rc=0
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || rc=$?
  return $rc
}
cleanup() {
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && stop_pid "$p" || true; done
  ip netns del "$NS" 2>/dev/null || true
  ip netns del "$NS-p" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

ok() { echo "ok   - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1"; fail=$((fail + 1)); }

start() {  # start NAME [NETNS] -- urnicd args...; sets LAST_PID
  local name=$1 ns=$2
  shift 3
  local pre=()
  [ -n "$ns" ] && pre=(ip netns exec "$ns")
  "${pre[@]}" "$URNICD" -o "control.socket=$TMP/$name.sock" \
    -o "eal.file_prefix=urnic-vd-$name-$id" -o stats.period_ms=0 "$@" \
    >"$TMP/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
  for _ in $(seq 100); do
    "$URNICCTL" -s "$TMP/$name.sock" version >/dev/null 2>&1 && return 0
    kill -0 "$LAST_PID" 2>/dev/null || break
    sleep 0.2
  done
  echo "urnicd ($name) did not come up:"; sed 's/^/    /' "$TMP/$name.log"
  return 1
}
json() {  # json NAME PYTHON-EXPR-ON-j
  "$URNICCTL" -s "$TMP/$1.sock" stats --json |
    $PY -c "import json,sys; j=json.load(sys.stdin); print($2)"
}
wait_json() {  # wait_json NAME EXPR: until EXPR is True (5 s)
  for _ in $(seq 50); do
    [ "$(json "$1" "$2")" = True ] && return 0
    sleep 0.1
  done
  return 1
}
stop() {  # stop NAME PID
  if stop_pid "$2" && grep -q 'urnicd: stopped' "$TMP/$1.log"; then
    ok "$1: clean exit on SIGTERM"
  else
    bad "$1: exit on SIGTERM"; tail -n 5 "$TMP/$1.log"
  fi
}

# --- net_tap: the kernel side of the tap pings the service -----------------
ip netns add "$NS"
ip -n "$NS" link set lo up
TAP=utap$id
if start tap "$NS" -- -o "port.vdev=net_tap0,iface=$TAP" -o port.ipv4=10.78.0.1/24; then
  ok "tap: up ($(json tap "j['port']['driver']"))"
  ip -n "$NS" addr add 10.78.0.2/24 dev "$TAP"
  ip -n "$NS" link set "$TAP" up
  if ip netns exec "$NS" ping -c 3 -i 0.2 -W 2 10.78.0.1 >"$TMP/tap.ping" 2>&1; then
    ok "tap: kernel ping answered"
  else
    bad "tap: kernel ping"; cat "$TMP/tap.ping"
  fi
  stop tap "$LAST_PID"
else
  bad "tap: start"
fi

# --- net_memif pair: two services resolve and ping each other ---------------
# The shipped example pair, as a user would start it (sockets and prefixes
# moved to this test's own).
SRC=$(cd "$(dirname "$0")/../.." && pwd)
MS=$TMP/memif.sock
memif_vdev() { sed -n 's/^ *vdev: "\(.*\)"/\1/p' "$SRC/config/examples/$1" | sed "s|socket=[^,]*|socket=$MS|"; }
if start memA "" -- -c "$SRC/config/examples/memif-a.yaml" \
     -o "port.vdev=$(memif_vdev memif-a.yaml)" -o eal.memory_mb=128; then
  A=$LAST_PID
  if start memB "" -- -c "$SRC/config/examples/memif-b.yaml" \
       -o "port.vdev=$(memif_vdev memif-b.yaml)" -o eal.memory_mb=128; then
    B=$LAST_PID
    wait_json memA "j['port']['link_up']" && ok "memif: link up" || bad "memif: link up"
    "$URNICCTL" -s "$TMP/memA.sock" ping 10.88.0.2 >/dev/null
    if wait_json memA "j['totals']['icmp_echo_reply_rx'] >= 1 and j['totals']['neigh_resolved'] >= 1"; then
      ok "memif: A resolved B by ARP and got an echo reply"
    else
      bad "memif: A -> B"; json memA "j['totals']"
    fi
    "$URNICCTL" -s "$TMP/memB.sock" ping 10.88.0.1 >/dev/null
    if wait_json memB "j['totals']['icmp_echo_reply_rx'] >= 1"; then
      ok "memif: B -> A echo reply"
    else
      bad "memif: B -> A"; json memB "j['totals']"
    fi
    stop memB "$B"
  else
    bad "memif: start B"
  fi
  stop memA "$A"
else
  bad "memif: start A"
fi

# --- net_ring and net_null: come up, survive what they deliver, stop --------
for vd in ring null; do
  if start "$vd" "" -- -o "port.vdev=net_${vd}0" -o port.ipv4=10.79.0.1/24 \
       -o eal.memory_mb=128; then
    sleep 1
    if [ "$(json "$vd" "j['port']['link_up']")" = True ]; then
      ok "$vd: up, link up"
    else
      bad "$vd: link"
    fi
    [ "$vd" = null ] && echo "     null delivered $(json null "j['totals']['rx_packets']") frames, counted as not_for_us=$(json null "j['totals']['not_for_us']") malformed=$(json null "j['totals']['malformed']")"
    stop "$vd" "$LAST_PID"
  else
    bad "$vd: start"
  fi
done

# --- two workers, two af_packet queues (kernel fanout spreads flows) -------
# On a 2-CPU machine both workers share CPU 1 through an explicit --lcores.
ip link add "mq${id}s" netns "$NS" type veth peer name "mq${id}p" netns "$NS"
ip -n "$NS" link set "mq${id}s" up
ip netns add "$NS-p"
ip -n "$NS" link set "mq${id}p" netns "$NS-p"
ip -n "$NS-p" addr add 10.77.0.2/24 dev "mq${id}p"
ip -n "$NS-p" link set "mq${id}p" up
if start mq "$NS" -- -o "port.vdev=net_af_packet0,iface=mq${id}s,qpairs=2" \
     -o 'eal.extra_args=["--lcores=0@0,1@1,2@1"]' -o 'eal.workers=[1,2]'; then
  grep -q 'queues 2 (spread by the PMD)' "$TMP/mq.log" &&
    ok "multi-queue: 2 queues on 2 workers" || { bad "multi-queue: start-up line"; head -3 "$TMP/mq.log"; }
  ip netns exec "$NS-p" ping -c 3 -i 0.2 -W 2 10.77.0.1 >/dev/null &&
    ok "multi-queue: ping answered" || bad "multi-queue: ping"
  ip netns exec "$NS-p" $PY -c "
from scapy.all import IP, UDP, Raw, send, conf
conf.verb = 0
for sp in range(64):
    send(IP(dst='10.77.0.1') / UDP(sport=20000 + sp, dport=9) / Raw(b'x'))
"
  if wait_json mq "len(j['lcores']) == 2 and all(l['rx_packets'] > 0 for l in j['lcores']) and j['totals']['non_roce_ignored'] >= 64"; then
    ok "multi-queue: both workers received ($(json mq "[l['rx_packets'] for l in j['lcores']]"))"
  else
    bad "multi-queue: spread"; json mq "[(l['lcore'], l['rx_packets']) for l in j['lcores']]"
  fi
  stop mq "$LAST_PID"
else
  bad "multi-queue: start"
fi
ip netns del "$NS-p" 2>/dev/null || true

# --- a pool too small for the rings is refused with a clear error ----------
if "$URNICD" -o port.vdev=net_ring0 -o port.ipv4=10.79.0.1/24 \
     -o mempool.mbufs=1023 -o mempool.cache=0 -o "control.socket=$TMP/small.sock" \
     -o "eal.file_prefix=urnic-vd-small-$id" >"$TMP/small.log" 2>&1; then
  bad "small mempool accepted"
elif grep -q 'mempool.mbufs 1023 is too small' "$TMP/small.log"; then
  ok "small mempool refused: $(grep -o 'mempool.mbufs.*' "$TMP/small.log")"
else
  bad "small mempool: unexpected error"; cat "$TMP/small.log"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
