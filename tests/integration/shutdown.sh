#!/usr/bin/env bash
# Integration: urnicd stops cleanly with live QPs and comes back at once.
# Two urnicd (A, B) joined by a net_memif pair. For 0, 1, 1024 and 16384
# QPs (URNIC_SHUTDOWN_QPS changes the list):
# a urnic-perf pair runs through the shim (A serves, B's client streams
# WRITEs on every QP), then SIGTERM to B's urnicd:
#  - B exits 0 ("urnicd: stopped", no crash) within 30 s;
#  - B's application is told and exits (non-zero) with a message, no hang;
#  - B restarts on the same socket and file prefix and serves a verified
#    urnic-perf run at once; A released every object of the dead pair.
# A's SIGTERM leaves no EAL runtime directory behind (/var/run/dpdk/PREFIX).
# Then: kill -9 of B and a restart over its stale socket; a configuration
# whose worker lcores EAL does not have is refused at start (exit 2).
# usage: shutdown.sh URNICD URNICCTL SHIM_SO URNIC_PERF
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
shim_test_init sd-$$ "$1" "$2" "$3" "$4"
# Under the sanitizers 16384 QPs take minutes to set up: the list stops at
# 1024 there unless URNIC_SHUTDOWN_QPS says otherwise.
QPS_LIST=${URNIC_SHUTDOWN_QPS:-0 1 1024 16384}
ldd "$URNICD" | grep -q libasan && QPS_LIST=${URNIC_SHUTDOWN_QPS:-0 1 1024}

SA=$TMP/a.sock
SB=$TMP/b.sock
start_a() { memif_start server 02:00:00:8a:00:01 10.90.0.1 "$SA"; PA=$LAST_PID; }
start_b() { memif_start client 02:00:00:8a:00:02 10.90.0.2 "$SB"; PB=$LAST_PID; }
# A verbs program on service A or B: "${ON_A[@]}" CMD... (a simple command,
# so that $! of a background one is the program's own pid).
ON_A=(env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD")
ON_B=(env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD")
counter_b() { counter "$SB" "$1"; }
export -f counter counter_b
export URNICCTL SB
objects_zero() {  # no verbs object left on service SOCK
  local n
  for _ in $(seq 100); do
    n=$("$URNICCTL" -s "$1" stats --json | $PY -c "
import json, sys
s = json.load(sys.stdin)['shim']
print(s['qps'] + s['mrs'] + s['cqs'] + s['pds'])")
    [ "$n" = 0 ] && return 0
    sleep 0.1
  done
  echo "service $1 still has $n objects"; "$URNICCTL" -s "$1" objects
  return 1
}
verified_run() {  # a short verified urnic-perf run between A and B
  local port=$1
  "${ON_A[@]}" timeout 60 "$UPERF" --server -p "$port" -q 4 -s 4096 -D 1 \
    --warmup 0 --verify >"$TMP/v$port-s.out" 2>&1 &
  local sp=$!
  PIDS+=("$sp")
  wait_tcp "$port" "" "$sp" || true
  local rc=0
  "${ON_B[@]}" timeout 60 "$UPERF" -p "$port" -q 4 -s 4096 -D 1 --warmup 0 \
    --verify --period 0 127.0.0.1 >"$TMP/v$port-c.out" 2>&1 || rc=$?
  wait "$sp" || rc=$((rc ? rc : $?))
  return $rc
}

start_a
for _ in $(seq 100); do memif_listening "$TMP/memif.sock" && break; sleep 0.1; done
start_b
wait_sock "$SA" && wait_sock "$SB"

# stream N PORT: a urnic-perf pair streaming WRITEs on N QPs from B to A
# until stopped (16384 QPs: two 1 KiB WRITEs in flight each); sp and cp
# are its server and client, checked connected and moving data.
# 16384 QPs use the Local ACK Timeout middleware picks for many QPs (18,
# 1.07 s; NCCL and Open MPI default to 18..20), not urnic-perf's 14 (67
# ms): with the lcores of this test time-sharing 2 vCPUs with a loaded
# machine, a QP of 16384 went 8 x 67 ms without an ACK once (all its
# resends were duplicates), failed with retry exceeded before urnicd
# stopped, and this test, about the stop, failed (perf/README.md).
stream() {
  local n=$1 port=$2 up=0 args=(-q "$1" -s 4096 -D 600 --warmup 0)
  [ "$n" -gt 1024 ] &&
    args=(-q "$n" -s 1024 --depth 2 -D 600 --warmup 0 --timeout 18)
  "${ON_A[@]}" "$UPERF" --server -p "$port" -q "$n" >"$TMP/n$n-s.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  wait_tcp "$port" "" "$sp" || true
  "${ON_B[@]}" "$UPERF" -p "$port" "${args[@]}" --period 500 127.0.0.1 \
    >"$TMP/n$n-c.out" 2>&1 &
  cp=$!
  PIDS+=("$cp")
  for _ in $(seq 1200); do
    grep -q "QPs up\|Mops\|Gb/s" "$TMP/n$n-c.out" 2>/dev/null && { up=1; break; }
    kill -0 "$cp" 2>/dev/null || break
    sleep 0.1
  done
  check "$n QPs: the application is connected and moving data" \
    bash -c "[ $up = 1 ] && [ \$(counter_b tx_packets) -gt 0 ]"
  sleep 1
}

# app_ended WHAT N PATTERN: after B's urnicd went, the streaming client of
# `stream N` ended by itself (not hung, non-zero) saying PATTERN, and A
# released every object of the pair.
app_ended() {
  local what=$1 n=$2 pattern=$3
  exits_within 15 "$cp" || kill -KILL "$cp" 2>/dev/null || true
  check "$what: the application ended by itself (status $RC) and said why" \
    bash -c "[ '$RC' != hung ] && [ '$RC' != 0 ] &&
      grep -qiE '$pattern' '$TMP/n$n-c.out'"
  stop_pid "$sp"
  check "$what: service A released every object of the pair" objects_zero "$SA"
}

port=18700
for n in $QPS_LIST; do
  port=$((port + 1))
  [ "$n" -gt 0 ] && stream "$n" "$port"
  kill -TERM "$PB"
  exits_within 60 "$PB" || true
  check "$n QPs: urnicd exits 0 on SIGTERM, no crash (status $RC)" \
    stopped_clean "$TMP/urnicd-client.log"
  [ "$n" -gt 0 ] &&
    app_ended "$n QPs" "$n" 'urnicd is shutting down|lost the connection|flush'
  mv "$TMP/urnicd-client.log" "$TMP/urnicd-client-$n.log"
  t0=$(date +%s%N)
  start_b
  check "$n QPs: a restarted urnicd answers on the same socket" wait_sock "$SB"
  echo "  (restart to answering: $((($(date +%s%N) - t0) / 1000000)) ms)"
  check "$n QPs: and serves a verified urnic-perf run" verified_run $((port + 100))
done

# kill -9 under traffic: B's application, which only polls its CQs and
# posts (no event thread, no control call), hears it from the shim's look
# at the control connection, and ends by itself; the stale socket file is
# removed by the next start.
stream 4 18800
kill -KILL "$PB"
wait "$PB" 2>/dev/null || true
app_ended "kill -9 of urnicd, a polling application" 4 'lost the connection'
check "after kill -9 the socket file is left behind" test -S "$SB"
mv "$TMP/urnicd-client.log" "$TMP/urnicd-client-kill9.log"
start_b
check "a new urnicd starts over the stale socket and answers" wait_sock "$SB"
check "... and serves a verified run" verified_run 18900

check "A's EAL runtime directory is there while it runs" \
  test -d "$(eal_run_dir "$(eal_prefix server)")"
kill -TERM "$PA" "$PB"
exits_within 30 "$PA" || true
check "service A exits 0 on SIGTERM" stopped_clean "$TMP/urnicd-server.log"
exits_within 30 "$PB" || true
check "... and leaves no EAL runtime directory behind (its prefix's)" \
  bash -c "! test -e '$(eal_run_dir "$(eal_prefix server)")'"

# A configuration EAL accepts but urnicd cannot run: refused, not a hang.
cfg_rc=0
timeout 30 "$URNICD" -o "port.vdev=net_memif0,role=server,socket=$TMP/x.sock,id=0" \
  -o "control.socket=$TMP/x-ctl.sock" -o "eal.file_prefix=$ID-x" \
  -o "eal.workers=[1,2]" -o "eal.extra_args=[--lcores=0@0,1@1,2@1]" \
  >"$TMP/badlcores.out" 2>&1 || cfg_rc=$?
check "worker lcores EAL does not have: refused at start (exit $cfg_rc)" \
  bash -c "[ $cfg_rc = 2 ] && grep -q \"EAL did not take argument '1@1'\" '$TMP/badlcores.out'"
cfg_rc=0
timeout 30 "$URNICD" -o "port.vdev=net_memif0,role=server,socket=$TMP/x.sock,id=0" \
  -o "control.socket=$TMP/x-ctl.sock" -o "eal.file_prefix=$ID-x" \
  -o "eal.workers=[1,2]" -o "eal.extra_args=['--lcores=0@0,1@1']" \
  >"$TMP/badlcores2.out" 2>&1 || cfg_rc=$?
check "a worker lcore missing from --lcores: refused at start (exit $cfg_rc)" \
  bash -c "[ $cfg_rc = 2 ] && grep -q 'worker lcore 2 is not an EAL lcore' '$TMP/badlcores2.out'"
check "... nor a runtime directory" bash -c "! test -e '$(eal_run_dir "$ID-x")'"

finish
