#!/usr/bin/env bash
# Integration: librdmacm programs (rdmacm-utils, perftest -R), unmodified, on
# urnic through the verbs shim: the RDMA CM commands go to urnicd, the
# connections are made with IB CM MADs on QP1 on the wire.
#  Two services joined by a net_memif pair (10.98.0.1 and .2):
#   - rping -V -v -C 100 (server on A, client on B): both exit 0, every
#     ping's data validated (-V) and printed by both ends;
#   - rping within one service (its own address: MADs looped back);
#   - ucmatose (RDMA_PS_TCP, data transfers) and rdma_server/rdma_client
#     (synchronous ids: rdma_create_ep, rdma_get_request's MIGRATE_ID);
#     rdma_xserver/rdma_xclient over RC (an inline send on a QP created
#     with max_inline_data 0);
#   - udaddy (RDMA_PS_UDP: SIDR_REQ/REP, UD sends to the AH of the event);
#   - rsockets (librdmacm's sockets over RC QPs: RDMA WRITE with immediate
#     data, inline credit messages): rstream and riostream with verified
#     data, blocking and nonblocking, and rcopy of a 3 MB file compared
#     byte for byte; cmtime (20 connections set up and torn down);
#   - qperf's RC tests through the RDMA CM (-cm1), atomics verified;
#   - perftest ib_write_bw -R, ib_send_bw -R -c UD and ib_send_lat -R (two
#     CM phases on one port; the client's REQ / SIDR_REQ often comes before
#     its server listens, and waits for it: cm.listen_grace_ms), each run
#     once;
#   - libfabric 1.17's verbs provider, data checked (-c): RDM endpoints over
#     UD QPs (verbs;ofi_rxd); and, where a kernel interface carries the
#     services' addresses (which the provider looks for), MSG endpoints (RC
#     QPs, RDMA CM) and RDM endpoints over them (verbs;ofi_rxm);
#   - mckey (RDMA_PS_UDP multicast): receivers on both services and a
#     sender (plain, -l: no loopback, -o: send-only join); every receiver
#     gets every message, the sender's own service loops them back to its
#     members unless -l or -o says otherwise;
#   - refusals: a port nobody listens on is REJECTED with reason 8 once
#     the listen grace (100 ms) is over;
#     an address nobody answers is ADDR_ERROR; a client killed mid-transfer
#     is a DISCONNECTED at the server, which exits;
#   - afterwards no CM id or channel is left in either service, and the
#     services counted the connections and MADs.
# Every started process is stopped by PID on exit, pass or fail.
# usage: rdmacm.sh URNICD URNICCTL SHIM_SO
set -euo pipefail
URNICD=$1
URNICCTL=$2
SHIM=$(realpath "$3")
ID=rdmacm-$$
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

for p in rping ucmatose udaddy rdma_server rdma_client rdma_xserver rstream \
  riostream rcopy cmtime ib_write_bw; do
  command -v "$p" >/dev/null ||
    { echo "SKIP: $p not installed (rdmacm-utils, perftest)"; exit 77; }
done
shim_preload "$SHIM"
lib_init

SA=$TMP/a.sock
SB=$TMP/b.sock
memif_start server 02:00:00:00:98:01 10.98.0.1 "$SA"
memif_start client 02:00:00:00:98:02 10.98.0.2 "$SB"
check "both services up, links up" wait_link "$SA"
check "  on both services" wait_link "$SB"

on() { as_client "$@"; }  # on SOCK CMD...
# bg_on SOCK CMD... &: the same, as the background job itself (exec: $! is
# the program, so it is the one killed and stopped by PID)
bg_on() {
  local sock=$1
  shift
  exec env $CLIENT_ENV URNIC_SOCKET="$sock" LD_PRELOAD="$PRELOAD" \
    URNIC_POLL_YIELD=1 "$@"
}

# server_up SOCK LISTENS PID: the server PID started as a client of SOCK
# listens: it made an RDMA CM listen beyond the LISTENS counted before it
# started (or, with PAIR_TCP=PORT, a TCP socket listens on PORT: libfabric's
# control exchange; in netns PAIR_NS if set). Else it is stopped.
server_up() {
  if [ -n "${PAIR_TCP:-}" ]; then wait_tcp "$PAIR_TCP" "${PAIR_NS:-}" "$3"; else wait_cm_listen "$1" "$2"; fi &&
    return 0
  stop_pid "$3"
  return 1
}

# pair NAME SERVER_SOCK CLIENT_SOCK "SERVER CMD" "CLIENT CMD": both exit 0
# within 60 s (outputs in $TMP/NAME-{srv,cli}.out). The client starts once
# the server listens (server_up).
pair() {
  local name=$1 ssock=$2 csock=$3 scmd=$4 ccmd=$5 sp rc=0 l0
  l0=$(counter "$ssock" cm_listens)
  # shellcheck disable=SC2086
  bg_on "$ssock" timeout 60 $scmd >"$TMP/$name-srv.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  server_up "$ssock" "$l0" "$sp" || rc=1
  # shellcheck disable=SC2086
  [ "$rc" = 0 ] && { on "$csock" timeout 60 $ccmd >"$TMP/$name-cli.out" 2>&1 || rc=$?; }
  # The client lost a race of the program's own (pair_retry): say so and
  # stop the server, which may wait for ever (perftest's).
  if [ "$rc" != 0 ] && [ -n "${PAIR_RACE:-}" ] &&
    grep -qE "$PAIR_RACE" "$TMP/$name-cli.out"; then
    stop_pid "$sp"
    return 75
  fi
  wait "$sp" || rc=$((rc ? rc : $?))
  if [ "$rc" != 0 ] && [ -n "${PAIR_RACE:-}" ] &&
    grep -qE "$PAIR_RACE" "$TMP/$name-srv.out"; then
    return 75
  fi
  if [ "$rc" != 0 ]; then
    echo "  $name: exit $rc"
    tail -n 5 "$TMP/$name-srv.out" "$TMP/$name-cli.out"
    losses "$ssock"
    [ "$csock" = "$ssock" ] || losses "$csock"
  fi
  return "$rc"
}

# pair_retry RACE WHY NAME SERVER_SOCK CLIENT_SOCK "SERVER CMD" "CLIENT CMD":
# pair, run again (three tries in all) when an end failed with output
# matching the regex RACE: a race in the program itself, named WHY. Every
# try must still have both ends exit 0 to pass.
pair_retry() {
  local race=$1 why=$2 try rc
  shift 2
  for try in 1 2 3; do
    rc=0
    PAIR_RACE=$race pair "$@" || rc=$?
    [ "$rc" = 75 ] || return "$rc"
    echo "  $1: $why, try $try"
  done
  return 1
}

# pair_perftest NAME SERVER_SOCK CLIENT_SOCK "SERVER CMD" "CLIENT CMD": a
# perftest -R pair, once. perftest 4.5's -R server listens for the test's
# connection only after its handshake with the client, and the client
# connects right after that handshake: its REQ / SIDR_REQ often arrives
# first. Linux's CM refuses it at once (REJ reason 8; SIDR_REP
# "unsupported"), and perftest's retry loop then uses the ids it has just
# destroyed and crashes (SEGV in rdma_resolve_addr); urnicd holds it for a
# listener (cm.listen_grace_ms, 100 ms). Without the hold 6 of 20
# ib_write_bw -R pairs passed on 2 vCPUs (clients yielding, 2026-12-01),
# with it 16 of 16 (write_bw and send_bw -c UD) and every pair here. The
# client's stdout is line-buffered so its event line survives a crash.
pair_perftest() {
  pair "$1" "$2" "$3" "$4" "stdbuf -oL $5"
}

# pair_rping NAME SERVER_SOCK CLIENT_SOCK "SERVER CMD" "CLIENT CMD": an rping
# pair, run again when an end lost rping's own race at its exit. The rping
# of rdma-core 44 (Debian 12) destroys its CM channel without stopping the
# thread that reads it: when that thread comes back for the next event
# after the channel is closed, rdma_get_cm_event fails and the thread
# exit()s 255 though every ping passed. The kernel's rdma_cm gives the same
# failure; rdma-core fixed rping in 2025 (PR #1622, "rping: Fix spurious
# failure return codes"). Measured on urnic: 1 pair in ~1 190 (2026-12-01).
pair_rping() {
  pair_retry "rdma_get_cm_event: Bad file descriptor" \
    "rping's exit race (rdma-core PR #1622)" "$@"
}

# pings FILE PATTERN N: N lines of validated ping data in FILE
pings() { [ "$(grep -c "$2" "$1")" = "$3" ]; }
# both PATTERN NAME: in the server's and in the client's output
both() { grep -q "$1" "$TMP/$2-srv.out" && grep -q "$1" "$TMP/$2-cli.out"; }

check "rping -V -v -C 100 across two services" \
  pair_rping rping "$SA" "$SB" "rping -s -V -v -C 100 -a 10.98.0.1" \
  "rping -c -V -v -C 100 -a 10.98.0.1"
check "  server printed 100 validated pings" \
  pings "$TMP/rping-srv.out" '^server ping data: rdma-ping-' 100
check "  client printed 100 validated pings" \
  pings "$TMP/rping-cli.out" '^ping data: rdma-ping-' 100
check "rping -V -C 20 within one service" \
  pair_rping rping1 "$SA" "$SA" "rping -s -V -v -C 20 -a 10.98.0.1 -p 7175" \
  "rping -c -V -v -C 20 -a 10.98.0.1 -p 7175"
check "  client printed 20 validated pings" \
  pings "$TMP/rping1-cli.out" '^ping data: rdma-ping-' 20
check "ucmatose (PS_TCP, data transfers)" \
  pair ucmatose "$SA" "$SB" "ucmatose" "ucmatose -s 10.98.0.1"
check "  both report status 0" \
  both 'return status 0' ucmatose
check "rdma_server / rdma_client (synchronous ids, MIGRATE_ID)" \
  pair rdma_sc "$SA" "$SB" "rdma_server" "rdma_client -s 10.98.0.1"
check "  both ends 0" both 'end 0' rdma_sc
# rdma_xclient asks for max_inline_data 0 and posts a 16-byte inline send:
# it needs the inline room rxe and mlx5 grant anyway (a gather list's).
check "rdma_xserver / rdma_xclient -c r (inline send on a QP that asked for none)" \
  pair rdma_x "$SA" "$SB" "rdma_xserver -c r" "rdma_xclient -s 10.98.0.1 -c r"
check "ib_write_bw -R 64 KiB" \
  pair_perftest write_bw "$SA" "$SB" "ib_write_bw -R -d urnic0 -s 65536 -n 500" \
  "ib_write_bw -R -d urnic0 -s 65536 -n 500 10.98.0.1"
check "udaddy (RDMA_PS_UDP: SIDR, then UD sends to the AH it gave)" \
  pair udaddy "$SA" "$SB" "udaddy" "udaddy -s 10.98.0.1"
check "  both report status 0" both 'return status 0' udaddy

# rsockets. rstream/riostream -T v check every byte they receive (and exit
# 1 on a mismatch); -T n: nonblocking calls, polling instead of CQ events.
rs() {  # rs NAME PROG OPTS: PROG's server on A, client on B, both exit 0
  pair "$1" "$SA" "$SB" "$2 -b 10.98.0.1 $3" "$2 -s 10.98.0.1 $3" &&
    ! grep -qi 'fail\|error' "$TMP/$1-srv.out" "$TMP/$1-cli.out"
}
# (rstream's server, whose librdmacm service thread may still be in a CM
# command as the program exits, found the shim's exit-time double free of
# its channel table under ASan: verbs-shim/rdmacm.cc, g_channels.)
check "rstream -T v (blocking, verified): 200 x 64 KiB" \
  rs rstream rstream "-S 65536 -C 200 -T v"
check "rstream -T n -T v (nonblocking, verified): 2000 x 100 B" \
  rs rstream-n rstream "-S 100 -C 2000 -T n -T v"
check "riostream -T v (riomap'd buffers, verified): 200 x 64 KiB" \
  rs riostream riostream "-S 65536 -C 200 -T v"
# The exit itself, again and again (that double free came about once in
# nine exits): ten short pairs, each server exiting with its service
# thread live.
exits() {
  local i
  for i in $(seq 10); do rs "rstream-x$i" rstream "-S 100 -C 10 -T v" || return 1; done
}
check "  ten more rstream pairs exit cleanly" exits
# rcopy and cmtime servers serve until killed: the client's exit and its
# result say how it went.
served() {  # served NAME "SERVER CMD" "CLIENT CMD": on A / on B
  local sp rc=0 l0
  l0=$(counter "$SA" cm_listens)
  # shellcheck disable=SC2086
  bg_on "$SA" timeout 60 $2 >"$TMP/$1-srv.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  server_up "$SA" "$l0" "$sp" || return 1
  # shellcheck disable=SC2086
  on "$SB" timeout 60 $3 >"$TMP/$1-cli.out" 2>&1 || rc=$?
  kill "$sp" 2>/dev/null || true
  wait "$sp" 2>/dev/null || true
  [ "$rc" = 0 ] || { echo "  $1: client exit $rc"; tail -n 5 "$TMP/$1-cli.out"; }
  return "$rc"
}
head -c 3000000 /dev/urandom >"$TMP/rcopy-src"
rcopy_check() {
  served rcopy rcopy "rcopy $TMP/rcopy-src 10.98.0.1:$TMP/rcopy-dst" &&
    cmp "$TMP/rcopy-src" "$TMP/rcopy-dst"
}
check "rcopy: a 3 MB file over rsockets, received byte for byte" rcopy_check
check "cmtime -c 20: 20 connections made and torn down" \
  served cmtime "cmtime -b 10.98.0.1 -c 20" "cmtime -s 10.98.0.1 -c 20"
check "  it timed every step" grep -q '^disconnect' "$TMP/cmtime-cli.out"

# qperf's RC tests through the RDMA CM (-cm1; without it qperf builds IB
# address vectors, no GRH, which RoCE refuses). Its TCP control connection
# goes to the address its RDMA CM connects to, so both ends run in a
# namespace of this test's whose loopback holds both urnic addresses (the
# services' memif sockets are files, reachable from there).
qperf_check() {
  local ns=urnic-rdmacm-q-$$ sp rc=0
  ip netns add "$ns" || return 1
  NETNS+=("$ns")
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add 10.98.0.1/32 dev lo
  ip -n "$ns" addr add 10.98.0.2/32 dev lo
  # `on` inside the namespace (a plain command: $! is the program).
  # shellcheck disable=SC2206
  local in_ns=(ip netns exec "$ns" env $CLIENT_ENV LD_PRELOAD="$PRELOAD"
    URNIC_POLL_YIELD=1)
  "${in_ns[@]}" URNIC_SOCKET="$SA" timeout 90 qperf -lp 19765 \
    >"$TMP/qperf-srv.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  wait_tcp 19765 "$ns" "$sp" || { stop_pid "$sp"; return 1; }
  "${in_ns[@]}" URNIC_SOCKET="$SB" \
    timeout 90 qperf -lp 19765 -cm1 -t 1 10.98.0.1 rc_bw rc_lat \
    rc_rdma_write_bw rc_rdma_read_bw rc_rdma_read_lat ver_rc_compare_swap \
    ver_rc_fetch_add >"$TMP/qperf-cli.out" 2>&1 || rc=$?
  ip netns exec "$ns" timeout 10 qperf -lp 19765 10.98.0.1 quit >/dev/null 2>&1 || true
  wait "$sp" || rc=$((rc ? rc : $?))
  # Every test prints its result; a failure prints an error instead. The
  # server's side is not looked at: Debian's qperf 0.4.11 keeps the
  # listening id as its CM id, so the child serving each test calls
  # rdma_destroy_qp() on an id without a QP as it closes and dies of a NULL
  # dereference in libibverbs, on any device, after its results were sent.
  [ "$rc" = 0 ] && [ "$(grep -c '^ *\(bw\|latency\|msg_rate\) *=' "$TMP/qperf-cli.out")" = 7 ] &&
    ! grep -qi 'fail\|error' "$TMP/qperf-cli.out" && return 0
  echo "  qperf: exit $rc"
  tail -n 8 "$TMP/qperf-cli.out" "$TMP/qperf-srv.out"
  return 1
}
if command -v qperf >/dev/null; then
  check "qperf -cm1: RC send, WRITE, READ bw and latency, verified atomics" qperf_check
else
  echo "SKIP - qperf not installed (tools/bootstrap installs it)"
fi
check "ib_send_bw -R -c UD" \
  pair_perftest ud_bw "$SA" "$SB" "ib_send_bw -R -c UD -d urnic0 -n 500" \
  "ib_send_bw -R -c UD -d urnic0 -n 500 10.98.0.1"
check "ib_send_lat -R" \
  pair_perftest send_lat "$SA" "$SB" "ib_send_lat -R -d urnic0 -n 500" \
  "ib_send_lat -R -d urnic0 -n 500 10.98.0.1"

# libfabric: its control exchange goes over TCP on loopback, the data over
# urnic (both services in this namespace). 64 B and 4 KiB, data checked.
if command -v fi_pingpong >/dev/null; then
  # libfabric's verbs provider sizes a QP's inline data by trying: refusals
  # that carry nothing beyond the errno print nothing (as other providers).
  fi_quiet() {
    on "$SA" timeout 60 fi_info -p verbs >"$TMP/fi_info.out" 2>&1 || return 1
    grep -q urnic0 "$TMP/fi_info.out" || return 1
    ! grep 'urnic:' "$TMP/fi_info.out"
  }
  check "fi_info -p verbs lists urnic0, no refusal noise on stderr" fi_quiet
PAIR_TCP=47601 check "fi_pingpong -p 'verbs;ofi_rxd' -e rdm -c, 64 B" \
    pair fi_64 "$SA" "$SB" "fi_pingpong -p verbs;ofi_rxd -e rdm -c -I 50 -S 64 -B 47601" \
    "fi_pingpong -p verbs;ofi_rxd -e rdm -c -I 50 -S 64 -P 47601 127.0.0.1"
  PAIR_TCP=47602 check "fi_pingpong -p 'verbs;ofi_rxd' -e rdm -c, 4 KiB" \
    pair fi_4k "$SA" "$SB" "fi_pingpong -p verbs;ofi_rxd -e rdm -c -I 50 -S 4096 -B 47602" \
    "fi_pingpong -p verbs;ofi_rxd -e rdm -c -I 50 -S 4096 -P 47602 127.0.0.1"
  check "  both report the transfers" both '^4k *50 *=50' fi_4k
  # MSG endpoints: the provider offers them on a device whose address it
  # finds on a kernel interface (it binds each interface's address and
  # keeps those that land on a device), and its passive endpoint binds
  # "localhost", which Linux takes as the wildcard. The programs run in a
  # namespace whose interfaces carry the two services' addresses (addr_ns;
  # urnic's port is not a kernel interface). The control exchange is TCP
  # on that namespace's loopback.
  addr_ns FI_NS 10.98.0.1 10.98.0.2
  fi_ns() { echo "ip netns exec $FI_NS fi_pingpong $*"; }
  fi_msg() {
    on "$SA" ip netns exec "$FI_NS" timeout 60 fi_info -p verbs -t FI_EP_MSG \
      >"$TMP/fi_msg_info.out" 2>&1 && grep -q 'domain: urnic0$' "$TMP/fi_msg_info.out"
  }
  check "fi_info -t FI_EP_MSG lists urnic0 where an interface has its address" fi_msg
  PAIR_NS=$FI_NS PAIR_TCP=47603 check "fi_pingpong -p verbs -e msg -c (RC QPs, RDMA CM), 64 B" \
    pair fi_msg "$SA" "$SB" "$(fi_ns -p verbs -e msg -c -I 100 -S 64 -B 47603)" \
    "$(fi_ns -p verbs -e msg -c -I 100 -S 64 -P 47603 127.0.0.1)"
  check "  both report the transfers" both '^64 *100 *=100' fi_msg
  PAIR_NS=$FI_NS PAIR_TCP=47604 check "fi_pingpong -p 'verbs;ofi_rxm' -e rdm -c, 64 KiB" \
    pair fi_rxm "$SA" "$SB" "$(fi_ns -p 'verbs;ofi_rxm' -e rdm -c -I 100 -S 65536 -B 47604)" \
    "$(fi_ns -p 'verbs;ofi_rxm' -e rdm -c -I 100 -S 65536 -P 47604 127.0.0.1)"
  check "  both report the transfers" both '^64k *100 *=100' fi_rxm
else
  echo "SKIP - fi_pingpong not installed (libfabric-bin)"
fi

# A port nobody listens on: REJ "invalid service ID" (8), not a timeout.
rejected() {
  local t0=$SECONDS rc=0
  on "$SB" timeout 20 rping -c -a 10.98.0.1 -p 7999 -C 1 >"$TMP/rej.out" 2>&1 ||
    rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ $((SECONDS - t0)) -lt 5 ] &&
    grep -q 'REJECTED, error 8' "$TMP/rej.out"
}
check "no listener: REJECTED, error 8, once the grace is over" rejected

# An address nobody answers: ADDR_ERROR once rping's 2 s resolution ends.
unreachable() {
  local rc=0
  on "$SB" timeout 20 rping -c -a 10.98.0.9 -C 1 >"$TMP/unr.out" 2>&1 || rc=$?
  [ "$rc" != 0 ] && [ "$rc" != 124 ] &&
    grep -q 'ADDR_ERROR' "$TMP/unr.out"
}
check "unreachable address: ADDR_ERROR" unreachable

# Multicast (mckey): receivers join first (A always; B too when B_RECV is
# 1), then a sender on B with SENDER_FLAGS sends 20 messages to the group.
# Every mckey exits 0: a receiver only once it has all 20. B's service
# loops the sender's frames back to its own members (mcast_loopback):
# 20 when the sender joined normally, none with -l (the sender's QP is
# created with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) or -o (a send-only join
# attaches no QP) and no receiver on B. A takes each frame once (mcast_rx).
settled() {  # settled SOCK: no CM id, channel or verbs client left (5 s)
  for _ in $(seq 50); do
    [ "$(counter "$1" cm_ids)" = 0 ] && [ "$(counter "$1" cm_channels)" = 0 ] &&
      [ "$(counter "$1" clients_open)" = 0 ] && return 0
    sleep 0.1
  done
  echo "  $1: cm_ids $(counter "$1" cm_ids) cm_channels $(counter "$1" cm_channels) clients_open $(counter "$1" clients_open)"
  return 1
}
mckey_group() {  # mckey_group GROUP B_RECV "SENDER_FLAGS" LOOPED_ON_B
  local g=$1 brecv=$2 flags=$3 looped=$4 ra rb="" rc=0 lo0 rx0 lo rx
  # No wait for the previous group's teardown: the sender destroys its AH
  # right after posting, without polling, and its service must still send
  # all 20 (it refused them all, bad_wqes +20, when the lcore reached the
  # ring after the destroy; fixed: a WR takes the AH's address at post).
  lo0=$(counter "$SB" mcast_loopback)
  rx0=$(counter "$SA" mcast_rx)
  # Line-buffered (stdbuf -oL): the wait below reads their "joined" lines
  # as they come, not once they exit (it used to time out after 10 s).
  bg_on "$SA" timeout 60 stdbuf -oL mckey -m "$g" -b 10.98.0.1 -C 20 \
    >"$TMP/mca.out" 2>&1 &
  ra=$!
  PIDS+=("$ra")
  if [ "$brecv" = 1 ]; then
    bg_on "$SB" timeout 60 stdbuf -oL mckey -m "$g" -b 10.98.0.2 -C 20 \
      >"$TMP/mcb.out" 2>&1 &
    rb=$!
    PIDS+=("$rb")
  fi
  local joined=0
  for _ in $(seq 100); do
    grep -q 'joined dgid' "$TMP/mca.out" 2>/dev/null &&
      { [ -z "$rb" ] || grep -q 'joined dgid' "$TMP/mcb.out" 2>/dev/null; } &&
      { joined=1; break; }
    sleep 0.1
  done
  [ "$joined" = 1 ] || { echo "  a receiver did not join within 10 s"; rc=1; }
  # shellcheck disable=SC2086
  on "$SB" timeout 60 mckey -m "$g" -b 10.98.0.2 -s -C 20 $flags \
    >"$TMP/mcs.out" 2>&1 || { echo "  sender: exit $?"; rc=1; }
  wait "$ra" || { echo "  receiver on A: exit $?"; rc=1; }
  if [ -n "$rb" ]; then wait "$rb" || { echo "  receiver on B: exit $?"; rc=1; }; fi
  lo=$(counter "$SB" mcast_loopback)
  rx=$(counter "$SA" mcast_rx)
  echo "  B mcast_loopback $lo0 -> $lo (expected +$looped), A mcast_rx $rx0 -> $rx," \
    "B bad_wqes $(counter "$SB" bad_wqes) local_errors $(counter "$SB" local_errors)"
  for f in "$TMP"/mc[abs].out; do
    [ -f "$f" ] && { echo "  --- $f"; sed 's/^/  /' "$f"; rm -f "$f"; }
  done
  [ "$rc" = 0 ] && [ $((lo - lo0)) = "$looped" ] && [ $((rx - rx0)) = 20 ]
}
if command -v mckey >/dev/null; then
  check "mckey: receivers on A and B, sender on B: all get 20, B's by loopback" \
    mckey_group 239.1.1.1 1 "" 20
  check "mckey -l (no loopback): A gets 20, B loops nothing back" \
    mckey_group 239.1.1.2 0 "-l" 0
  check "mckey -o (send-only join): A gets 20, B has no member" \
    mckey_group 239.1.1.3 0 "-o" 0
fi

# A client killed mid-transfer: its service disconnects it (DREQ), the
# server sees DISCONNECTED and ends instead of waiting forever.
killed_client() {
  local sp cp rc=0 l0
  l0=$(counter "$SA" cm_listens)
  bg_on "$SA" timeout 30 rping -s -a 10.98.0.1 -p 7176 -C 1000000 \
    >"$TMP/kill-srv.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  server_up "$SA" "$l0" "$sp" || return 1
  bg_on "$SB" rping -c -a 10.98.0.1 -p 7176 -C 1000000 >"$TMP/kill-cli.out" 2>&1 &
  cp=$!
  PIDS+=("$cp")
  sleep 2
  kill -9 "$cp"
  wait "$sp" || rc=$?
  [ "$rc" != 124 ] && grep -q 'DISCONNECT EVENT' "$TMP/kill-srv.out" ||
    { echo "  server exit $rc"; return 1; }
}
check "client killed mid-transfer: the server sees DISCONNECTED" killed_client

# Nothing left behind (settled, above), and the work was counted.
check "no CM id, channel or verbs client left in A" settled "$SA"
check "  nor in B" settled "$SB"
no_groups() {  # no CM multicast membership left in A or B
  [ "$(counter "$SA" cm_mcast_groups)" = 0 ] &&
    [ "$(counter "$SB" cm_mcast_groups)" = 0 ]
}
if command -v mckey >/dev/null; then
  check "no multicast membership left in A or B" no_groups
fi
at_least() { [ "$(counter "$1" "$2")" -ge "$3" ]; }
check "A counted the connections it accepted" at_least "$SA" cm_connections 7
check "B counted a REJ received" at_least "$SB" cm_rej_rx 1
check "A counted the REJ it sent" at_least "$SA" cm_rej_tx 1
check "A held that REQ for a listener first" at_least "$SA" cm_req_hold_expired 1
finish
