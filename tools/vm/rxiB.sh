#!/bin/bash
# guest B of tools/vm-rxe-interop: Linux Soft-RoCE rxe0 on the kernel NIC at
# 00:05.0 (RoCE link, 10.99.0.2/24), management NIC at 00:06.0 (10.98.0.2/24).
# Verbs programs use rxe0 with the GID index of ::ffff:10.99.0.2 (RoCE v2).
# Per test: tcpdump of the RoCE NIC ($R/N.B.pcap), rxe counters and new
# kernel messages ($R/N.B-rxe.txt).
[ -n "$BASH_VERSION" ] || exec bash "$0" "$@"
ME=B OTHER=A PEER_MGMT=10.98.0.1 ROCE_IP=10.99.0.2 PEER_ROCE=10.99.0.1
# shellcheck source=rxi-common.sh
. /share/rxi-common.sh
log "script start nproc=$(nproc) kernel=$(uname -r)"
lspci -nn | grep -i ether
modprobe e1000; modprobe e1000e; modprobe igb
sleep 2
echo "+ ip -br link"; ip -br link
RX=$(ifname_of 0000:00:05.0); MG=$(ifname_of 0000:00:06.0)
log "RoCE NIC 0000:00:05.0 = '$RX', management NIC 0000:00:06.0 = '$MG'"
{ [ -n "$RX" ] && [ -n "$MG" ]; } || abort "interface layout wrong (RoCE '$RX', mgmt '$MG')"
ip addr add 10.99.0.2/24 dev "$RX"; ip link set "$RX" up
ip addr add 10.98.0.2/24 dev "$MG"; ip link set "$MG" up
sleep 3
ethtool -i "$RX" | head -2; ethtool "$RX" | grep -E 'Speed|Link detected'
modprobe ib_uverbs; modprobe rdma_rxe; modprobe rdma_ucm
rdma link add rxe0 type rxe netdev "$RX"
rdma link show
ibv_devices
# The GID of the RoCE NIC's IPv4 address, RoCE v2 (the table fills in asynchronously).
GIDX=
P1=/sys/class/infiniband/rxe0/ports/1
for _ in $(seq 20); do
  for i in $(seq 0 15); do
    [ "$(cat "$P1/gids/$i" 2>/dev/null)" = 0000:0000:0000:0000:0000:ffff:0a63:0002 ] || continue
    [ "$(cat "$P1/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ] && { GIDX=$i; break 2; }
  done
  sleep 0.5
done
[ -n "$GIDX" ] || { GIDX=1; log "no RoCE v2 GID for 10.99.0.2 found; using 1"; }
log "rxe0 GID index for ::ffff:10.99.0.2 = $GIDX"
ibv_devinfo -v -d rxe0 | grep -E 'hca_id|transport|state|mtu|GID|link_layer|max_qp_rd_atom|atomic_cap'
ip -br addr
DEV=rxe0
VERBS=
waitfile A.ready 600 || true
[ -f "$R/abort" ] || {
  echo "+ ping -c 2 10.98.0.1 (management link)"; ping -c 2 -W 5 10.98.0.1; echo "ping rc=$?"
  echo "+ ping -c 3 10.99.0.1 (RoCE link: urnicd answers)"; ping -c 3 -W 5 10.99.0.1; echo "ping rc=$?"
  ip neigh show dev "$RX"
}
rdma statistic show link rxe0/1 > "$R/0.B-rxe.txt" 2>&1
dmesg -c > /dev/null
touch "$R/B.ready"

TD=
pre_test() {
  tcpdump -Z root -i "$RX" -nn -s 256 -c 200000 -w "$R/$1.B.pcap" 'udp port 4791 or arp or icmp' \
    > "$R/$1.B.tcpdump.err" 2>&1 &
  TD=$!
  sleep 2
}
post_test() {
  sleep 1
  kill -INT "$TD" 2>/dev/null; wait "$TD" 2>/dev/null
  { rdma statistic show link rxe0/1; echo "--- dmesg"; dmesg -c; } > "$R/$1.B-rxe.txt" 2>&1
}
run_tests
echo "+ rdma statistic show link rxe0/1 (final)"; rdma statistic show link rxe0/1 | tee "$R/B-final-rxe.txt"
echo "+ ip -s link show $RX"; ip -s link show "$RX"
echo "+ ip neigh"; ip neigh show
echo "+ dmesg (rxe/rdma)"; dmesg | grep -iE 'rxe|rdma|infiniband' | tail -n 30
