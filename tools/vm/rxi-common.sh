# shellcheck shell=bash
# Sourced (bash) by rxiA.sh and rxiB.sh, the guest sides of tools/vm-rxe-interop.
# The caller sets ME (A|B), OTHER, PEER_MGMT (the other guest's management IP),
# ROCE_IP and PEER_ROCE (this guest's and the other's RoCE-link address)
# and, before run_tests, DEV, GIDX and VERBS (a command prefix, e.g. env with
# LD_PRELOAD for the shim; empty for rxe), and may define pre_test/post_test.
# Run directory: /share/rxi (the host's share/rxi); markers and outputs live there.
R=${RXI_DIR:-/share/rxi}
T_PROG=${T_PROG:-150}   # seconds any one verbs program may run
log() { echo "[$ME $(cut -d' ' -f1 /proc/uptime)] $*"; }
# waitfile NAME [SECONDS]: wait for $R/NAME; false on timeout or when a side aborted
waitfile() {
  local i=0
  while [ ! -f "$R/$1" ] && [ ! -f "$R/abort" ] && [ "$i" -lt "${2:-600}" ]; do sleep 1; i=$((i + 1)); done
  if [ -f "$R/$1" ]; then log "waited ${i}s for $1"; return 0; fi
  log "gave up on $1 after ${i}s$([ -f "$R/abort" ] && echo ' (abort)')"
  return 1
}
abort() { log "ABORT: $*"; echo "$ME: $*" >> "$R/abort"; }
# shellcheck disable=SC2012
ifname_of() { ls "/sys/bus/pci/devices/$1/net" 2>/dev/null | head -1; }
pre_test() { :; }
post_test() { :; }

# run_tests: every line of $R/tests.txt is "NAME SERVER PROGRAM ARGS...", SERVER
# A or B. Both guests walk the list in step: the server side starts PROGRAM
# with its device, GID index and -p PORT, waits until it listens and touches
# srv.N; the client side then runs it against the server's management IP.
# Each program runs under timeout $T_PROG; a server that outlives its client
# by 30 s is stopped. Output: $R/N.NAME.<A|B>-<server|client>.out, last line
# "rc=STATUS"; one line "RXI N NAME ROLE ME rc=STATUS" in the guest log.
run_tests() {
  local n=0 line name srv prog args port devargs out rc P i j role cm peer pa
  while read -r line <&3; do
    case "$line" in '' | '#'*) continue ;; esac
    [ -f "$R/abort" ] && { log "abort marker: stop testing"; break; }
    n=$((n + 1))
    read -r name srv prog args <<<"$line"
    port=$((18600 + n))
    # RDMA CM programs (rping, ucmatose, udaddy, perftest -R) connect to the
    # peer's RoCE address (ROCE_IP / PEER_ROCE), not the management one, and
    # listen on no TCP port: the server gets a few seconds instead of ss.
    cm=0 peer=$PEER_MGMT
    case "$prog $args " in
      rping* | ucmatose* | udaddy* | mckey* | *" -R "*) cm=1 peer=$PEER_ROCE ;;
    esac
    # udaddy's and mckey's -p is the port space, not the port: they keep
    # their default.
    pa="-p $port"
    [ "$prog" = udaddy ] || [ "$prog" = mckey ] && pa=
    case "$prog" in
      ibv_* | */sdr | */netfr) devargs="-d $DEV -g $GIDX" ;;
      rping) devargs= ;;
      ucmatose | udaddy | mckey) devargs="-b $ROCE_IP" ;;
      *) devargs="-d $DEV -x $GIDX" ;;
    esac
    pre_test "$n" "$name"
    if [ "$srv" = "$ME" ]; then
      role=server
      out=$R/$n.$name.$ME-server.out
      [ "$prog" = rping ] && devargs="-s -a $ROCE_IP"
      echo "+ $prog $devargs $args $pa" > "$out"
      log "test $n $name: server: $prog $devargs $args $pa"
      # shellcheck disable=SC2086
      timeout "$T_PROG" $VERBS "$prog" $devargs $args $pa >> "$out" 2>&1 &
      P=$!
      i=0
      if [ "$cm" = 1 ]; then
        sleep 8; i=16
      else
        while ! ss -Hltn "sport = :$port" | grep -q . && kill -0 "$P" 2>/dev/null && [ "$i" -lt 120 ]; do
          sleep 0.5; i=$((i + 1))
        done
      fi
      log "server listening after $((i / 2)) s (alive: $(kill -0 "$P" 2>/dev/null && echo yes || echo no))"
      touch "$R/srv.$n"
      j=0
      while kill -0 "$P" 2>/dev/null; do
        if [ -f "$R/cdone.$n" ]; then
          j=$((j + 1))
          [ "$j" = 30 ] && { log "server outlives its client by 30 s: TERM"; kill -TERM "$P"; }
        fi
        sleep 1
      done
      rc=0; wait "$P" || rc=$?
      echo "rc=$rc" >> "$out"
      touch "$R/sdone.$n"
      waitfile "cdone.$n" 240 || true
    else
      role=client
      out=$R/$n.$name.$ME-client.out
      waitfile "srv.$n" 300 || true
      sleep 1
      local dest=$peer
      case "$prog" in
        rping) devargs="-c -a $peer" dest= ;;
        ucmatose | udaddy) devargs="-s $peer" dest= ;;
        # mckey: the "server" receives (joined first), the client sends to
        # the group the test names.
        mckey) devargs="-b $ROCE_IP -s" dest= ;;
      esac
      echo "+ $prog $devargs $args $pa $dest" > "$out"
      log "test $n $name: client: $prog $devargs $args $pa $dest"
      rc=0
      # shellcheck disable=SC2086
      timeout "$T_PROG" $VERBS "$prog" $devargs $args $pa $dest >> "$out" 2>&1 || rc=$?
      echo "rc=$rc" >> "$out"
      touch "$R/cdone.$n"
      waitfile "sdone.$n" 240 || true
    fi
    echo "RXI $n $name $role $ME rc=$rc"
    tail -n 6 "$out" | sed 's/^/    /'
    post_test "$n" "$name"
    # both sides are through test N before either starts N+1
    touch "$R/$ME.post.$n"
    waitfile "$OTHER.post.$n" 300 || true
  done 3< "$R/tests.txt"
  log "tests done ($n)"
}
