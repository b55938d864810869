#!/usr/bin/env bash
# Integration: urnicd stops cleanly while EAL's interrupt thread is inside a
# PMD's control handler. Two urnicd on a net_memif pair (A the server, B the
# client); one of them runs with tests/support/intr_delay.cc preloaded, so
# that its interrupt thread takes DELAY_US in every read of memif's control
# socket (as on a loaded host) and its exit is held a second after
# rte_eal_cleanup (a handler running late would show). Then the other dies
# and the delayed one is told to stop: its interrupt thread reads the peer's
# EOF while its main thread closes the port (before the fix: SEGV in
# memif_intr_handler; then in the interrupt thread after rte_eal_cleanup).
# It must exit 0 with no crash ("urnicd: stopped", no sanitizer report):
#  - the client killed (SIGKILL), SIGTERM to the delayed server 20 ms later;
#  - the server killed, SIGTERM to the delayed client 20 ms later;
#  - SIGTERM to both at once (the server delayed); both exit 0.
# Each case checks that the delay was in force (the library says so).
# usage: shutdown_race.sh URNICD URNICCTL INTR_DELAY_SO
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
ID=sr-$$
URNICD=$1
URNICCTL=$2
DELAY_SO=$(realpath "$3")
DELAY_US=${URNIC_RACE_DELAY_US:-200000}
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
lib_init

# The delayed one's environment, words for urnicd_start's URNICD_ENV. In a sanitized
# build the sanitizer runtimes go first in LD_PRELOAD (ASan insists); the
# list is colon-separated, so it stays one word.
D_PRELOAD=$DELAY_SO
for rt in $(ldd "$DELAY_SO" | awk '/lib(asan|ubsan)\.so/ {print $3}'); do
  D_PRELOAD="$rt:$D_PRELOAD"
done
D_ENV="LD_PRELOAD=$D_PRELOAD URNIC_TEST_INTR_DELAY_US=$DELAY_US"
D_ENV+=" URNIC_TEST_EXIT_HOLD_US=1000000"
[ "$D_PRELOAD" != "$DELAY_SO" ] &&
  D_ENV+=" ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:verify_asan_link_order=0"

SA=$TMP/a.sock
SB=$TMP/b.sock

# pair DELAYED: the memif server (A) and client (B) up, the interrupt
# thread of DELAYED (server or client) delayed; links up, then a second for
# memif's control channel to go quiet.
pair() {
  URNICD_ENV=
  [ "$1" = server ] && URNICD_ENV=$D_ENV
  memif_start server 02:00:00:8b:00:01 10.92.0.1 "$SA"
  PA=$LAST_PID
  URNICD_ENV=
  [ "$1" = client ] && URNICD_ENV=$D_ENV
  memif_start client 02:00:00:8b:00:02 10.92.0.2 "$SB"
  PB=$LAST_PID
  URNICD_ENV=
  wait_link "$SA" && wait_link "$SB" && sleep 1
}

# MODE DELAYED: kill-X kills X with SIGKILL and stops the delayed one
# 20 ms later; both stops the two at once.
for c in "kill-client server" "kill-server client" "both server"; do
  read -r mode delayed <<<"$c"
  check "$mode: the pair is up, the $delayed's interrupt thread delayed" \
    pair "$delayed"
  if [ "$delayed" = server ]; then
    me=$PA other=$PB
  else
    me=$PB other=$PA
  fi
  if [ "$mode" = both ]; then
    kill -TERM "$PA" "$PB"
  else
    kill -KILL "$other"
    sleep 0.02
    kill -TERM "$me"
  fi
  exits_within 30 "$me" || true
  check "$mode: the $delayed exits 0 on SIGTERM, no crash (status $RC)" \
    stopped_clean "$TMP/urnicd-$delayed.log"
  check "$mode: the delay was in force" grep -q \
    "intr_delay: interrupt thread's recvmsg delayed" "$TMP/urnicd-$delayed.log"
  if [ "$mode" = both ]; then
    exits_within 30 "$other" || true
    check "$mode: the client exits 0 on SIGTERM, no crash (status $RC)" \
      stopped_clean "$TMP/urnicd-client.log"
  fi
  stop_pid "$PA"
  stop_pid "$PB"
  for r in server client; do mv "$TMP/urnicd-$r.log" "$TMP/urnicd-$r-$mode.log"; done
done

finish
