# Shell helpers for the integration scripts (sourced, not run): a temp dir,
# processes stopped by PID on exit pass or fail, PASS/FAIL counting, and two
# urnicd joined by a net_memif pair. A script sets ID (unique per run)
# before calling these, and calls `finish` last.
#   lib_init            TMP dir, PIDS, counters, the EXIT trap
#   shim_test_init ID URNICD URNICCTL SHIM_SO URNIC_PERF   all of the start
#                       of a script that runs urnic-perf through the shim
#   check NAME CMD...   runs CMD, counts PASS/FAIL, says how long it took
#   stop_pid PID        TERM, KILL after 5 s, reaped
#   exits_within SECONDS PID   PID ended in time; its status in RC ("hung"
#                       and false if not)
#   stopped_clean LOG   after exits_within: urnicd exited 0, said
#                       "urnicd: stopped", and its LOG shows no crash
#   urnicd_start ROLE IP SOCK [urnicd options]   URNICD with the options
#                       every test service shares (IN_NS: in that netns);
#                       LAST_PID = the service
#   memif_start ROLE MAC IP SOCK [urnicd options]   LAST_PID = the service
#   memif_listening PATH   a memif server listens there (abstract or file)
#   veth_pair           two network namespaces joined by a veth pair
#                       (NS_A/IF_A, NS_B/IF_B), removed on exit
#   addr_ns VAR IP...   a network namespace (its name in VAR; removed on
#                       exit) whose interfaces carry these addresses, as a
#                       RoCE NIC's netdev carries its own: libfabric's verbs
#                       provider offers MSG endpoints only on a device
#                       whose address it finds on an interface
#   afp_start ROLE NS IFACE IP SOCK [urnicd options]  urnicd in NS on
#                       net_af_packet over IFACE (AFP_QPAIRS queue pairs,
#                       default 1); LAST_PID = the service
#   wait_sock SOCK      until a service answers there (10 s)
#   wait_link SOCK      until that service's port link is up (10 s)
#   counter SOCK NAME   a "totals"/"transport"/"port"/"shim" counter of
#                       stats --json (the first section that has it)
#   losses SOCK         that service's drop/refusal counters not 0, a line
#   wait_cm_listen SOCK N   until that service counted more than N
#                       rdma_listen calls
#   wait_tcp PORT [NS [PID]]  until a TCP socket listens on PORT (in netns
#                       NS; not past PID's death)
#   shim_preload SHIM   PRELOAD (the shim, after the sanitizer runtimes it
#                       needs in a sanitized build) and CLIENT_ENV for the
#                       clients started with it
#   as_client SOCK CMD...   CMD through the shim as a client of the service
#                       at SOCK, yielding between empty CQ polls

# shim_test_init ID URNICD URNICCTL SHIM_SO URNIC_PERF: the start of the
# scripts that run urnic-perf through the shim: ID, the four programs
# (URNICD URNICCTL SHIM UPERF), PY, root (else SKIP), shim_preload, lib_init.
shim_test_init() {
  ID=$1
  URNICD=$2
  URNICCTL=$3
  SHIM=$(realpath "$4")
  UPERF=$(realpath "$5")
  PY=/usr/bin/python3
  [ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
  shim_preload "$SHIM"
  lib_init
}

as_client() {
  local sock=$1
  shift
  env $CLIENT_ENV URNIC_SOCKET="$sock" LD_PRELOAD="$PRELOAD" \
    URNIC_POLL_YIELD=1 "$@"
}

shim_preload() {
  PRELOAD=$1
  for rt in $(ldd "$1" | awk '/lib(asan|ubsan)\.so/ {print $3}'); do
    PRELOAD="$rt $PRELOAD"
  done
  CLIENT_ENV=URNIC_PLAIN_BUILD=1
  if [ "$PRELOAD" != "$1" ]; then
    CLIENT_ENV=ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0
  fi
}

lib_init() {
  TMP=$(mktemp -d "/tmp/urnic-${ID:-it}.XXXXXX")
  PIDS=()
  NETNS=()
  pass=0
  fail=0
  trap lib_cleanup EXIT INT TERM
}

stop_pid() {
  local p=$1
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}

exits_within() {
  local t=$(($1 * 10))
  for _ in $(seq "$t"); do
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$2" 2>/dev/null; then
    RC=hung
    return 1
  fi
  RC=0
  wait "$2" || RC=$?
}

stopped_clean() {
  [ "$RC" = 0 ] && grep -q "urnicd: stopped" "$1" &&
    ! grep -qiE "segmentation|sanitizer|core dumped" "$1"
}

lib_cleanup() {
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && stop_pid "$p"; done
  for ns in "${NETNS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  if [ "$fail" -ne 0 ] || [ -n "${KEEP_LOGS:-}" ]; then
    for f in "$TMP"/*.log "$TMP"/*.out; do
      [ -f "$f" ] || continue
      echo "--- $f"
      # A sanitizer's report whole (its stack is what says where), else
      # the end of the log.
      if grep -q "Sanitizer" "$f"; then
        sed -n '/Sanitizer/,$p' "$f" | head -200
      else
        tail -n 30 "$f"
      fi
    done
  fi
  rm -rf "$TMP"
}

# Each line also says how long CMD took, so a slow check shows in the log
# (the suite has a time budget: README.md, "Tests").
check() {
  local name=$1 t0=$EPOCHREALTIME res=PASS
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    res=FAIL
    fail=$((fail + 1))
  fi
  local us=$((${EPOCHREALTIME/./} - ${t0/./}))
  echo "$res - $name ($((us / 1000000)).$((us / 100000 % 10)) s)"
}

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
}

# eal_prefix ROLE: the EAL file prefix urnicd_start gives a service.
eal_prefix() { echo "${ID:-it}-$1"; }
# eal_run_dir PREFIX: EAL's runtime directory of a prefix (root's, else
# the user's).
eal_run_dir() {
  if [ "$(id -u)" = 0 ]; then
    echo "/var/run/dpdk/$1"
  else
    echo "${XDG_RUNTIME_DIR:-/tmp}/dpdk/$1"
  fi
}

# urnicd_start ROLE IP SOCK [urnicd options]: URNICD (in network namespace
# $IN_NS if set) at IP/24 with its control socket at SOCK, worker lcore 1,
# yielding when idle, no periodic stats, log $TMP/urnicd-ROLE.log
# (appended). The options given (the port first) come after these.
# URNICD_ENV: VAR=value words for urnicd's environment (URNIC_CM_TRACE=1).
urnicd_start() {
  local role=$1 ip=$2 sock=$3 pre=()
  shift 3
  [ -n "${IN_NS:-}" ] && pre=(ip netns exec "$IN_NS")
  "${pre[@]}" env ${URNICD_ENV:-} "$URNICD" -o "port.ipv4=$ip/24" -o "control.socket=$sock" \
    -o "eal.main_lcore=0" -o "eal.workers=[1]" \
    -o "eal.file_prefix=$(eal_prefix "$role")" -o stats.period_ms=0 \
    -o lcores.idle.yield=true "$@" >>"$TMP/urnicd-$role.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# memif_listening PATH: a memif server listens at PATH. DPDK 22.11's memif
# makes it an abstract socket by default (no file: it shows in
# /proc/net/unix as @PATH); a file socket counts too.
memif_listening() {
  [ -S "$1" ] || grep -q " @$1\$" /proc/net/unix
}

# memif_start ROLE MAC IP SOCK [urnicd options]: urnicd_start on the memif
# pair in $TMP. A client waits (10 s at most) for the server's socket
# first: DPDK's memif client does not retry a connection refused at start.
memif_start() {
  local role=$1 mac=$2 ip=$3 sock=$4
  shift 4
  if [ "$role" = client ]; then
    for _ in $(seq 100); do
      memif_listening "$TMP/memif.sock" && break
      sleep 0.1
    done
  fi
  urnicd_start "$role" "$ip" "$sock" \
    -o "port.vdev=net_memif0,role=$role,socket=$TMP/memif.sock,id=0,mac=$mac" \
    "$@"
}

veth_pair() {
  local id=${ID:-it}-$$
  NS_A=urnic-$id-a
  NS_B=urnic-$id-b
  IF_A=u$$a
  IF_B=u$$b
  ip netns add "$NS_A"
  NETNS+=("$NS_A")
  ip netns add "$NS_B"
  NETNS+=("$NS_B")
  ip link add "$IF_A" netns "$NS_A" type veth peer name "$IF_B" netns "$NS_B"
  ip -n "$NS_A" link set lo up
  ip -n "$NS_A" link set "$IF_A" up
  ip -n "$NS_B" link set lo up
  ip -n "$NS_B" link set "$IF_B" up
}

addr_ns() {
  local var=$1 ns=urnic-${ID:-it}-$$-addr i=0
  shift
  ip netns add "$ns"
  NETNS+=("$ns")
  ip -n "$ns" link set lo up
  for a in "$@"; do
    # A veth pair per address, one end carrying it: the kernel here has no
    # dummy interfaces.
    i=$((i + 1))
    ip -n "$ns" link add "ad$i" type veth peer name "ap$i"
    ip -n "$ns" addr add "$a/32" dev "ad$i"
    ip -n "$ns" link set "ad$i" up
    ip -n "$ns" link set "ap$i" up
  done
  printf -v "$var" %s "$ns"
}

# afp_start ROLE NS IFACE IP SOCK [urnicd options]: urnicd_start in NS on
# net_af_packet over IFACE.
afp_start() {
  local role=$1 ns=$2 ifc=$3 ip=$4 sock=$5
  shift 5
  IN_NS=$ns urnicd_start "$role" "$ip" "$sock" \
    -o "port.vdev=net_af_packet0,iface=$ifc,qpairs=${AFP_QPAIRS:-1}" "$@"
}

wait_sock() {
  for _ in $(seq 100); do
    "$URNICCTL" -s "$1" stats >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

wait_link() {
  wait_sock "$1" || return 1
  for _ in $(seq 100); do
    "$URNICCTL" -s "$1" stats --json 2>/dev/null |
      /usr/bin/python3 -c "import json, sys
sys.exit(0 if json.load(sys.stdin)['port']['link_up'] else 1)" && return 0
    sleep 0.1
  done
  return 1
}

# wait_cm_listen SOCK COUNT: until the service at SOCK has counted more
# than COUNT rdma_listen calls (cm_listens; 10 s): a server is ready for its
# client, without a sleep that guesses how long a start takes.
wait_cm_listen() {
  for _ in $(seq 100); do
    [ "$(counter "$1" cm_listens)" -gt "$2" ] && return 0
    sleep 0.1
  done
  echo "  no rdma_listen at $1 within 10 s"
  return 1
}

# wait_tcp PORT [NETNS [PID]]: until a TCP socket listens on PORT (10 s;
# "" for NETNS: this one), or the server PID has died.
wait_tcp() {
  local pre=()
  [ -n "${2:-}" ] && pre=(ip netns exec "$2")
  for _ in $(seq 100); do
    "${pre[@]}" ss -Hltn "sport = :$1" | grep -q . && return 0
    [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null && break
    sleep 0.1
  done
  echo "  nothing listens on TCP port $1 within 10 s"
  return 1
}

# losses SOCK: the service's counters of frames and work requests dropped
# or refused that are not 0, on one line (a failed test's diagnosis).
losses() {
  "$URNICCTL" -s "$1" stats --json 2>/dev/null | /usr/bin/python3 -c "
import json, re, sys
j = json.load(sys.stdin)
out = []
for k in ('totals', 'transport', 'port'):
    for n, v in sorted(j.get(k, {}).items()):
        if isinstance(v, int) and v and not n.startswith('idle_') and re.search(
                'drop|no_|bad|missed|errors|full|malformed|timeout|nak|retr|refus|invalid|seq', n):
            out.append('%s %d' % (n, v))
print('  ' + '$1'.split('/')[-1] + ': ' + (', '.join(out) or 'no losses counted'))" || true
}
counter() {
  "$URNICCTL" -s "$1" stats --json | /usr/bin/python3 -c "
import json, sys
j = json.load(sys.stdin)
for k in ('totals', 'transport', 'port'):
    if '$2' in j.get(k, {}): print(j[k]['$2']); break
else:
    print(dict(j.get('shim') or {}).get('$2', -1))"
}
