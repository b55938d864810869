#!/usr/bin/env bash
# Integration: unmodified libibverbs programs (ibverbs-utils, perftest,
# tests/shim/verbs_misuse, verbs_extended and dl_reload) run under
# LD_PRELOAD=liburnic-verbs.so against urnicd.
#  Topology A, one service: urnicd on net_af_packet on a veth end in its
#   namespace (10.79.0.1; the peer namespace holds 10.79.0.2). Both programs
#   of a pair run in the service's namespace, exchange QP numbers over TCP on
#   127.0.0.1, and their RDMA traffic goes to the service's own GID 0
#   (::ffff:10.79.0.1) and loops back inside it.
#  Topology B, two services: two namespaces joined by a veth pair, in each a
#   urnicd on net_af_packet on its veth end (10.80.0.1, 10.80.0.2) and a
#   kernel address on the same veth (10.80.0.11, 10.80.0.12) that the
#   programs use for their TCP exchange; RDMA crosses the veth.
# Also: memory rewritten while B1 may still send from it (payload_reuse:
# UD/UC send buffers reused at their completion, memory under READs), kill
# -9 of a client, then of a server, in mid-transfer (the
# survivor fails instead of hanging, both services release every object),
# the misuse program and the extended-verbs program (ibv_wr_*, ibv_cq_ex,
# events, UD AH from GRH: what perftest does not use on urnic).
# Every started process is killed by PID and every namespace deleted on
# exit, pass or fail.
# usage: verbs_shim.sh URNICD URNICCTL SHIM_SO MISUSE_BIN EXTENDED_BIN
#   REUSE_BIN (tests/shim/payload_reuse) DL_RELOAD_BIN (tests/shim/dl_reload)
#   MCAST_BIN (tests/shim/mcast_check)
set -euo pipefail
URNICD=$1
URNICCTL=$2
SHIM=$(realpath "$3")
MISUSE=$(realpath "$4")
EXTENDED=$(realpath "$5")
REUSE=$(realpath "$6")
DL_RELOAD=$(realpath "$7")
MCAST=$(realpath "$8")
PY=/usr/bin/python3

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }
for p in ibv_devices ibv_devinfo ibv_rc_pingpong ib_write_bw ib_atomic_lat; do
  command -v "$p" >/dev/null || { echo "SKIP: $p not installed (ibverbs-utils, perftest)"; exit 77; }
done
[ -f "$SHIM" ] || { echo "FAIL - shim $SHIM missing"; exit 1; }
# A sanitizer build of the shim needs its runtimes loaded first into the
# (uninstrumented) Debian binaries it is preloaded into.
PRELOAD=$SHIM
for rt in $(ldd "$SHIM" | awk '/lib(asan|ubsan)\.so/ {print $3}'); do
  PRELOAD="$rt $PRELOAD"
done
if [ "$PRELOAD" != "$SHIM" ]; then
  # perftest and the pingpongs do not free everything at exit; that is
  # theirs, not the shim's. verify_asan_link_order: the runtime comes by
  # LD_PRELOAD, not first in the link order of the Debian binaries.
  CLIENT_ASAN=ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0
else
  CLIENT_ASAN=URNIC_PLAIN_BUILD=1  # a no-op assignment for env
fi

id=$$
NS_A=urnic-vs-a-$id      # topology A: the service and both programs
NS_AP=urnic-vs-ap-$id    # topology A: the kernel peer (ARP)
NS_B1=urnic-vs-b1-$id    # topology B: service 1, the servers
NS_B2=urnic-vs-b2-$id    # topology B: service 2, the clients
TMP=$(mktemp -d /tmp/urnic-vs.XXXXXX)
PIDS=()
pass=0
fail=0
t_start=$SECONDS

stop_pid() {  # stop_pid PID: TERM (timeout(1) passes it on), KILL after 5 s
  local p=$1 rc=0
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || rc=$?
  return $rc
}
forget() {  # forget PID...: reaped, so never signalled again (PIDs get reused)
  local p q keep=()
  for p in "${PIDS[@]}"; do
    for q in "$@"; do [ "$p" = "$q" ] && continue 2; done
    keep+=("$p")
  done
  PIDS=("${keep[@]}")
}
# Huge pages for System V memory (perftest --use_hugepages, verbs_misuse's
# SHM_HUGETLB case): 8 more free ones (16 MiB) while the test runs, given
# back by cleanup. Where the kernel cannot have them, those cases skip.
HUGE_ADDED=0
huge_free() { awk '/^HugePages_Free:/ {print $2}' /proc/meminfo; }
huge_reserve() {
  local want=8 have total
  have=$(huge_free)
  [ "${have:-0}" -ge $want ] && return 0
  total=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null) || return 0
  echo $((total + want - have)) >/proc/sys/vm/nr_hugepages 2>/dev/null || true
  HUGE_ADDED=$(($(cat /proc/sys/vm/nr_hugepages) - total))
}
huge_release() {
  [ "$HUGE_ADDED" -gt 0 ] || return 0
  local total
  total=$(cat /proc/sys/vm/nr_hugepages)
  echo $((total - HUGE_ADDED)) >/proc/sys/vm/nr_hugepages 2>/dev/null || true
  HUGE_ADDED=0
}
cleanup() {
  for p in "${PIDS[@]}"; do
    kill -0 "$p" 2>/dev/null && { stop_pid "$p" || true; }
  done
  for ns in "$NS_A" "$NS_AP" "$NS_B1" "$NS_B2"; do
    ip netns del "$ns" 2>/dev/null || true
  done
  huge_release
  rm -rf "$TMP"
}
trap cleanup EXIT
# A signal (meson's timeout, ^C) ends the script through cleanup too; the
# programs run in the background and are waited for, so this is prompt.
trap 'exit 130' INT
trap 'exit 143' TERM HUP

check() {  # check NAME COMMAND...: counted, with the seconds it took
  local name=$1 t0=$EPOCHREALTIME ok=1 us secs
  shift
  "$@" >"$TMP/out" 2>&1 || ok=0
  us=$((${EPOCHREALTIME/./} - ${t0/./}))
  secs=$((us / 1000000)).$((us / 100000 % 10))
  if [ "$ok" = 1 ]; then
    echo "ok   - $name ($secs s)"
    pass=$((pass + 1))
  else
    echo "FAIL - $name ($secs s)"
    sed 's/^/       /' "$TMP/out" | tail -40
    fail=$((fail + 1))
  fi
}

# --- namespaces ---------------------------------------------------------------
ip netns add "$NS_A"
ip netns add "$NS_AP"
ip link add "vsa${id}s" netns "$NS_A" type veth peer name "vsa${id}p" netns "$NS_AP"
ip -n "$NS_A" link set lo up
ip -n "$NS_A" link set "vsa${id}s" up
ip -n "$NS_AP" link set lo up
ip -n "$NS_AP" addr add 10.79.0.2/24 dev "vsa${id}p"
ip -n "$NS_AP" link set "vsa${id}p" up

ip netns add "$NS_B1"
ip netns add "$NS_B2"
ip link add "vsb${id}1" netns "$NS_B1" type veth peer name "vsb${id}2" netns "$NS_B2"
for n in 1 2; do
  ns=NS_B$n
  ip -n "${!ns}" link set lo up
  ip -n "${!ns}" addr add "10.80.0.1$n/24" dev "vsb${id}$n"
  ip -n "${!ns}" link set "vsb${id}$n" up
done

# --- services -----------------------------------------------------------------
SOCK_A=$TMP/a.sock
SOCK_B1=$TMP/b1.sock
SOCK_B2=$TMP/b2.sock
start_urnicd() {  # start_urnicd NAME NETNS IFACE CIDR SOCK [more urnicd args]
  local name=$1 ns=$2 ifc=$3 cidr=$4 sock=$5 p
  shift 5
  ip netns exec "$ns" "$URNICD" "$@" \
    -o "port.vdev=net_af_packet0,iface=$ifc,qpairs=1" -o "port.ipv4=$cidr" \
    -o "control.socket=$sock" -o "eal.file_prefix=urnic-vs-$name-$id" \
    -o stats.period_ms=0 >"$TMP/urnicd-$name.log" 2>&1 &
  p=$!
  PIDS+=("$p")
  eval "PID_$name=$p"
  for _ in $(seq 100); do
    "$URNICCTL" -s "$sock" version >/dev/null 2>&1 && return 0
    kill -0 "$p" 2>/dev/null || break
    sleep 0.2
  done
  echo "FAIL - urnicd $name did not come up"
  sed 's/^/       /' "$TMP/urnicd-$name.log"
  exit 1
}
# A also has an IPv6 address: its GID table then holds IPv4-mapped, IPv6
# link-local and global GIDs, which verbs_extended's UD checks walk.
start_urnicd A "$NS_A" "vsa${id}s" 10.79.0.1/24 "$SOCK_A" \
  -o port.ipv6=fd00:79::1/64
start_urnicd B1 "$NS_B1" "vsb${id}1" 10.80.0.1/24 "$SOCK_B1"
# B2 copies every payload (zero-copy TX off), B1 attaches application
# memory to its frames: topology B's verified transfers cross both paths.
start_urnicd B2 "$NS_B2" "vsb${id}2" 10.80.0.2/24 "$SOCK_B2" \
  -o transport.zero_copy_tx=false
echo "ok   - three urnicd up: $("$URNICCTL" -s "$SOCK_A" version)"

devline() { "$URNICCTL" -s "$1" objects | grep '^device:'; }
# wait_devline SOCK LINE: the service's device line becomes LINE within 10 s.
wait_devline() {
  local now
  for _ in $(seq 100); do
    now=$(devline "$1") && [ "$now" = "$2" ] && return 0
    sleep 0.1
  done
  echo "device line now:    $now"
  echo "device line before: $2"
  "$URNICCTL" -s "$1" objects
  return 1
}
BASE_A=$(devline "$SOCK_A")
BASE_B1=$(devline "$SOCK_B1")
BASE_B2=$(devline "$SOCK_B2")
roce_rx() {  # roce_rx SOCK: RoCE packets the service's port received
  "$URNICCTL" -s "$1" stats --json |
    $PY -c "import json,sys; print(json.load(sys.stdin)['totals']['roce_rx'])"
}
RX0_B1=$(roce_rx "$SOCK_B1")
RX0_B2=$(roce_rx "$SOCK_B2")

# run NETNS SOCK PROGRAM ARGS...: one verbs program under the shim, 60 s
# at most; only the program is preloaded.
run() {
  local ns=$1 sock=$2
  shift 2
  ip netns exec "$ns" timeout 60 \
    env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" URNIC_SOCKET="$sock" "$@"
}

# wait_listen NETNS PORT PID: the server listens on TCP PORT (10 s at most).
wait_listen() {
  for _ in $(seq 100); do
    ip netns exec "$1" ss -Hltn "sport = :$2" | grep -q . && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

PORT=18600
# pair TOPO KIND PROGRAM ARGS...: server in the background, client in the
# foreground, each on its own port; both must exit 0. TOPO a: both in the
# service's namespace over 127.0.0.1; b: server on service B1, client on
# service B2 connecting to 10.80.0.11. KIND perf: the client must print a
# results table (a numeric row under the "#bytes" header).
pair() {
  # perftest calibrates its cycle counter against the clock and gives up
  # ("Correlation coefficient r^2 ... Can't produce a report", exit 1) when
  # a busy host disturbs that; it says nothing about RDMA. Such a run is
  # tried once more, and the log says so.
  if pair_once "$@"; then return 0; fi
  if grep -q "Can't produce a report" "$TMP/cli.out" "$TMP/srv.out"; then
    echo "--- perftest could not calibrate its clock (busy host): once more"
    pair_once "$@"
    return
  fi
  return 1
}
pair_once() {
  local topo=$1 kind=$2 srv_ns srv_sock cli_ns cli_sock host spid cpid src=0 crc=0
  shift 2
  PORT=$((PORT + 1))
  if [ "$topo" = a ]; then
    srv_ns=$NS_A srv_sock=$SOCK_A cli_ns=$NS_A cli_sock=$SOCK_A host=127.0.0.1
  else
    srv_ns=$NS_B1 srv_sock=$SOCK_B1 cli_ns=$NS_B2 cli_sock=$SOCK_B2
    host=10.80.0.11
  fi
  # Not through run() (a function: & would fork a subshell): $! must be
  # the process itself (ip execs timeout, which passes TERM on).
  ip netns exec "$srv_ns" timeout 60 \
    env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" URNIC_SOCKET="$srv_sock" "$@" -p "$PORT" \
    >"$TMP/srv.out" 2>&1 &
  spid=$!
  PIDS+=("$spid")
  wait_listen "$srv_ns" "$PORT" "$spid" || true
  ip netns exec "$cli_ns" timeout 60 \
    env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" URNIC_SOCKET="$cli_sock" "$@" -p "$PORT" "$host" \
    >"$TMP/cli.out" 2>&1 &
  cpid=$!
  PIDS+=("$cpid")
  wait "$cpid" || crc=$?
  wait "$spid" || src=$?
  forget "$cpid" "$spid"
  echo "--- server: $* -p $PORT (exit $src)"
  tail -n 15 "$TMP/srv.out"
  echo "--- client: $* -p $PORT $host (exit $crc)"
  tail -n 25 "$TMP/cli.out"
  [ "$src" = 0 ] && [ "$crc" = 0 ] || return 1
  if [ "$kind" = pp ]; then
    if ! grep -q 'iters in' "$TMP/srv.out" || ! grep -q 'iters in' "$TMP/cli.out"; then
      echo "no 'N iters in' line from both sides"
      return 1
    fi
  fi
  if [ "$kind" = perf ]; then
    awk '/#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { n++ } END { exit !n }' \
      "$TMP/cli.out" || { echo "no results table in the client's output"; return 1; }
  fi
  return 0
}

# --- device discovery ----------------------------------------------------------
check "A: ibv_devices lists urnic0" bash -c "
  out=\$(ip netns exec '$NS_A' env '$CLIENT_ASAN' LD_PRELOAD='$PRELOAD' URNIC_SOCKET='$SOCK_A' \
    timeout 60 ibv_devices); echo \"\$out\"; echo \"\$out\" | grep -qw urnic0"
devinfo_check() {  # devinfo_check NETNS SOCK IPV4
  local out
  out=$(run "$1" "$2" ibv_devinfo -v -d urnic0) || { echo "$out"; return 1; }
  echo "$out"
  echo "$out" | grep -q 'hca_id:[[:space:]]*urnic0' &&
    echo "$out" | grep -q 'state:[[:space:]]*PORT_ACTIVE' &&
    echo "$out" | grep -q 'link_layer:[[:space:]]*Ethernet' &&
    echo "$out" | grep -q "GID\[ *0\]:.*::ffff:$3\b"
}
check "A: ibv_devinfo -v: urnic0, PORT_ACTIVE, Ethernet, GID 0 ::ffff:10.79.0.1" \
  devinfo_check "$NS_A" "$SOCK_A" 10.79.0.1
check "B1: ibv_devinfo -v: urnic0, PORT_ACTIVE, Ethernet, GID 0 ::ffff:10.80.0.1" \
  devinfo_check "$NS_B1" "$SOCK_B1" 10.80.0.1
check "B2: ibv_devinfo -v: urnic0, PORT_ACTIVE, Ethernet, GID 0 ::ffff:10.80.0.2" \
  devinfo_check "$NS_B2" "$SOCK_B2" 10.80.0.2

# --- ibverbs-utils pingpongs ------------------------------------------------------
for t in a b; do
  T=${t^^}
  check "$T: ibv_rc_pingpong -g 0 -c -n 50 (polling, 4096 bytes)" \
    pair $t pp ibv_rc_pingpong -d urnic0 -g 0 -c -n 50
  check "$T: ibv_rc_pingpong -g 0 -c -e -n 50 -s 16384 (events)" \
    pair $t pp ibv_rc_pingpong -d urnic0 -g 0 -c -e -n 50 -s 16384
  check "$T: ibv_uc_pingpong -g 0 -c -n 50 -s 4096" \
    pair $t pp ibv_uc_pingpong -d urnic0 -g 0 -c -n 50 -s 4096
  check "$T: ibv_ud_pingpong -g 0 -c -n 50 (default size)" \
    pair $t pp ibv_ud_pingpong -d urnic0 -g 0 -c -n 50
  check "$T: ibv_srq_pingpong -g 0 -c -n 50 -s 4096" \
    pair $t pp ibv_srq_pingpong -d urnic0 -g 0 -c -n 50 -s 4096
done

# --- perftest -------------------------------------------------------------------------
PT=(-d urnic0 -x 0)
check "A: ib_write_bw -n 200" pair a perf ib_write_bw "${PT[@]}" -n 200
check "A: ib_read_lat -n 100" pair a perf ib_read_lat "${PT[@]}" -n 100
check "A: ib_send_bw -n 200" pair a perf ib_send_bw "${PT[@]}" -n 200
check "A: ib_write_bw -a -n 5 (all sizes)" pair a perf ib_write_bw "${PT[@]}" -a -n 5
for prog in ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_send_bw \
  ib_send_lat ib_atomic_bw ib_atomic_lat; do
  check "B: $prog -n 100" pair b perf $prog "${PT[@]}" -n 100
done
check "B: ib_write_bw -a -n 5 (all sizes)" pair b perf ib_write_bw "${PT[@]}" -a -n 5
check "B: ib_write_bw -q 4 -n 100" pair b perf ib_write_bw "${PT[@]}" -q 4 -n 100
check "B: ib_write_bw --use_old_post_send -n 100" \
  pair b perf ib_write_bw "${PT[@]}" --use_old_post_send -n 100
check "B: ib_send_bw -s 1048576 -n 10" \
  pair b perf ib_send_bw "${PT[@]}" -s 1048576 -n 10
# Buffers in System V shared memory on huge pages (shmget SHM_HUGETLB):
# the service maps the segment itself (README, "Memory registration").
huge_reserve
if [ "$(huge_free)" -ge 4 ]; then
  check "B: ib_write_bw --use_hugepages -n 100" \
    pair b perf ib_write_bw "${PT[@]}" --use_hugepages -n 100
  check "B: ib_read_bw --use_hugepages -n 100" \
    pair b perf ib_read_bw "${PT[@]}" --use_hugepages -n 100
else
  echo "skip: perftest --use_hugepages: no huge pages free ($(huge_free))"
fi
# UD and UC have no retransmission: a SEND that finds no receive WR, or a
# frame the kernel's af_packet ring dropped, loses the message and perftest
# waits forever. Both hung about half the time: the worker took the frames
# before the receive WRs rung for earlier, and the ring held 512 frames.
check "B: ib_send_bw -c UD -a -n 20 (receives posted per size, no loss)" \
  pair b perf ib_send_bw "${PT[@]}" -c UD -a -n 20
# (UC stays under the ring's 4096 frames: -a would send 8 MiB messages,
# 8192 frames each, which a receiver off the CPU may still lose.)
check "B: ib_send_bw -c UC -s 65536 -n 20 (1280 frames, none lost)" \
  pair b perf ib_send_bw "${PT[@]}" -c UC -s 65536 -n 20
# Memory that changes while B1 (zero-copy TX) may still send from it: a UD
# or UC send buffer rewritten as soon as the send completed, memory
# rewritten under READs. Every frame must still carry a valid ICRC: B2
# counts none bad, every message arrives intact, every READ completes.
bad_icrc() {
  "$URNICCTL" -s "$1" stats --json |
    $PY -c "import json, sys; print(json.load(sys.stdin)['malformed'].get('bad_icrc', 0))"
}
reuse() {  # reuse MODE COUNT: a payload_reuse pair, B2's bad ICRCs unchanged
  local before after
  before=$(bad_icrc "$SOCK_B2")
  pair b plain "$REUSE" -t "$1" -n "$2" || return 1
  after=$(bad_icrc "$SOCK_B2")
  echo "B2 bad_icrc: $before -> $after"
  [ "$after" = "$before" ]
}
check "B: UD sends from a buffer rewritten at each completion (5000, intact)" \
  reuse ud 5000
check "B: UC sends from a buffer rewritten at each completion (2000, intact)" \
  reuse uc 2000
check "B: READs of memory rewritten meanwhile (200 x 64 KiB, no bad ICRC)" \
  reuse read 200

# UD multicast with plain verbs (ibv_attach_mcast, an AH to the group):
# two QPs join on B1 and one on B2 (B1 counts one new group, and answers an
# IGMP query from B2's namespace with a valid report for it), and B2 sends
# 300 messages to the group.
# Every member gets every one, checked: B1's two through the veth (one
# frame, two copies), B2's own through the service's loopback of a frame
# to a group it has members of (no switch sends it back).
mcast_counter() {  # mcast_counter SOCK NAME: an lcore counter's total
  "$URNICCTL" -s "$1" stats --json |
    $PY -c "import json,sys; print(json.load(sys.stdin)['totals']['$2'])"
}
# igmp_query IFACE GROUP SRC [leave]: an IGMPv2 general query on IFACE
# (from this namespace); exit 0 once a valid v2 report for GROUP from SRC
# (TTL 1, Router Alert, both checksums, the group's MAC) comes back within
# 3 s. With `leave`: no query; wait 60 s for SRC's Leave Group for GROUP
# (to 224.0.0.2).
cat >"$TMP/igmp_query.py" <<'PY'
import socket, struct, sys, time
iface, group, src = sys.argv[1], sys.argv[2], sys.argv[3]
leave = len(sys.argv) > 4
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
igmp = bytearray(struct.pack('!BBH4s', 0x11, 100, 0, bytes(4)))
struct.pack_into('!H', igmp, 2, csum(bytes(igmp)))
ip = bytearray(struct.pack('!BBHHHBBH4s4s', 0x46, 0xc0, 32, 0, 0x4000, 1, 2, 0,
                           socket.inet_aton('10.80.0.12'),
                           socket.inet_aton('224.0.0.1')) + b'\x94\x04\0\0')
struct.pack_into('!H', ip, 10, csum(bytes(ip)))
eth = bytes.fromhex('01005e000001') + bytes.fromhex('020000000099') + b'\x08\x00'
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
s.bind((iface, 0))
if leave:
    print('listening', flush=True)
else:
    s.send(eth + bytes(ip) + bytes(igmp))
end = time.time() + (60 if leave else 3)
want, to = (0x17, '224.0.0.2') if leave else (0x16, group)
while time.time() < end:
    s.settimeout(max(0.01, end - time.time()))
    try:
        f = s.recv(2048)
    except socket.timeout:
        break
    p = f[14:]
    if len(p) < 28 or p[9] != 2 or socket.inet_ntoa(p[12:16]) != src:
        continue
    ihl = (p[0] & 15) * 4
    g = p[ihl:ihl + 8]
    dst = socket.inet_aton(to)
    if (g[0] == want and socket.inet_ntoa(g[4:8]) == group and p[8] == 1 and
            p[16:20] == dst and p[20:24] == b'\x94\x04\0\0' and
            csum(p[:ihl]) == 0 and csum(g) == 0 and
            f[:6] == bytes.fromhex('01005e') + bytes([dst[1] & 0x7f]) + dst[2:]):
        print('leave' if leave else 'report', 'for', group, 'from', src)
        sys.exit(0)
print('no valid', 'leave' if leave else 'report', 'for', group, 'from', src)
sys.exit(1)
PY
mcast() {
  local r1 r2 rc=0 rx0 lo0 rx lo j0 q0 j q
  rx0=$(mcast_counter "$SOCK_B1" mcast_rx)
  lo0=$(mcast_counter "$SOCK_B2" mcast_loopback)
  j0=$("$URNICCTL" -s "$SOCK_B1" stats --json |
    $PY -c "import json,sys; print(json.load(sys.stdin)['shim']['mcast_joins'])")
  q0=$(mcast_counter "$SOCK_B1" igmp_reports_tx)
  ip netns exec "$NS_B1" timeout 60 env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" \
    URNIC_SOCKET="$SOCK_B1" "$MCAST" recv 239.1.2.3 300 2 >"$TMP/mc1.out" 2>&1 &
  r1=$!
  ip netns exec "$NS_B2" timeout 60 env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" \
    URNIC_SOCKET="$SOCK_B2" "$MCAST" recv 239.1.2.3 300 >"$TMP/mc2.out" 2>&1 &
  r2=$!
  PIDS+=("$r1" "$r2")
  for _ in $(seq 100); do
    grep -q ready "$TMP/mc1.out" && grep -q ready "$TMP/mc2.out" && break
    sleep 0.1
  done
  # B1 told the link (an IGMP report when the group got its first member)
  # and answers a router's query for it.
  j=$("$URNICCTL" -s "$SOCK_B1" stats --json |
    $PY -c "import json,sys; print(json.load(sys.stdin)['shim']['mcast_joins'])")
  echo "B1 mcast_joins $j0 -> $j"
  [ $((j - j0)) = 1 ] || rc=1
  ip netns exec "$NS_B2" $PY "$TMP/igmp_query.py" "vsb${id}2" 239.1.2.3 \
    10.80.0.1 || rc=1
  q=$(mcast_counter "$SOCK_B1" igmp_reports_tx)
  echo "B1 igmp_reports_tx $q0 -> $q"
  [ $((q - q0)) -ge 1 ] || rc=1
  run "$NS_B2" "$SOCK_B2" "$MCAST" send 239.1.2.3 300 1000 || rc=1
  wait "$r1" || rc=1
  wait "$r2" || rc=1
  forget "$r1" "$r2"
  echo "--- B1 receivers:"; cat "$TMP/mc1.out"
  echo "--- B2 receiver:"; cat "$TMP/mc2.out"
  rx=$(mcast_counter "$SOCK_B1" mcast_rx)
  lo=$(mcast_counter "$SOCK_B2" mcast_loopback)
  echo "B1 mcast_rx $rx0 -> $rx, B2 mcast_loopback $lo0 -> $lo"
  # The receivers detached: B1's group is gone (an IGMP leave), none left.
  "$URNICCTL" -s "$SOCK_B1" stats --json | $PY -c "
import json, sys
s = json.load(sys.stdin)['shim']
print('B1 mcast_leaves', s['mcast_leaves'], 'groups', s['mcast_groups'],
      'attached', s['mcast_attached'])
sys.exit(0 if s['mcast_leaves'] == s['mcast_joins'] and s['mcast_groups'] == 0
         and s['mcast_attached'] == 0 else 1)" || rc=1
  [ $((rx - rx0)) -eq 300 ] && [ $((lo - lo0)) -eq 300 ] || rc=1
  return $rc
}
check "B: UD multicast, plain verbs: 300 messages to 2 QPs on B1 and 1 on B2 (loopback), all checked" \
  mcast

crossed() {  # the B runs went over the veth, both ways
  local r1 r2
  r1=$(roce_rx "$SOCK_B1")
  r2=$(roce_rx "$SOCK_B2")
  echo "roce_rx: B1 $RX0_B1 -> $r1, B2 $RX0_B2 -> $r2"
  [ $((r1 - RX0_B1)) -ge 10000 ] && [ $((r2 - RX0_B2)) -ge 10000 ]
}
check "B: the RDMA traffic crossed the veth (roce_rx of both services)" crossed

payload_paths() {  # B1 referenced application memory, B2 copied it
  local j1 j2
  j1=$("$URNICCTL" -s "$SOCK_B1" stats --json) || return 1
  j2=$("$URNICCTL" -s "$SOCK_B2" stats --json) || return 1
  $PY - "$j1" "$j2" <<'PY'
import json, sys
b1, b2 = (json.loads(a) for a in sys.argv[1:3])
for n, j in (("B1", b1), ("B2", b2)):
    t = j["totals"]
    print(n, j["port"]["zero_copy_tx"], "copied", t["tx_copy_bytes"],
          "referenced", t["tx_zero_copy_bytes"], "segments", t["tx_zero_copy"])
ok = (b1["port"]["zero_copy_tx"] == "on" and b1["totals"]["tx_zero_copy_bytes"] > 1 << 20
      and b2["port"]["zero_copy_tx"].startswith("off: ")
      and b2["totals"]["tx_zero_copy_bytes"] == 0 and b2["totals"]["tx_zero_copy"] == 0
      and b2["totals"]["tx_copy_bytes"] > 1 << 20)
sys.exit(0 if ok else 1)
PY
}
check "B: B1 sent payload from application memory, B2 (zero_copy_tx false) copied it" \
  payload_paths

# --- kill -9 in mid-transfer (topology B) ------------------------------------------
# kill_case VICTIM: an ib_write_bw -D 30 pair between the services; once
# RDMA flows, kill -9 the VICTIM (client or server). The survivor runs under
# timeout 40 and must exit non-zero by itself (not 124: it hung); then both
# services are back to their baseline objects.
kill_case() {
  local victim=$1 vpid spid pre_srv pre_cli
  PORT=$((PORT + 1))
  if [ "$victim" = client ]; then
    pre_srv=(timeout 40) pre_cli=()
  else
    pre_srv=() pre_cli=(timeout 40)
  fi
  # Bare (no timeout) for the victim, so that $! is the program itself.
  ip netns exec "$NS_B1" "${pre_srv[@]}" env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" \
    URNIC_SOCKET="$SOCK_B1" ib_write_bw "${PT[@]}" -D 30 -p $PORT \
    >"$TMP/ksrv.out" 2>&1 &
  KSRV=$!
  PIDS+=("$KSRV")
  wait_listen "$NS_B1" $PORT $KSRV || true
  ip netns exec "$NS_B2" "${pre_cli[@]}" env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" \
    URNIC_SOCKET="$SOCK_B2" ib_write_bw "${PT[@]}" -D 30 -p $PORT 10.80.0.11 \
    >"$TMP/kcli.out" 2>&1 &
  KCLI=$!
  PIDS+=("$KCLI")
  sleep 2
  flows=0
  check "B: kill -9 $victim: ib_write_bw -D 30 traffic flows (objects on both services, B1 receives RoCE)" \
    traffic_flows
  if [ "$victim" = client ]; then
    vpid=$KCLI spid=$KSRV KOUT=$TMP/ksrv.out
  else
    vpid=$KSRV spid=$KCLI KOUT=$TMP/kcli.out
  fi
  kill -KILL $vpid 2>/dev/null || true
  wait $vpid 2>/dev/null || true
  t_kill=$SECONDS
  krc=0
  wait $spid || krc=$?
  forget $vpid $spid
  local survivor=server
  [ "$victim" = client ] || survivor=client
  check "B: kill -9 $victim: the $survivor exits non-zero, not hung (rc $krc, $((SECONDS - t_kill)) s)" \
    bash -c "tail -n 15 '$KOUT'; [ $flows = 1 ] || echo 'no traffic was flowing';
             [ $flows = 1 ] && [ $krc != 0 ] && [ $krc != 124 ]"
  if [ "$victim" = server ]; then
    # The client is the requester: its WRITEs go unanswered.
    check "B: kill -9 server: the client reports a completion error" \
      grep -Eq 'Completion with error|Failed status' "$KOUT"
  fi
  check "B: kill -9 $victim: B1 device line back to its baseline" \
    wait_devline "$SOCK_B1" "$BASE_B1"
  check "B: kill -9 $victim: B2 device line back to its baseline" \
    wait_devline "$SOCK_B2" "$BASE_B2"
}
traffic_flows() {
  local r0 r1 d1 d2
  kill -0 $KCLI 2>/dev/null || { echo "client already gone"; tail -n 20 "$TMP/kcli.out"; return 1; }
  kill -0 $KSRV 2>/dev/null || { echo "server already gone"; tail -n 20 "$TMP/ksrv.out"; return 1; }
  d1=$(devline "$SOCK_B1")
  d2=$(devline "$SOCK_B2")
  echo "B1 $d1"
  echo "B2 $d2"
  [ "$d1" != "$BASE_B1" ] && [ "$d2" != "$BASE_B2" ] || return 1
  r0=$(roce_rx "$SOCK_B1")
  sleep 0.5
  r1=$(roce_rx "$SOCK_B1")
  echo "service B1 roce_rx $r0 -> $r1"
  [ "$r1" -gt "$r0" ] || { tail -n 20 "$TMP/kcli.out"; return 1; }
  flows=1
}
check "B: services idle before the kill tests: device lines at their baselines" \
  bash -c "[ \"\$('$URNICCTL' -s '$SOCK_B1' objects | grep '^device:')\" = '$BASE_B1' ] &&
           [ \"\$('$URNICCTL' -s '$SOCK_B2' objects | grep '^device:')\" = '$BASE_B2' ] ||
           { '$URNICCTL' -s '$SOCK_B1' objects; '$URNICCTL' -s '$SOCK_B2' objects; exit 1; }"
kill_case client
kill_case server
check "B: a fresh ib_write_bw pair afterwards" pair b perf ib_write_bw "${PT[@]}" -n 100

# --- misuse and extended verbs --------------------------------------------------------
# shim_program BIN: a test program of tests/shim on service A, 120 s at most.
shim_program() {
  local mpid rc=0
  ip netns exec "$NS_A" timeout 120 \
    env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" URNIC_SOCKET="$SOCK_A" "$1" urnic0 &
  mpid=$!
  PIDS+=("$mpid")
  wait "$mpid" || rc=$?
  forget "$mpid"
  return $rc
}
check "A: verbs_misuse" shim_program "$MISUSE"
echo "       $(grep -c '^ok' "$TMP/out" || true) sub-checks ok, $(grep -c '^FAIL' "$TMP/out" || true) failed"
check "A: verbs_extended" shim_program "$EXTENDED"
echo "       $(grep -c '^ok' "$TMP/out" || true) sub-checks ok, $(grep -c '^FAIL' "$TMP/out" || true) failed"
# libibverbs loaded by dlopen, unloaded and loaded again (Open MPI's
# plugins do): the shim's pointers into it stay valid.
check "A: dl_reload (libibverbs dlclosed and dlopened again)" \
  shim_program "$DL_RELOAD"
check "A: device line back to its baseline after all programs" \
  wait_devline "$SOCK_A" "$BASE_A"

# --- the services are still healthy and stop cleanly ------------------------------------
# B2 stops with a receiver still joined to 239.1.2.5: its IGMP leave for
# the group must reach the link (B1's veth end, listened to from B1's
# namespace), as when the group's last member leaves.
ip netns exec "$NS_B2" timeout 120 env "$CLIENT_ASAN" LD_PRELOAD="$PRELOAD" \
  URNIC_SOCKET="$SOCK_B2" "$MCAST" recv 239.1.2.5 1 >"$TMP/mc-last.out" 2>&1 &
LAST_RECV=$!
PIDS+=("$LAST_RECV")
ip netns exec "$NS_B1" $PY "$TMP/igmp_query.py" "vsb${id}1" 239.1.2.5 \
  10.80.0.2 leave >"$TMP/leave.out" 2>&1 &
SNIFF=$!
PIDS+=("$SNIFF")
for _ in $(seq 100); do
  grep -q ready "$TMP/mc-last.out" && grep -q listening "$TMP/leave.out" && break
  sleep 0.1
done
for s in A B1 B2; do
  pid_var=PID_$s
  pid=${!pid_var}
  sock_var=SOCK_$s
  check "$s: urnicd still serving" "$URNICCTL" -s "${!sock_var}" version
  kill -TERM "$pid"
  rc=0
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL - $s: urnicd ignored SIGTERM"; fail=$((fail + 1))
  else
    wait "$pid" || rc=$?
    forget "$pid"
    check "$s: urnicd exited 0 on SIGTERM" bash -c "[ $rc = 0 ] || { tail -n 20 '$TMP/urnicd-$s.log'; exit 1; }"
  fi
done

left() {  # the leave was seen; the receiver lost its service and ended
  local rc=0
  wait "$SNIFF" || rc=1
  cat "$TMP/leave.out"
  stop_pid "$LAST_RECV" || true
  return $rc
}
check "B2 stopped with a group joined: its IGMP leave reached the link" left
forget "$SNIFF" "$LAST_RECV"

echo "$pass passed, $fail failed ($((SECONDS - t_start)) s)"
[ "$fail" = 0 ]
