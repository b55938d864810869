#!/usr/bin/env bash
# The retransmit timer on a CPU the worker shares with a busy thread: two
# urnicd in two network namespaces on net_af_packet over a veth pair, both
# workers on CPU 1 beside a busy loop pinned there. B's port drops every
# frame it sends while a verified urnic-perf WRITE run starts, then stops
# dropping: only B's retransmit timer (Local ACK Timeout, 268 ms here) can
# find that loss, and the run must complete. Once with yield (the idle
# worker hands the CPU over at once) and once without (it sleeps).
# Until 2026-12-02 the worker counted the time a yield or a sleep took to
# come back as a pause of its own, and its timers' clock stood still that
# long (Engine::lcore_paused): beside a busy thread nearly all the time,
# so the timer fired seconds late (this run took 12-19 s, not 1) and a QP
# whose loss only the timer could find stalled while the CPU stayed busy.
# usage: shared_cpu.sh URNICD URNICCTL SHIM_SO URNIC_PERF
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
shim_test_init sc-$$ "$1" "$2" "$3" "$4"
[ "$(nproc)" -ge 2 ] || { echo "SKIP: needs 2 CPUs (workers on CPU 1)"; exit 77; }

SA=$TMP/a.sock
SB=$TMP/b.sock
ON_A=(env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD")
ON_B=(env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD")
veth_pair
taskset -c 1 bash -c 'while :; do :; done' &
PIDS+=($!)
port=19300

# run YIELD: both services with lcores.idle.yield=YIELD, the lossy start,
# the checks; the services are stopped after.
run() {
  local y=$1 rc t0 tmo0 ws wc pp paused0 paused
  afp_start "server-$y" "$NS_A" "$IF_A" 10.95.0.1 "$SA" \
    -o "lcores.idle.yield=$y"
  local pa=$LAST_PID
  afp_start "client-$y" "$NS_B" "$IF_B" 10.95.0.2 "$SB" \
    -o "lcores.idle.yield=$y"
  local pb=$LAST_PID
  wait_link "$SA" && wait_link "$SB"
  # A short clean run first: the neighbours are resolved before the loss.
  port=$((port + 1))
  "${ON_A[@]}" "$UPERF" --server -p "$port" >"$TMP/warm-$y-s.out" 2>&1 &
  ws=$!
  PIDS+=($ws)
  sleep 0.3
  rc=0
  "${ON_B[@]}" timeout 30 "$UPERF" -p "$port" -n 100 --warmup 0 --period 0 \
    127.0.0.1 >"$TMP/warm-$y-c.out" 2>&1 || rc=$?
  wait "$ws" || true
  check "yield=$y: a clean run first (rc $rc)" test $rc = 0
  tmo0=$(counter "$SB" timeouts)
  paused0=$(counter "$SB" lcore_paused_us)
  "$URNICCTL" -s "$SB" fault tx.drop_ppm=1000000 >/dev/null
  # Pings from A, 2000 a second, keep B's worker busy between yields (an
  # idle one goes on to sleep): until the run ends.
  ip netns exec "$NS_A" ping -q -i 0.0005 -w 60 10.95.0.2 >/dev/null 2>&1 &
  pp=$!
  PIDS+=($pp)
  port=$((port + 1))
  "${ON_A[@]}" "$UPERF" --server -p "$port" --verify \
    >"$TMP/loss-$y-s.out" 2>&1 &
  ws=$!
  PIDS+=($ws)
  sleep 0.3
  t0=$SECONDS
  # timeout 16: 268 ms; 7 retries cover the 0.6 s of loss.
  "${ON_B[@]}" timeout 30 "$UPERF" -p "$port" -s 4096 --verify -D 1 \
    --warmup 0 --period 0 --timeout 16 127.0.0.1 \
    >"$TMP/loss-$y-c.out" 2>&1 &
  wc=$!
  PIDS+=($wc)
  sleep 0.6
  "$URNICCTL" -s "$SB" fault tx.drop_ppm=0 >/dev/null
  rc=0
  wait "$wc" || rc=$?
  wait "$ws" || true
  stop_pid "$pp"
  paused=$((($(counter "$SB" lcore_paused_us) - paused0) / 1000))
  echo "shared_cpu: yield=$y: B's worker off the CPU beyond the idle it" \
    "chose: ${paused} ms of the run's $((SECONDS - t0)) s"
  check "yield=$y: the verified run completed after the loss (rc $rc; 124: hung), in $((SECONDS - t0)) s" \
    test $rc = 0
  check "yield=$y: B's retransmit timer found the loss" \
    test "$(counter "$SB" timeouts)" -gt "$tmo0"
  check "yield=$y: B's port dropped frames meanwhile" \
    test "$(counter "$SB" tx_fault_drop)" -gt 0
  # A yield is idle the worker chose, however long the busy loop kept the
  # CPU: its timers' clock runs on (those 1.5-12 s before the fix, 4-10 ms
  # after). Without yield a busy-polling worker is preempted, and those
  # pauses do stop the clock (late, never early: by design).
  if [ "$y" = true ]; then
    check "yield=true: B's timers stood still less than 1 s of it" \
      test "$paused" -lt 1000
  fi
  stop_pid "$pa"
  stop_pid "$pb"
}

run true
run false
finish
