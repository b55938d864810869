#!/usr/bin/env bash
# Integration: an idle worker waits for events instead of polling or
# sleeping a fixed time (dataplane/service/wake.h), and nothing that should
# wake it is slept through. Two urnicd on net_af_packet over a veth pair
# between two namespaces, each with two workers on two queues (the kernel's
# fanout spreads flows over the queues by hash, so frames land on the
# other worker's queue and are handed over: that worker rings its peer's
# bell), each worker waiting at its first empty poll
# (spin_polls 0, pause_polls 0, no yield) so that every exchange below
# goes through a wait, for up to 10 s (lcores.idle.wait_ms=10000): a
# wake-up lost would cost 10 s and show as a wait that timed out.
#  - idle, no QP, then an ibv_rc_pingpong server holding a QP: for 2 s the
#    worker takes no timed sleep and polls fewer than 2000 times (a
#    polling worker polls millions of times, a sleeping one ~40 000);
#  - an 8 B SEND ping-pong (2000 exchanges, 100 us apart; the client's
#    post rings its service's bell, the frame wakes the other) and WRITE
#    and READ 64 KiB on 8 QPs, data checked: both ends exit 0, the workers
#    waited (idle_waits), the server's workers woken by frames
#    (idle_wakes_rx), frames handed between workers (roce_handoff), and
#    no wait ran out (idle_wait_timeouts; in a run slowed past the wait's
#    bound, no exchange took half of it);
#  - SIGTERM while the worker waits: the service exits 0 at once;
#  - a third service on net_null, whose port cannot wake it: timed sleeps
#    as before (no QP, quiet: lcores.idle.no_qp_sleep_us; a QP: sleep_us).
# Every started process is stopped by PID on exit, pass or fail.
# usage: idle_wake.sh URNICD URNICCTL SHIM_SO URNIC_PERF
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
shim_test_init iw-$$ "$@"

SA=$TMP/a.sock
SB=$TMP/b.sock
SC=$TMP/c.sock
WAIT_MS=10000 # a wait's bound
EAGER=(-o lcores.idle.yield=false -o lcores.idle.spin_polls=0
  -o lcores.idle.pause_polls=0 -o lcores.idle.wait_ms=$WAIT_MS)
TWO=(-o 'eal.workers=[1,2]' -o 'eal.extra_args=["--lcores=0@0,1@1,2@1"]')
veth_pair
export AFP_QPAIRS=2
afp_start a "$NS_A" "$IF_A" 10.97.0.1 "$SA" "${EAGER[@]}" "${TWO[@]}"
PID_A=$LAST_PID
afp_start b "$NS_B" "$IF_B" 10.97.0.2 "$SB" "${EAGER[@]}" "${TWO[@]}"
wait_link "$SA"
wait_link "$SB"
check "A's log: idle workers wait for events, woken by the PMD's socket" \
  grep -q "idle workers wait for events (a frame: the PMD's socket)" \
  "$TMP/urnicd-a.log"

# window SOCK: how far the service's idle counters moved in 2 s, in
# D[idle_sleeps] D[idle_sleeps_no_qp] D[idle_waits] D[poll_idle].
declare -A D
IDLE_CTRS=(idle_sleeps idle_sleeps_no_qp idle_waits poll_idle)
window() {
  local c line=
  declare -A b
  for c in "${IDLE_CTRS[@]}"; do b[$c]=$(counter "$1" "$c"); done
  sleep 2
  for c in "${IDLE_CTRS[@]}"; do
    D[$c]=$(($(counter "$1" "$c") - b[$c]))
    line+="$c +${D[$c]}  "
  done
  echo "$line"
}
# idle SOCK: for 2 s, no timed sleep of either kind and < 2000 polls.
idle() {
  window "$1"
  [ "${D[idle_sleeps]}" = 0 ] && [ "${D[idle_sleeps_no_qp]}" = 0 ] &&
    [ "${D[poll_idle]}" -lt 2000 ]
}
check "A, no QP: the worker waits (no timed sleep, < 2000 polls in 2 s)" idle "$SA"
hold() {  # idle SOCK while an ibv_rc_pingpong server holds a QP there
  local p rc=0
  ip netns exec "$NS_A" timeout 60 env $CLIENT_ENV LD_PRELOAD="$PRELOAD" \
    URNIC_SOCKET="$1" ibv_rc_pingpong -d urnic0 -g 0 -p 18611 \
    >"$TMP/hold.out" 2>&1 &
  p=$!
  PIDS+=("$p")
  for _ in $(seq 100); do
    [ "$(counter "$1" qps)" = 1 ] && break
    sleep 0.1
  done
  [ "$(counter "$1" qps)" = 1 ] || { echo "no QP held"; rc=1; }
  [ $rc = 0 ] && { "$2" "$1" || rc=1; }
  stop_pid "$p" || true
  return $rc
}
check "A, one QP held: the worker waits all the same" hold "$SA" idle

# lcores SOCK: a line per worker lcore, "lcore waits timed_out frames"
# (frames: RoCE frames received from its queue, and frames sent; not
# the kernel's own TCP frames of urnic-perf's set-up, which the PMD's
# socket sees too).
lcores() {
  "$URNICCTL" -s "$1" stats --json | /usr/bin/python3 -c "
import json, sys
for l in json.load(sys.stdin)['lcores']:
    print(l['lcore'], l['idle_waits'], l['idle_wait_timeouts'],
          l['roce_rx'] + l['tx_packets'])"
}
# moved NAME BEFORE AFTER: prints how each lcore's counters moved; sets W
# to the waits and T to the waits timed out, of all of them.
moved() {
  local out
  out=$(/usr/bin/python3 - "$@" <<'PY'
import sys
name, a, b = sys.argv[1:4]
rows = lambda t: {int(f[0]): list(map(int, f[1:])) for f in
                  (l.split() for l in t.splitlines())}
a, b = rows(a), rows(b)
waits, timed_out, words = 0, 0, []
for k in sorted(b):
    w, t, f = (b[k][i] - a.get(k, [0, 0, 0])[i] for i in range(3))
    waits += w
    timed_out += t
    words.append(f"lcore {k} waits +{w} timed out +{t} frames +{f}")
print(waits, timed_out, f"{name}: " + ", ".join(words))
PY
  )
  read -r W T MOVED_TEXT <<<"$out"
  echo "$MOVED_TEXT"
}
port=19300
WAIT_US=$((WAIT_MS * 1000))
# run NAME MIN_WAITS CLIENT_ARGS...: a verified urnic-perf run B -> A (the
# server's own options in SRV); both ends exit 0, each service waited at
# least MIN_WAITS times, no wait timed out, and (a latency run) no
# exchange took half the wait's bound. A fault-settings command parks
# every worker first (the settings stay as they are), ending the waits
# begun before the run, so a wait that runs out before the run ends slept
# through something: unless the run took longer than the bound, when a
# worker no frame reached (the other queue's, for one QP's flow) runs out
# for want of work. Then the waits timed out are shown, not judged; a
# wake-up slept through still shows as an exchange that took the bound,
# or as a client that failed (retry exceeded).
run() {
  local name=$1 min=$2 rc=0 sp a0 b0 a1 b1 t0 us ok=1 max
  shift 2
  port=$((port + 1))
  t0=${EPOCHREALTIME/./}
  "$URNICCTL" -s "$SA" fault rx.drop_ppm=0 >/dev/null
  "$URNICCTL" -s "$SB" fault rx.drop_ppm=0 >/dev/null
  a0=$(lcores "$SA")
  b0=$(lcores "$SB")
  ip netns exec "$NS_A" env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD" \
    timeout 60 "$UPERF" --server -p "$port" --period 0 --verify $SRV \
    >"$TMP/$name-s.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  wait_tcp "$port" "$NS_A" "$sp" || rc=1
  ip netns exec "$NS_B" env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD" \
    timeout 60 "$UPERF" -p "$port" --period 0 --verify "$@" 10.97.0.11 \
    >"$TMP/$name-c.out" 2>&1 || rc=$?
  wait "$sp" || rc=$((rc ? rc : $?))
  a1=$(lcores "$SA")
  b1=$(lcores "$SB")
  us=$((${EPOCHREALTIME/./} - t0))
  tail -n 2 "$TMP/$name-c.out"
  echo "exit $rc, $((us / 1000)) ms"
  moved A "$a0" "$a1"
  [ "$W" -ge "$min" ] || ok=0
  local ta=$T
  moved B "$b0" "$b1"
  [ "$W" -ge "$min" ] || ok=0
  if [ "$us" -lt "$WAIT_US" ]; then
    [ $((ta + T)) = 0 ] || ok=0
  elif [ $((ta + T)) != 0 ]; then
    echo "  the run took longer than a wait's bound: its waits timed out not judged"
  fi
  # A latency run's row (its header has min[us]): #bytes #ops min median
  # p99 p99.9 max, in us.
  max=
  grep -q 'min\[us\]' "$TMP/$name-c.out" &&
    max=$(awk '$1 ~ /^[0-9]+$/ && NF >= 7 {print int($7)}' "$TMP/$name-c.out" | tail -n 1)
  if [ -n "$max" ] && [ "$max" -ge $((WAIT_US / 2)) ]; then
    echo "  an exchange took $max us"
    ok=0
  fi
  [ $rc = 0 ] && [ $ok = 1 ]
}
ip -n "$NS_A" addr add 10.97.0.11/24 dev "$IF_A"
ip -n "$NS_B" addr add 10.97.0.12/24 dev "$IF_B"
SRV="-o send -m lat -s 8"
R0=$(counter "$SA" idle_wakes_rx)
check "SEND ping-pong, 2000 x 8 B 100 us apart: every exchange wakes both workers" \
  run pp 1000 -o send -m lat -s 8 -n 2000 --gap 100
rx_woke() {  # A (the server) was woken by its ring socket, not only bells
  local r
  r=$(counter "$SA" idle_wakes_rx)
  echo "A's idle_wakes_rx $R0 -> $r"
  [ $((r - R0)) -ge 500 ]
}
check "  frames woke A's waiting worker (idle_wakes_rx)" rx_woke
SRV=
H0=$(($(counter "$SA" roce_handoff) + $(counter "$SB" roce_handoff)))
check "WRITE 64 KiB, 8 QPs, 2 s, verified: no wait slept through" \
  run write 1 -o write -q 8 -s 65536 -D 2 --warmup 0
check "READ 64 KiB, 8 QPs, 2 s, verified: no wait slept through" \
  run read 1 -o read -q 8 -s 65536 -D 2 --warmup 0
# 8 QPs on two queues: the odds that every flow of both directions landed
# on its home's queue are 2^-16.
handed() {
  local h
  h=$(($(counter "$SA" roce_handoff) + $(counter "$SB" roce_handoff)))
  echo "roce_handoff (A + B) $H0 -> $h"
  [ "$h" -gt "$H0" ]
}
check "  frames were handed between workers, and no hand-off's wake was lost" \
  handed

# One QP's ping-pong, six times, each a new QP: with two queues, a QP's
# frames land on its home's queue or, by the fanout's hash, all on the
# other's; then the home hears of them only through its hand-off ring and
# sleeps through them (10 s) unless the worker that handed them over rings
# its bell. The odds that all six QPs land home on both services: 4^-6.
singles() {
  local i h0 h1 any=0
  for i in 1 2 3 4 5 6; do
    h0=$(($(counter "$SA" roce_handoff) + $(counter "$SB" roce_handoff)))
    run "single$i" 100 -o send -m lat -s 8 -n 300 --gap 200 || return 1
    h1=$(($(counter "$SA" roce_handoff) + $(counter "$SB" roce_handoff)))
    echo "  roce_handoff +$((h1 - h0))"
    [ $((h1 - h0)) -gt 100 ] && any=1
  done
  [ $any = 1 ]
}
SRV="-o send -m lat -s 8"
check "six 1-QP ping-pongs, 300 x 8 B 200 us apart: frames handed to a waiting worker wake it" \
  singles
SRV=

stops() {  # SIGTERM while A's worker waits (10 s): gone within 3 s, exit 0
  local rc=0
  idle "$SA" >/dev/null || true  # waiting by now
  kill -TERM "$PID_A"
  for _ in $(seq 30); do
    kill -0 "$PID_A" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$PID_A" 2>/dev/null; then
    echo "still running 3 s after SIGTERM"
    return 1
  fi
  wait "$PID_A" || rc=$?
  echo "exit $rc"
  [ $rc = 0 ]
}
check "A stops on SIGTERM at once though its worker waits (exit 0)" stops

# A port that cannot wake its worker (net_null): timed sleeps, the long
# ones once the device has had no QP and no work for a second.
urnicd_start c 10.98.0.1 "$SC" -o port.vdev=net_null0,no-rx=1 \
  -o lcores.idle.yield=false
wait_sock "$SC"
check "C's log: idle workers sleep timed sleeps, net_null cannot wake them" \
  grep -q "idle workers sleep timed sleeps (net_null has no RX wake-up source)" \
  "$TMP/urnicd-c.log"
sleeps_move() {  # SOCK SHORT LONG: in one of ten 0.5 s windows each kind rose (1) or not (0)
  local s0 l0 s1 l1
  for _ in $(seq 10); do
    s0=$(counter "$1" idle_sleeps) l0=$(counter "$1" idle_sleeps_no_qp)
    sleep 0.5
    s1=$(counter "$1" idle_sleeps) l1=$(counter "$1" idle_sleeps_no_qp)
    echo "idle_sleeps $s0 -> $s1, idle_sleeps_no_qp $l0 -> $l1"
    [ "$((s1 > s0))" = "$2" ] && [ "$((l1 > l0))" = "$3" ] && return 0
  done
  return 1
}
check "C (net_null), no QP: the long timed sleeps only, no wait" \
  sleeps_move "$SC" 0 1
short_only() {  # SOCK: one strict 2 s window: short sleeps only
  window "$1"
  [ "${D[idle_sleeps]}" -gt 0 ] && [ "${D[idle_sleeps_no_qp]}" = 0 ] &&
    [ "${D[idle_waits]}" = 0 ]
}
check "C (net_null), one QP held: the short timed sleeps only" \
  hold "$SC" short_only
check "C (net_null): the long sleeps again once the QP is gone" \
  sleeps_move "$SC" 0 1
finish
