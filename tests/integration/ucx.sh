#!/usr/bin/env bash
# Integration: UCX and Open MPI, unmodified Debian 12 packages, on urnic
# through the verbs shim.
#  Two services in two namespaces (net_af_packet over a veth pair, urnicd at
#  10.97.0.1 and .2; kernel addresses .11 and .12 on the same veth carry
#  ucx_perftest's TCP exchange):
#   - ucx_info -d lists urnic0:1 with rc_verbs and ud_verbs;
#   - ucx_perftest across the services: UCP tag_lat and tag_bw with
#     UCX_TLS=rc_v (rc_verbs, ud_verbs for wire-up) and with ud_v; UCT
#     put_bw and am_lat on rc_verbs, am_lat on ud_verbs. Both ends exit 0
#     and each service's RoCE counters moved;
#   - UCP's client/server connection (tests/shim/ucp_sockaddr: a
#     ucp_listener on urnic's address, UCX's rdmacm connection manager),
#     every byte checked.
#  Two services joined by a net_memif pair (one namespace: mpirun reaches
#  its ranks over loopback), one rank on each:
#   - Open MPI 4.1, --mca pml ucx, UCX_TLS=rc_v (no shared memory, no TCP):
#     tests/shim/mpi_check's ping-pong (1 B..4 MiB), allreduce and one-sided
#     calls (osc ucx: puts, gets, atomics, MPI_Rget) with every byte
#     checked; both services' RoCE counters moved. The same over
#     libfabric: pml cm, mtl ofi on verbs;ofi_rxm, osc pt2pt. Then UCX's with
#     the fault stage on both ports (1 % loss, duplicates, reordering):
#     verified again, and less than twice the clean run's bytes sent.
# ucx_perftest checks no data; mpi_check does.
# Every started process is stopped by PID on exit, pass or fail.
# usage: ucx.sh URNICD URNICCTL SHIM_SO [MPI_CHECK|""] [UCP_SOCKADDR]
set -euo pipefail
URNICD=$1
URNICCTL=$2
SHIM=$(realpath "$3")
MPI_CHECK=${4:+$(realpath "$4")}
UCP_SOCKADDR=${5:+$(realpath "$5")}
ID=ucx-$$
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }
for p in ucx_info ucx_perftest; do
  command -v "$p" >/dev/null || { echo "SKIP: $p not installed (ucx-utils)"; exit 77; }
done
shim_preload "$SHIM"
lib_init

# --- two namespaces, af_packet ----------------------------------------------
veth_pair
ip -n "$NS_A" addr add 10.97.0.11/24 dev "$IF_A"
ip -n "$NS_B" addr add 10.97.0.12/24 dev "$IF_B"
SA=$TMP/a.sock
SB=$TMP/b.sock
afp_start a "$NS_A" "$IF_A" 10.97.0.1 "$SA"
afp_start b "$NS_B" "$IF_B" 10.97.0.2 "$SB"
check "both services up, links up" wait_link "$SA"
check "  on both services" wait_link "$SB"

on() {  # on NS SOCK CMD...: CMD in NS as a client of the service at SOCK
  local ns=$1 sock=$2
  shift 2
  ip netns exec "$ns" env $CLIENT_ENV URNIC_SOCKET="$sock" \
    LD_PRELOAD="$PRELOAD" UCX_NET_DEVICES=urnic0:1 URNIC_POLL_YIELD=1 "$@"
}

lists() {  # lists TL: ucx_info -d shows TL on urnic0:1
  on "$NS_A" "$SA" ucx_info -d >"$TMP/info.out" 2>&1 || return 1
  grep -A1 "Transport: $1\$" "$TMP/info.out" | grep -q 'Device: urnic0:1'
}
check "ucx_info -d lists urnic0:1 with rc_verbs" lists rc_verbs
check "ucx_info -d lists urnic0:1 with ud_verbs" lists ud_verbs

port=13600
perftest() {  # perftest NAME ENV... -- ARGS...: server in A, client in B
  local name=$1 envs=()
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  port=$((port + 1))
  local rx0 rx1
  rx0=$(counter "$SA" roce_rx)
  on "$NS_A" "$SA" env "${envs[@]}" timeout 60 ucx_perftest -p "$port" "$@" \
    >"$TMP/$name-s.out" 2>&1 &
  local sp=$!
  PIDS+=("$sp")
  # The server listens once its UCX context is up.
  wait_tcp "$port" "$NS_A" "$sp" || true
  local rc=0
  on "$NS_B" "$SB" env "${envs[@]}" timeout 60 ucx_perftest -p "$port" "$@" \
    10.97.0.11 >"$TMP/$name-c.out" 2>&1 || rc=$?
  wait "$sp" || rc=$((rc ? rc : $?))
  rx1=$(counter "$SA" roce_rx)
  grep -h '^Final:' "$TMP/$name-c.out" | sed "s/^/  $name /"
  [ "$rc" = 0 ] && grep -q '^Final:' "$TMP/$name-c.out" &&
    [ "$rx1" -gt $((rx0 + 100)) ] || {
    tail -n 5 "$TMP/$name-s.out" "$TMP/$name-c.out"
    return 1
  }
}

for tls in rc_v ud_v; do
  check "ucx_perftest tag_lat, UCX_TLS=$tls, across two services" \
    perftest "tag_lat-$tls" UCX_TLS=$tls -- -t tag_lat -n 100
  check "ucx_perftest tag_bw 64 KiB, UCX_TLS=$tls, across two services" \
    perftest "tag_bw-$tls" UCX_TLS=$tls -- -t tag_bw -s 65536 -n 300
done
check "ucx_perftest put_bw 64 KiB on rc_verbs (UCT)" \
  perftest put_bw-rc -- -d urnic0:1 -x rc_verbs -t put_bw -D zcopy -s 65536 -n 300
check "ucx_perftest am_lat on rc_verbs (UCT)" \
  perftest am_lat-rc -- -d urnic0:1 -x rc_verbs -t am_lat -n 100
check "ucx_perftest am_lat on ud_verbs (UCT)" \
  perftest am_lat-ud -- -d urnic0:1 -x ud_verbs -t am_lat -n 100

# UCX's client/server connection (ucp_listener on urnic's address, the
# client's endpoint made from it), set up by UCX's rdmacm connection manager
# through urnicd's RDMA CM: 20 x 1 MiB each way, every byte checked.
sockaddr_pair() {
  local l0 c0 sp rc=0
  l0=$(counter "$SA" cm_listens)
  c0=$(counter "$SA" cm_connections)
  on "$NS_A" "$SA" env UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_TLS=rc_v \
    timeout 60 "$UCP_SOCKADDR" -p 13590 -l 10.97.0.1 >"$TMP/ucp-s.out" 2>&1 &
  sp=$!
  PIDS+=("$sp")
  wait_cm_listen "$SA" "$l0" || rc=1
  [ "$rc" = 0 ] && { on "$NS_B" "$SB" env UCX_SOCKADDR_TLS_PRIORITY=rdmacm \
    UCX_TLS=rc_v timeout 60 "$UCP_SOCKADDR" -p 13590 10.97.0.1 \
    >"$TMP/ucp-c.out" 2>&1 || rc=$?; }
  wait "$sp" || rc=$((rc ? rc : $?))
  sed "s/^/  client: /" "$TMP/ucp-c.out"
  [ "$rc" = 0 ] && grep -q verified "$TMP/ucp-s.out" &&
    grep -q verified "$TMP/ucp-c.out" &&
    [ "$(counter "$SA" cm_connections)" -gt "$c0" ] || {
    tail -n 5 "$TMP/ucp-s.out" "$TMP/ucp-c.out"
    return 1
  }
}
if [ -n "$UCP_SOCKADDR" ]; then
  check "UCP client/server through the RDMA CM (rdmacm), data checked" \
    sockaddr_pair
else
  echo "SKIP - UCP client/server: tests/shim/ucp_sockaddr (libucx-dev) missing"
fi

# --- Open MPI, two services on a memif pair ----------------------------------
if [ -z "$MPI_CHECK" ] || ! command -v mpirun >/dev/null; then
  echo "SKIP - Open MPI: mpirun or tests/shim/mpi_check (libopenmpi-dev) missing"
else
  S1=$TMP/m1.sock
  S2=$TMP/m2.sock
  memif_start server 02:00:00:00:97:01 10.98.0.1 "$S1"
  memif_start client 02:00:00:00:97:02 10.98.0.2 "$S2"
  check "the memif pair's links are up" wait_link "$S1"
  check "  on both services" wait_link "$S2"
  # The layers under MPI: UCX (pml ucx, osc ucx) by default; MPI_PML,
  # MPI_OSC and RANK_ENV (the ranks' environment) choose others, MPI_NS a
  # network namespace for mpirun and its ranks.
  rank() {  # rank SOCK [ARG]: one app context of mpirun, a client of SOCK
    # (LD_PRELOAD's list colon-separated: this is split into words.)
    echo -np 1 env $CLIENT_ENV LD_PRELOAD="${PRELOAD// /:}" URNIC_SOCKET="$1" \
      ${RANK_ENV:-UCX_NET_DEVICES=urnic0:1 UCX_TLS=rc_v} URNIC_POLL_YIELD=1 \
      "$MPI_CHECK" 5 ${2:-}
  }
  mpi() {  # mpi [ARG]: mpi_check's second argument
    local a0 b0 pre=()
    [ -n "${MPI_NS:-}" ] && pre=(ip netns exec "$MPI_NS")
    a0=$(counter "$S1" roce_rx)
    b0=$(counter "$S2" roce_rx)
    # btl self only: nothing may go through shared memory or TCP; every
    # rank-to-rank byte crosses the two services.
    # shellcheck disable=SC2046
    "${pre[@]}" timeout 120 mpirun --allow-run-as-root --oversubscribe \
      --mca pml "${MPI_PML:-ucx}" --mca btl self --mca osc "${MPI_OSC:-ucx}" \
      $(rank "$S1" "${1:-}") : $(rank "$S2" "${1:-}") \
      >"$TMP/mpi.out" 2>&1 || { cat "$TMP/mpi.out"; return 1; }
    sed 's/^/  /' "$TMP/mpi.out"
    grep -q 'mpi_check: all data checked' "$TMP/mpi.out" &&
      [ "$(counter "$S1" roce_rx)" -gt $((a0 + 1000)) ] &&
      [ "$(counter "$S2" roce_rx)" -gt $((b0 + 1000)) ]
  }
  t1=$(counter "$S1" tx_bytes)
  t2=$(counter "$S2" tx_bytes)
  # mpi_check's MPI_Rget relies on the shim's UCX_RC_VERBS_TX_POLL_ALWAYS
  # default (verbs-shim/UCX-NOTES.md, "MPI_Rget"): without it rank 0 read
  # the buffer's old value ("rget [0] is -7").
  check "Open MPI pml ucx: ping-pong, allreduce, one-sided verified, RoCE counters moved" mpi
  clean=$(($(counter "$S1" tx_bytes) - t1 + $(counter "$S2" tx_bytes) - t2))
  # libfabric under MPI: pml cm with mtl ofi on verbs;ofi_rxm (RC QPs by
  # the RDMA CM), one-sided by osc pt2pt over it. The provider offers its
  # MSG endpoints only where an interface carries the device's address
  # (addr_ns); mpirun and the ranks run in that namespace.
  if command -v fi_info >/dev/null; then
    addr_ns ofi_ns 10.98.0.1 10.98.0.2
    MPI_NS=$ofi_ns MPI_PML=cm MPI_OSC=pt2pt \
      RANK_ENV="FI_PROVIDER=verbs;ofi_rxm OMPI_MCA_mtl=ofi" \
      check "Open MPI pml cm, mtl ofi (libfabric verbs;ofi_rxm): all verified, RoCE counters moved" mpi
  fi
  # The same through 1 % loss, duplication and reordering on both ports.
  # UCX's rendezvous is one RDMA READ per message (up to 4 MiB here): a
  # READ is asked for in pieces of the window, so a lost response costs
  # the rest of its piece, not of the READ (which sent ~6x the clean run's
  # bytes: perf/README.md, "Large READs on a lossy port").
  for s in "$S1" "$S2"; do
    "$URNICCTL" -s "$s" fault seed=5 tx.drop_ppm=10000 tx.duplicate_ppm=5000 \
      tx.reorder_ppm=5000 >/dev/null
  done
  t1=$(counter "$S1" tx_bytes)
  t2=$(counter "$S2" tx_bytes)
  # Not MPI_Rget: UCX does not fence the SEND that carries the fetch-add
  # completing it, so after a lost READ response its reply can arrive
  # before the READ's data, on any verbs device (verbs-shim/UCX-NOTES.md).
  check "Open MPI through 1 % loss, duplicates and reordering: all verified" \
    mpi norget
  bounded() {  # the faulty run sent less than twice the clean run's bytes
    local lossy
    lossy=$(($(counter "$S1" tx_bytes) - t1 + $(counter "$S2" tx_bytes) - t2))
    echo "  bytes sent: $clean clean, $lossy through the faults"
    [ "$clean" -gt 0 ] && [ "$lossy" -lt $((2 * clean)) ]
  }
  check "  and sent less than twice the clean run's bytes" bounded
fi

finish
