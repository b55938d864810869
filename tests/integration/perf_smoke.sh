#!/usr/bin/env bash
# Integration: the benchmark path, briefly (numbers are not checked: that
# is perf/run-suite's job on a quiet machine). Two urnicd in the root
# namespace joined by a net_memif pair (socket in a private temp dir) with a
# 64-slot memif ring and a 4096-packet window, so the sender's TX ring
# fills up:
#  - ib_write_bw through the shim: nothing dropped, nothing lost (no NAK,
#    no timeout; only tail-loss probes resent),
#    the TX ring was full at times (back-pressure, not loss);
#  - urnic-perf (perf/urnic-perf) through the shim: WRITE/READ/SEND/atomic
#    runs with --verify over several QPs and TBB threads, its JSON parses
#    and carries the service's counters, and a corrupted payload is caught;
#    a run whose sending service is stopped (SIGSTOP) 3 x 150 ms completes
#    verified and times nothing out;
#  - urnicctl qps pages through 300 held QPs, each shown with the owning
#    client's pid;
#  - kill -9 of the urnic-perf server mid-run: the client fails with a
#    message, and both services release every object;
#  - perf/verbs-setup (perf/control-path's timer) runs through the shim,
#    prints every verb in its JSON, and leaves nothing behind.
# Every started process is stopped by PID on exit, pass or fail.
# usage: perf_smoke.sh URNICD URNICCTL SHIM_SO URNIC_PERF [VERBS_SETUP]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
command -v ib_write_bw >/dev/null || { echo "SKIP: perftest not installed"; exit 77; }
shim_test_init ps-$$ "$@"

SA=$TMP/a.sock
SB=$TMP/b.sock
start() {  # start ROLE MAC IP SOCK [OPTIONS]: a 64-slot memif ring (rsize=6)
  urnicd_start "$1" "$3" "$4" \
    -o "port.vdev=net_memif0,role=$1,socket=$TMP/memif.sock,id=0,mac=$2,rsize=6" \
    -o transport.max_unacked=4096 "${@:5}"
}
# Service A's worker pauses when idle, B's yields (lcores.idle.yield).
start server 02:00:00:89:00:01 10.89.0.1 "$SA" -o lcores.idle.yield=false
# The memif client connects once the server's socket exists.
for _ in $(seq 100); do memif_listening "$TMP/memif.sock" && break; sleep 0.1; done
start client 02:00:00:89:00:02 10.89.0.2 "$SB"
PB=$LAST_PID
for _ in $(seq 100); do
  [ -S "$SA" ] && [ -S "$SB" ] && grep -q "link up" "$TMP/urnicd-server.log" && break
  sleep 0.1
done
ctl() { "$URNICCTL" -s "$1" "${@:2}"; }

# A verbs program on service A or B: "${ON_A[@]}" CMD... (a simple command,
# so that $! of a background one is the program's own pid).
ON_A=(env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD")
ON_B=(env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD")
pair() {  # pair NAME SERVER_CMD -- CLIENT_CMD: server on A, client on B
  local name=$1 s=() c=()
  shift
  while [ "$1" != -- ]; do s+=("$1"); shift; done
  shift
  c=("$@")
  "${ON_A[@]}" timeout 60 "${s[@]}" >"$TMP/$name-s.out" 2>&1 &
  local sp=$!
  PIDS+=($sp)
  # The client starts once the server listens on its -p port (perftest's
  # default when none is given).
  local i port=18515
  for ((i = 0; i < ${#s[@]} - 1; i++)); do [ "${s[i]}" = -p ] && port=${s[i + 1]}; done
  wait_tcp "$port" "" "$sp" || true
  local rc=0
  "${ON_B[@]}" timeout 60 "${c[@]}" 127.0.0.1 >"$TMP/$name-c.out" 2>&1 || rc=$?
  wait $sp || rc=$((rc ? rc : $?))
  return $rc
}

mbufs_avail() {  # mbufs_avail SOCK: free mbufs of the service's pool
  ctl "$1" stats --json | $PY -c "import json,sys; print(json.load(sys.stdin)['port']['mbufs_avail'])"
}
IDLE_A=$(mbufs_avail "$SA")
IDLE_B=$(mbufs_avail "$SB")
no_leak() {  # every mbuf is back once traffic stops (64: RX bursts in flight)
  local s a idle
  for s in A B; do
    [ $s = A ] && { a=$(mbufs_avail "$SA"); idle=$IDLE_A; } ||
      { a=$(mbufs_avail "$SB"); idle=$IDLE_B; }
    [ $((idle - a)) -le 64 ] || { echo "service $s: $a free mbufs, $idle when idle"; return 1; }
  done
}

# 1. Back-pressure: a 4096-packet window into a 64-slot memif ring.
check "ib_write_bw 64 KiB, 2000 messages, through the shim" \
  pair bw ib_write_bw -d urnic0 -x 0 -s 65536 -n 2000 -- \
  ib_write_bw -d urnic0 -x 0 -s 65536 -n 2000
check "the sender's TX ring filled up (tx_ring_full > 0)" \
  test "$(counter "$SB" tx_ring_full)" -gt 0
check "no frame dropped at TX (tx_dropped = 0 on both)" \
  test "$(counter "$SA" tx_dropped)$(counter "$SB" tx_dropped)" = 00
# A tail-loss probe may fire while the peer's lcore is off the CPU (one
# packet each; slow under ASan); anything else resent would mean a loss.
check "nothing lost (no sequence NAK, no timeout: back-pressure, not loss; $(counter "$SB" naks_seq_rx)/$(counter "$SB" timeouts))" \
  test "$(counter "$SB" naks_seq_rx)/$(counter "$SB" timeouts)" = 0/0
check "nothing resent but tail-loss probes ($(counter "$SB" retransmits) = $(counter "$SB" tail_probes))" \
  test "$(counter "$SB" retransmits)" = "$(counter "$SB" tail_probes)"
check "no mbuf leaked by refused frames (pool back to its idle count)" no_leak

# 2. urnic-perf through the shim.
uperf() {  # uperf NAME ARGS...: server on A, client on B, JSON of the client
  local name=$1
  shift
  pair "$name" "$UPERF" --server -p 18600 "$@" -- \
    "$UPERF" -p 18600 --json "$TMP/$name.json" --urnicd "$SB" "$@"
}
json_ok() {  # json_ok FILE PYTHON-EXPR over j (the client's JSON)
  $PY -c "import json,sys; j=json.load(open('$1')); sys.exit(0 if ($2) else 1)"
}
for op in write write_imm read send; do
  check "urnic-perf $op bw, 16 QPs x 2 threads, --verify" \
    uperf "$op" -o $op -m bw -s 4096 -q 16 -t 2 -D 1 --warmup 0 --verify
  check "urnic-perf $op: ops > 0, no errors, service counters present" \
    json_ok "$TMP/$op.json" \
    "j['results'][0]['ops'] > 0 and j['results'][0]['errors'] == 0 and j['results'][0]['verify_errors'] == 0 and j['service'] is not None"
done
# The sender's service off the CPU mid-stream (SIGSTOP, 150 ms, three
# times; urnic-perf's Local ACK Timeout is 67 ms): its timers stand still
# meanwhile (Engine::lcore_paused), so the ACKs waiting in its ring are
# read, not timed out.
stopped_run() {
  local t0 x0 x1 x2 x3 rc=0 pp
  t0=$(counter "$SB" timeouts)
  x0=$(counter "$SB" tx_packets)
  # 4 s: the stops end ~3 s in, and the check below wants sending after
  # them (with 3 s a slow host's sleeps and urnicctl calls once ate the
  # margin: 0 packets after, the run already over).
  pair stopped "$UPERF" --server -p 18603 -o write -m bw -s 4096 -q 16 -D 4 \
    --warmup 0 --verify -- "$UPERF" -p 18603 -o write -m bw -s 4096 -q 16 \
    -D 4 --warmup 0 --verify &
  pp=$!
  sleep 1.5
  x1=$(counter "$SB" tx_packets)
  for _ in 1 2 3; do
    kill -STOP "$PB"
    sleep 0.15
    kill -CONT "$PB"
    sleep 0.3
  done
  x2=$(counter "$SB" tx_packets)
  wait "$pp" || rc=$?
  x3=$(counter "$SB" tx_packets)
  STOP_TIMEOUTS=$(($(counter "$SB" timeouts) - t0))
  # Sending before the first stop and after the last: they fell in the run.
  STOP_SENT="$((x1 - x0)) before, $((x3 - x2)) after"
  STOP_IN_RUN=$(((x1 > x0) && (x3 > x2)))
  return $rc
}
check "urnic-perf write, 16 QPs, --verify, its service stopped 3 x 150 ms" \
  stopped_run
check "... which was sending through the stops (packets: $STOP_SENT)" \
  test "$STOP_IN_RUN" = 1
check "... and it timed nothing out ($STOP_TIMEOUTS timeouts)" \
  test "$STOP_TIMEOUTS" = 0
# The programs poll cooperatively here (the shim's URNIC_POLL_YIELD).
with_yield() { (
  export URNIC_POLL_YIELD=8
  "$@"
); }
check "urnic-perf fetch_add latency, polling with yield (URNIC_POLL_YIELD)" \
  with_yield uperf fa -o fetch_add -m lat -s 8 -n 2000
check "urnic-perf latency JSON is ordered" json_ok "$TMP/fa.json" \
  "(lambda l: l['min'] <= l['median'] <= l['p99'] <= l['p999'] <= l['max'])(j['results'][0]['latency_us'])"
# Both programs wait on completion channels (-e) instead of polling, and
# the client signals one WR in 4 or 8: a run's end (or -n) must still
# retire every WR (an unsignaled tail once hung the client at the end).
# Batches of 3 never fill the 64-WR queue, so its last WR is often
# unsignaled when the run ends: without the closing signaled WR this hangs.
check "urnic-perf send bw, 16 QPs x 2 threads, completion channels (-e), --cq-mod 4, --batch 3, --verify" \
  uperf ev -o send -m bw -s 4096 -q 16 -t 2 -D 1 --warmup 0 --verify -e --cq-mod 4 --batch 3
check "... ops > 0, no errors, the run says it waited on events" \
  json_ok "$TMP/ev.json" \
  "j['events'] and j['results'][0]['ops'] > 0 and j['results'][0]['errors'] == 0 and j['results'][0]['verify_errors'] == 0"
check "urnic-perf write, -n 500 on 4 QPs, -e, --cq-mod 8: every op completes" \
  uperf evn -o write -m bw -s 4096 -q 4 -n 500 -e --cq-mod 8
check "... 2000 ops counted" json_ok "$TMP/evn.json" \
  "j['results'][0]['ops'] == 2000 and j['results'][0]['errors'] == 0"
corrupt_run() {  # the client flips a payload byte: the server must see it
  ! (
    export URNIC_PERF_CORRUPT=1
    pair corrupt "$UPERF" --server -p 18601 -o send -m bw -s 4096 -D 1 \
      --warmup 0 --verify -- "$UPERF" -p 18601 -o send -m bw -s 4096 -D 1 \
      --warmup 0 --verify
  )
}
check "urnic-perf --verify catches a corrupted payload (non-zero exit)" corrupt_run
check "... and counts it" grep -q "fail verification" "$TMP/corrupt-s.out"

# 3. urnicctl qps pages through 300 held QPs.
"${ON_A[@]}" "$UPERF" --server -p 18602 >"$TMP/hold-s.out" 2>&1 &
HS=$!
PIDS+=($HS)
wait_tcp 18602 "" $HS || true
"${ON_B[@]}" "$UPERF" -p 18602 -q 300 --hold 30 127.0.0.1 >"$TMP/hold-c.out" 2>&1 &
HC=$!
PIDS+=($HC)
for _ in $(seq 300); do
  [ "$(ctl "$SB" qps --json 2>/dev/null | $PY -c "
import json, sys
print(sum(len(json.loads(l)['qps']) for l in sys.stdin if l.strip()))" 2>/dev/null)" = 300 ] && break
  sleep 0.1
done
check "urnicctl qps --json: 300 QPs over two pages, each owned by the client's pid" \
  bash -c "'$URNICCTL' -s '$SB' qps --json | $PY -c \"
import json, sys
pages = [json.loads(l) for l in sys.stdin if l.strip()]
rows = [dict(zip(p['qp_fields'], r)) for p in pages for r in p['qps']]
ok = len(pages) == 2 and len(rows) == 300 and all(r['pid'] == $HC for r in rows)
ok = ok and pages[0]['lcores'][0]['qps'] == 300
sys.exit(0 if ok else 1)\""
check "urnicctl qps (text) lists the 300 QPs" \
  test "$(ctl "$SB" qps | grep -c '^ *0x')" = 300
stop_pid $HC
stop_pid $HS

# 4. kill -9 of the server mid-run; the client fails with a message.
"${ON_A[@]}" "$UPERF" --server -p 18603 -o write -m bw -s 65536 -q 4 -D 20 \
  >"$TMP/kill-s.out" 2>&1 &
KS=$!
PIDS+=($KS)
wait_tcp 18603 "" $KS || true
"${ON_B[@]}" "$UPERF" -p 18603 -o write -m bw -s 65536 -q 4 -D 20 \
  127.0.0.1 >"$TMP/kill-c.out" 2>&1 &
KC=$!
PIDS+=($KC)
sleep 3
kill -KILL $KS
t_kill=$SECONDS
wait $KS 2>/dev/null || true  # reaped (and no "Killed" line)
rc=0
wait $KC || rc=$?
check "the client exits non-zero after its server is killed (rc $rc)" \
  test $rc -ne 0 -a $((SECONDS - t_kill)) -lt 15
check "... and says why" grep -qE "peer closed|completion error" "$TMP/kill-c.out"
# released SOCK: the service holds no verbs object (within 5 s).
released() {
  for _ in $(seq 50); do
    ctl "$1" objects | grep -q "^device: pds 0 mrs 0 cqs 0 srqs 0 ahs 0 qps 0" && return 0
    sleep 0.1
  done
  return 1
}
for s in "$SA" "$SB"; do
  check "service $(basename "$s" .sock) released every object" released "$s"
done

# 5. --server --loop outlives clients that are killed mid-run (soaks keep
# one server): three killed clients, then a verified run on the same server.
"${ON_A[@]}" "$UPERF" --server --loop -p 18604 >"$TMP/loop-s.out" 2>&1 &
LS=$!
PIDS+=($LS)
wait_tcp 18604 "" $LS || true
for i in 1 2 3; do
  "${ON_B[@]}" "$UPERF" -p 18604 -q 2 -s 4096 -D 30 --warmup 0 --period 0 \
    127.0.0.1 >"$TMP/loop-c$i.out" 2>&1 &
  LC=$!
  sleep 2
  kill -KILL $LC
  wait $LC 2>/dev/null || true
done
check "urnic-perf --server --loop serves a verified run after 3 killed clients" \
  "${ON_B[@]}" timeout 60 "$UPERF" -p 18604 -q 2 -s 4096 -D 1 --warmup 0 \
  --period 0 --verify 127.0.0.1
check "... and said each killed session ended" \
  test "$(grep -c "session ended" "$TMP/loop-s.out")" = 3
stop_pid $LS

# 6. verbs-setup: 50 QPs created, connected to themselves, destroyed; MRs
# and CQs. Its numbers are not checked, only that it ran every verb.
VSETUP=${5:-}
vsetup() { "${ON_A[@]}" timeout 60 "$VSETUP" -n 50 --json >"$TMP/vs.json"; }
if [ -n "$VSETUP" ]; then
  check "verbs-setup -n 50: exit 0" vsetup
  check "... its JSON has every verb, 50 QPs" $PY -c "
import json, sys
d = json.loads(open('$TMP/vs.json').read().splitlines()[-1])
verbs = ('ibv_create_qp', 'modify INIT', 'modify RTR', 'modify RTS', 'ibv_destroy_qp',
         'ibv_reg_mr', 'ibv_dereg_mr', 'ibv_reg_mr new', 'ibv_create_cq', 'ibv_destroy_cq')
sys.exit(0 if d['qps'] == 50 and d['per_qp_us'] > 0 and
         all(d[v]['mean_us'] > 0 and d[v]['p99_us'] >= d[v]['p50_us'] for v in verbs) else 1)"
  check "... and service A holds nothing after it" released "$SA"
fi

check "no mbuf leaked over the whole run" no_leak

finish
