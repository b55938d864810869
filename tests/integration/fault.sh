#!/usr/bin/env bash
# Integration: the port's fault-injection stage (config `fault`, urnicctl
# fault). Two urnicd joined by a net_memif pair (lossless by itself) or, with
# TOPO af_packet, by a veth pair between two network namespaces (the port
# kind users run on a lossy network), B started with TX loss from its
# config; urnic-perf --verify through the shim must deliver every byte
# through each fault, and the counters must say what the stage did and what
# the transport did about it:
#  - TX random + burst loss (config): retransmits on B, data verified;
#  - RX loss on B under 1 MiB READs: data verified, and A sends less than
#    twice the responses the READs need (a READ is asked for in pieces);
#  - at runtime (urnicctl fault): RX corruption on A (ICRC errors counted
#    as malformed), duplication (the responder's duplicates), reordering,
#    delay and a bottleneck rate with a small buffer (queue drops), and
#    ECN marking at the bottleneck (CNPs back, windows cut; on af_packet
#    the CNPs captured on the veth and decoded by tshark);
#  - 256 QPs into a 64 KiB buffer: the grants' floor gives way to the
#    losses and B resends less than a quarter of what it sends (it used to
#    resend ~88 %);
#  - bad runtime settings are refused with a message and change nothing;
#  - all zero: the stage is off again, a clean run resends nothing (memif
#    only: af_packet loses frames by itself when a receiving lcore is off
#    the CPU, so there the clean run is only verified);
#  - after all that, each service's lcores publish a shared congestion
#    window and count nothing in flight, no QP in flight or waiting for a
#    grant (urnicctl stats --json): every packet counted was uncounted.
# Every started process is stopped by PID on exit, pass or fail.
# usage: fault.sh URNICD URNICCTL SHIM_SO URNIC_PERF [memif|af_packet]
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
shim_test_init ft-$$ "$1" "$2" "$3" "$4"
TOPO=${5:-memif}

SA=$TMP/a.sock
SB=$TMP/b.sock
ON_A=(env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD")
ON_B=(env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD")

# A: the server side. B: the client, 1 % random loss plus 0.1 % bursts of 4
# on what it sends, from its config, with a fixed seed.
B_FAULT=(-o fault.seed=42 -o fault.tx.drop_ppm=10000 -o fault.tx.burst_ppm=1000
  -o fault.tx.burst_len=4)
case $TOPO in
  memif)
    memif_start server 02:00:00:8b:00:01 10.91.0.1 "$SA"
    memif_start client 02:00:00:8b:00:02 10.91.0.2 "$SB" "${B_FAULT[@]}"
    ;;
  af_packet)
    veth_pair
    afp_start server "$NS_A" "$IF_A" 10.91.0.1 "$SA"
    afp_start client "$NS_B" "$IF_B" 10.91.0.2 "$SB" "${B_FAULT[@]}"
    ;;
  *) echo "fault.sh: TOPO is memif or af_packet, not $TOPO"; exit 2 ;;
esac
wait_sock "$SA" && wait_sock "$SB"
check "B printed that fault injection is on, with its seed" \
  grep -q "fault injection on (seed 42)" "$TMP/urnicd-client.log"

port=18800
run() {  # run NAME [urnic-perf options]: a verified WRITE run between A and B
  local name=$1
  shift
  port=$((port + 1))
  "${ON_A[@]}" timeout 120 "$UPERF" --server -p "$port" -q 4 -s 16384 -D 1 \
    --warmup 0 --verify "$@" >"$TMP/$name-s.out" 2>&1 &
  local sp=$!
  PIDS+=("$sp")
  wait_tcp "$port" "" "$sp" || true  # the client then fails and says so
  local rc=0
  "${ON_B[@]}" timeout 120 "$UPERF" -p "$port" -q 4 -s 16384 -D 1 \
    --warmup 0 --verify --period 0 "$@" 127.0.0.1 >"$TMP/$name-c.out" 2>&1 ||
    rc=$?
  wait "$sp" || rc=$((rc ? rc : $?))
  [ $rc = 0 ] || { echo "$name: rc $rc"; tail -n 5 "$TMP/$name-c.out"; }
  return $rc
}
ctr() { counter "$1" "$2"; }
grew() {  # grew SOCK NAME BEFORE: the counter is above BEFORE now
  local now
  now=$(ctr "$1" "$2")
  [ "$now" -gt "$3" ] || { echo "$2 on $1: $3 -> $now"; return 1; }
}

r0=$(ctr "$SB" retransmits)
check "TX loss: a verified run completes" run loss
check "TX loss: the stage dropped frames (random)" grew "$SB" tx_fault_drop 0
check "TX loss: the stage dropped frames (bursts)" grew "$SB" tx_fault_burst_drop 0
check "TX loss: the requester retransmitted" grew "$SB" retransmits "$r0"

# Runtime: B's loss off, A corrupts 0.5 % of what it receives.
check "urnicctl fault shows the config's settings" \
  sh -c "'$URNICCTL' -s '$SB' fault | grep -qx 'fault.tx.drop_ppm=10000'"
check "urnicctl fault turns B's loss off" \
  "$URNICCTL" -s "$SB" fault tx.drop_ppm=0 tx.burst_ppm=0
# READ responses lost on B's RX: a READ larger than the window is asked
# for in several requests, so a lost response costs the rest of its
# request, not of the READ (one request per READ: one 4 MiB READ at 1 %
# loss had 92 % of its responses sent again, perf/README.md).
check "urnicctl fault sets RX loss on B" "$URNICCTL" -s "$SB" fault rx.drop_ppm=10000
a0=$(ctr "$SA" tx_packets)
c0=$(ctr "$SB" completions)
check "READ 1 MiB, responses lost: a verified run completes" \
  run read -o read -s 1048576 -q 2
check "READ: the stage dropped responses" grew "$SB" rx_fault_drop 0
responses_bounded() {  # A sent < 2x the responses B's READs needed
  local sent reads
  sent=$(($(ctr "$SA" tx_packets) - a0))
  reads=$(($(ctr "$SB" completions) - c0))
  echo "  A sent $sent packets for $reads READs of 1024 responses"
  [ "$reads" -gt 0 ] && [ "$sent" -lt $((2 * 1024 * reads)) ]
}
check "READ: A sent less than twice the responses the READs needed" \
  responses_bounded
check "urnicctl fault turns B's RX loss off" "$URNICCTL" -s "$SB" fault rx.drop_ppm=0
m0=$(ctr "$SA" malformed)
check "urnicctl fault sets RX corruption on A" \
  "$URNICCTL" -s "$SA" fault seed=7 rx.corrupt_ppm=5000
check "corruption: a verified run completes" run corrupt
check "corruption: frames corrupted" grew "$SA" rx_fault_corrupt 0
check "corruption: A counted them as malformed (ICRC)" grew "$SA" malformed "$m0"
check "urnicctl fault seed=0 draws a new random seed (config/README.md)" \
  sh -c "out=\$('$URNICCTL' -s '$SA' fault seed=0) &&
    echo \"\$out\" | grep -q '^fault.seed=[1-9]' &&
    ! echo \"\$out\" | grep -qx 'fault.seed=7'"

d0=$(ctr "$SA" rx_dup)
check "duplication and reordering on A's RX" "$URNICCTL" -s "$SA" fault \
  rx.corrupt_ppm=0 rx.duplicate_ppm=20000 rx.reorder_ppm=20000 rx.reorder_gap=3
check "dup/reorder: a verified run completes" run duprx
check "dup/reorder: frames duplicated" grew "$SA" rx_fault_duplicate 0
check "dup/reorder: frames reordered" grew "$SA" rx_fault_reorder 0
check "dup/reorder: the responder saw duplicates" grew "$SA" rx_dup "$d0"

check "delay and a 200 Mb/s bottleneck with a 32 KiB buffer on B's TX" \
  "$URNICCTL" -s "$SA" fault rx.duplicate_ppm=0 rx.reorder_ppm=0
check "  (set on B)" "$URNICCTL" -s "$SB" fault tx.delay_us=200 \
  tx.rate_mbps=200 tx.queue_kb=32
check "bottleneck: a verified run completes" run bottleneck
check "bottleneck: the full buffer dropped frames" grew "$SB" tx_fault_queue_drop 0

# ECN: the bottleneck marks CE above 8 KiB instead of waiting for a full
# buffer; A answers with CNPs, B's QPs cut their DCQCN rates on them (the
# default transport.cc.algorithm).
r0=$(ctr "$SB" cc_rate_cuts)
check "ECN marking above 8 KiB of a 256 KiB buffer on B's TX" \
  "$URNICCTL" -s "$SB" fault tx.delay_us=0 tx.queue_kb=256 tx.ecn_kb=8
# On af_packet the CNPs cross a veth, where a capture sees them: tshark (an
# independent RoCEv2 dissector) must read them as InfiniBand BTH opcode
# 0x81 (RoCEv2 Annex A17.9.3: PKey 0xffff, PSN 0, BECN set, a DestQP: the
# QP that sent the marked packet), sent not ECN-capable, none malformed.
# Wireshark 4.0 names no CNP: the 16 reserved bytes and the ICRC show as
# data, the byte with FECN/BECN as "reserved" (0x40: BECN).
# tools/bootstrap installs tshark (and its dumpcap): missing, the check
# fails rather than skips.
cap_pid=
if [ "$TOPO" = af_packet ]; then
  capture_tools() { command -v dumpcap && command -v tshark; }
  check "ECN: dumpcap and tshark are installed" capture_tools
  ip netns exec "$NS_B" dumpcap -q -i "$IF_B" -s 128 -c 200 \
    -f "udp dst port 4791 and udp[8] == 0x81" -w "$TMP/cnp.pcapng" \
    >"$TMP/dumpcap.log" 2>&1 &
  cap_pid=$!
  PIDS+=("$cap_pid")
  # dumpcap says "Capturing on" once its filter is set.
  for _ in $(seq 50); do
    grep -q "Capturing on" "$TMP/dumpcap.log" 2>/dev/null && break
    sleep 0.1
  done
fi
check "ECN: a verified run completes" run ecn
check "ECN: B's stage marked ECT frames CE" grew "$SB" tx_fault_ce_marked 0
check "ECN: A sent CNPs" grew "$SA" cnps_tx 0
check "ECN: B received CNPs" grew "$SB" cnps_rx 0
if [ "$TOPO" = af_packet ]; then
  kill -INT "$cap_pid" 2>/dev/null || true
  wait "$cap_pid" 2>/dev/null || true
  cnp_fields() {  # the captured CNPs as tshark decodes them, a line each
    tshark -n -r "$TMP/cnp.pcapng" -T fields -e infiniband.bth.opcode \
      -e infiniband.bth.p_key -e infiniband.bth.psn -e infiniband.bth.destqp \
      -e infiniband.reserved -e ip.dsfield.ecn -e _ws.malformed 2>/dev/null
  }
  cnps_decoded() {
    local n bad
    n=$(cnp_fields | wc -l)
    # opcode 129, PKey 65535, PSN 0, a DestQP, BECN, Not-ECT, not malformed
    bad=$(cnp_fields | awk -F'\t' '!($1 == 129 && $2 == 65535 && $3 == 0 &&
      $4 != "" && $4 != "0x00000000" && $5 == "40" && $6 == 0 && $7 == "")' |
      wc -l)
    echo "tshark read $n CNPs, $bad not as expected"
    cnp_fields | head -3
    [ "$n" -gt 0 ] && [ "$bad" = 0 ]
  }
  check "ECN: tshark decodes the captured CNPs (opcode 0x81, PKey 0xffff, PSN 0, BECN, Not-ECT)" \
    cnps_decoded
fi
check "ECN: B's DCQCN rates were cut" grew "$SB" cc_rate_cuts "$r0"
check "  (back to the small buffer, no marking)" "$URNICCTL" -s "$SB" fault \
  tx.queue_kb=32 tx.ecn_kb=0

# Many QPs into a buffer smaller than min_window packets each: the grants'
# floor (2 per QP with work, 512 packets here) gives way to the losses
# (CcParams::kFloorResentPct). It used to keep 512 packets in flight into
# 64 KiB and resend ~88 % of what it sent (a4b9197).
check "many QPs: 256 QPs into a 1 Gb/s port with a 64 KiB buffer on B" \
  "$URNICCTL" -s "$SB" fault tx.delay_us=0 tx.rate_mbps=1000 tx.queue_kb=64
r0=$(ctr "$SB" retransmits)
s0=$(ctr "$SB" tx_packets)
f0=$(ctr "$SB" cc_floor_drops)
check "many QPs: a verified run completes" run many -q 256 -D 2
check "many QPs: the floor gave way (cc_floor_drops)" grew "$SB" cc_floor_drops "$f0"
resent_share() {  # below 25 % of what B sent
  local r=$(($(ctr "$SB" retransmits) - r0)) s=$(($(ctr "$SB" tx_packets) - s0))
  echo "B resent $r of $s packets"
  [ $((r * 4)) -lt "$s" ]
}
check "many QPs: B resent less than a quarter of what it sent" resent_share
check "  (back to the 200 Mb/s port, its delay and its 32 KiB buffer)" \
  "$URNICCTL" -s "$SB" fault tx.delay_us=200 tx.rate_mbps=200 tx.queue_kb=32

# Bad settings: refused with a message, nothing changed.
bad() {  # bad WORDS...: urnicctl fails and says why
  local out
  if out=$("$URNICCTL" -s "$SB" fault "$@" 2>&1); then
    echo "accepted: $*"
    return 1
  fi
  echo "$out" | grep -q "fault" || { echo "no message: $out"; return 1; }
  "$URNICCTL" -s "$SB" fault | grep -qx "fault.tx.rate_mbps=200"
}
check "a probability above 1000000 ppm is refused" bad tx.drop_ppm=2000000
check "an unknown key is refused" bad tx.nosuch=1
check "a non-fault key is refused" bad port.mtu=9000
check "ecn_kb above queue_kb is refused" bad tx.ecn_kb=64
check "a word without a value is refused" bad tx.drop_ppm

check "all zero: the stage is off" "$URNICCTL" -s "$SB" fault tx.delay_us=0 \
  tx.rate_mbps=0 tx.queue_kb=256
r1=$(ctr "$SB" retransmits)
p1=$(ctr "$SB" tail_probes)
n1=$(ctr "$SB" naks_seq_rx)
t1=$(ctr "$SB" timeouts)
check "off: a verified run completes" run clean
if [ "$TOPO" = memif ]; then
  # A tail-loss probe may fire while the peer's lcore is off the CPU (one
  # packet each); anything else resent would mean a loss.
  check "off: nothing was lost (no sequence NAK, no timeout)" \
    test "$(ctr "$SB" naks_seq_rx)/$(ctr "$SB" timeouts)" = "$n1/$t1"
  check "off: nothing was resent but tail-loss probes" \
    test $(($(ctr "$SB" retransmits) - r1)) = $(($(ctr "$SB" tail_probes) - p1))
fi

cc_settled() {  # SOCK: within 2 s, every lcore: window > 0, nothing counted
  local out
  for _ in $(seq 20); do
    out=$("$URNICCTL" -s "$1" stats --json | $PY -c "
import json, sys
ls = json.load(sys.stdin)['lcores']
print(' '.join('lcore %d: window %d, in flight %d, QPs %d, waiting %d' % (
    l['lcore'], l['cc_shared_window'], l['cc_in_flight'], l['cc_active_qps'],
    l['cc_waiting_qps']) for l in ls))
sys.exit(0 if all(l['cc_shared_window'] > 0 and l['cc_in_flight'] == 0 and
                  l['cc_active_qps'] == 0 and l['cc_waiting_qps'] == 0
                  for l in ls) else 1)") && { echo "$out"; return 0; }
    sleep 0.1
  done
  echo "$out"
  return 1
}
check "B's shared window counts nothing in flight once the runs are over" \
  cc_settled "$SB"
check "A's likewise" cc_settled "$SA"

finish
