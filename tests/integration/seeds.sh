#!/usr/bin/env bash
# Integration: the seed programs (perf/sdr, perf/netfr; perf/README.md
# "Seed programs") through the verbs shim, unmodified, across two urnicd
# joined by a net_memif pair: the receiver (server) on service A, the
# sender (client) on service B, their TCP side channel on 127.0.0.1, every
# byte checked (--verify):
#  - sdr over RC; sdr over UC with 2 % of the chunk posts skipped on
#    purpose (--drop-ppm 20000): every message recovered by selective
#    resend (resends > 0);
#  - netfr with 1 KiB and with 64 KiB frames;
#  - --cm (set-up with RDMA CM: the receiver listens on service A's
#    address 10.95.0.1, the sender resolves it; parameters and memory in
#    the CM private data, the control messages in SENDs): sdr over RC and
#    netfr, both QPs connected; no CM id left behind;
#  - a byte corrupted at the sender (SEEDS_CORRUPT): both ends exit 5;
#    the receiver killed mid-run: the sender exits 3 and says why.
# Every started process is stopped by PID on exit, pass or fail.
# usage: seeds.sh URNICD URNICCTL SHIM_SO SDR NETFR
set -euo pipefail
URNICD=$1
URNICCTL=$2
SHIM=$(realpath "$3")
SDR=$(realpath "$4")
NETFR=$(realpath "$5")
ID=seeds-$$
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
shim_preload "$SHIM"
lib_init

SA=$TMP/a.sock
SB=$TMP/b.sock
memif_start server 02:00:00:00:95:01 10.95.0.1 "$SA"
memif_start client 02:00:00:00:95:02 10.95.0.2 "$SB"
check "the memif pair's links are up" wait_link "$SA"
check "  on both services" wait_link "$SB"

# A verbs program on service A or B: "${ON_A[@]}" CMD... (a simple command,
# so that $! of a background one is the program's own pid). The programs
# poll cooperatively: 2 urnicd workers and 2 pollers may share 2 CPUs.
# shellcheck disable=SC2206
ON_A=(env $CLIENT_ENV URNIC_SOCKET="$SA" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)
# shellcheck disable=SC2206
ON_B=(env $CLIENT_ENV URNIC_SOCKET="$SB" LD_PRELOAD="$PRELOAD" URNIC_POLL_YIELD=1)

port=18700
# run NAME PROG ARGS...: the receiver on A, then the sender on B with the
# same arguments (it retries its connection while the receiver starts)
# and $HOST (default 127.0.0.1: the TCP side channel); RC_R and RC_S are
# their exit codes. Extra environment (SEEDS_CORRUPT) goes to the sender
# only.
run() {
  local name=$1 prog=$2
  shift 2
  port=$((port + 1))
  "${ON_A[@]}" timeout 30 "$prog" -p $port --period 0 "$@" \
    >"$TMP/$name-r.out" 2>&1 &
  RP=$!
  PIDS+=("$RP")
  RC_S=0
  # shellcheck disable=SC2086
  "${ON_B[@]}" ${SENDER_ENV:-} timeout 30 "$prog" -p $port --period 0 "$@" \
    "${HOST:-127.0.0.1}" >"$TMP/$name-s.out" 2>&1 || RC_S=$?
  RC_R=0
  wait "$RP" || RC_R=$?
}

# pair NAME PROG ARGS...: run; both ends exit 0 and the receiver checked
# every byte. Prints the receiver's rate and latency lines.
pair() {
  local name=$1
  run "$@"
  grep -hE '^  (Rate|Latency|Completion latency)' "$TMP/$name-r.out" |
    sed "s/^ /  $name:/"
  if [ "$RC_R" != 0 ] || [ "$RC_S" != 0 ] ||
    ! grep -q '^  Verified: every byte' "$TMP/$name-r.out"; then
    echo "  receiver exit $RC_R, sender exit $RC_S"
    tail -n 3 "$TMP/$name-r.out" "$TMP/$name-s.out"
    return 1
  fi
}

check "sdr over RC: 300 x 64 KiB in 1 KiB chunks, --verify" \
  pair sdr-rc "$SDR" -n 300 --verify
check "sdr over UC, 2 % of chunk posts skipped: 300 x 64 KiB, --verify" \
  pair sdr-uc "$SDR" -n 300 --uc --drop-ppm 20000 --verify
check "  ... every message complete at the receiver" \
  grep -q '^  RX-messages: 300 ' "$TMP/sdr-uc-r.out"
check "  ... by selective resend (resent chunks > 0)" \
  grep -qE '^  Dropped-on-purpose: [1-9][0-9]* +Resent-chunks: [1-9]' \
  "$TMP/sdr-uc-s.out"
grep -h '^  Dropped-on-purpose' "$TMP/sdr-uc-s.out" | sed 's/^ /  sdr-uc:/'
check "netfr 1 KiB frames over two QPs, in order, --verify" \
  pair netfr-1k "$NETFR" -s 1024 -n 5000 --verify
check "netfr 64 KiB frames over two QPs, in order, --verify" \
  pair netfr-64k "$NETFR" -s 65536 -n 500 --verify
check "  ... the receiver delivered all 500 (over both QPs)" \
  grep -qE '^  RX-frames: 500 +QP0: 250 +QP1: 250 ' "$TMP/netfr-64k-r.out"

# cm_pair NAME PROG ARGS...: pair with --cm: the receiver listens on
# service A's address (10.95.0.1), the sender is given that address.
cm_pair() {
  local name=$1 prog=$2
  shift 2
  HOST=10.95.0.1 pair "$name" "$prog" --cm -b 10.95.0.1 "$@" &&
    grep -q ', RDMA CM$' "$TMP/$name-r.out" &&
    grep -q ', RDMA CM$' "$TMP/$name-s.out"
}
check "sdr --cm over RC: RDMA CM set-up, 300 x 64 KiB, --verify" \
  cm_pair sdr-cm "$SDR" -n 300 --verify
check "netfr --cm: two QPs = two CM connections, 500 x 64 KiB, --verify" \
  cm_pair netfr-cm "$NETFR" -s 65536 -n 500 --verify
check "  ... frames delivered over both QPs" \
  grep -qE '^  RX-frames: 500 +QP0: 250 +QP1: 250 ' "$TMP/netfr-cm-r.out"

# corrupt NAME PROG ARGS...: the sender flips a byte of message/frame 5.
corrupt() {
  local name=$1
  SENDER_ENV=SEEDS_CORRUPT=5 run "$@"
  if [ "$RC_R" != 5 ] || [ "$RC_S" != 5 ] ||
    ! grep -q 'verification failed' "$TMP/$name-r.out" ||
    ! grep -q 'not sent' "$TMP/$name-s.out"; then
    echo "  receiver exit $RC_R, sender exit $RC_S"
    tail -n 3 "$TMP/$name-r.out" "$TMP/$name-s.out"
    return 1
  fi
  tail -n 1 "$TMP/$name-r.out" | sed 's/^/  /'
}
check "sdr --verify catches a corrupted byte: both ends exit 5" \
  corrupt sdr-bad "$SDR" -n 50 --uc --verify
check "netfr --verify catches a corrupted byte: both ends exit 5" \
  corrupt netfr-bad "$NETFR" -s 4096 -n 50 --verify

# The receiver killed mid-run: the sender exits 3 with a line saying so.
lost() {
  port=$((port + 1))
  "${ON_A[@]}" "$SDR" -p $port --period 0 --uc -n 10000000 \
    >"$TMP/lost-r.out" 2>&1 &
  local rp=$!
  PIDS+=("$rp")
  "${ON_B[@]}" timeout 30 "$SDR" -p $port --period 0 --uc -n 10000000 \
    127.0.0.1 >"$TMP/lost-s.out" 2>&1 &
  local sp=$!
  PIDS+=("$sp")
  sleep 1
  kill -KILL "$rp"
  wait "$rp" 2>/dev/null || true
  local rc=0
  wait "$sp" || rc=$?
  tail -n 1 "$TMP/lost-s.out" | sed 's/^/  /'
  [ "$rc" = 3 ] && grep -q '^sdr: peer lost' "$TMP/lost-s.out"
}
check "sdr sender exits 3 (peer lost) when its receiver is killed" lost

# The --cm runs left no RDMA CM id behind (within 5 s of their end).
settled() {
  for _ in $(seq 50); do
    [ "$(counter "$1" cm_ids)" = 0 ] && return 0
    sleep 0.1
  done
  echo "  $1: cm_ids $(counter "$1" cm_ids)"
  return 1
}
check "no RDMA CM id left in service A" settled "$SA"
check "  nor in service B" settled "$SB"

finish
