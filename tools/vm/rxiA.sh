#!/bin/bash
# guest A of tools/vm-rxe-interop: urnicd on the NIC at 00:05.0 (DPDK PMD;
# RoCE link, port.ipv4 10.99.0.1/24), the kernel's e1000 on 00:06.0
# (management link, 10.98.0.1/24, perftest's TCP exchange only). Verbs
# programs run through the shim as device urnic0, GID index 0.
[ -n "$BASH_VERSION" ] || exec bash "$0" "$@"
ME=A OTHER=B PEER_MGMT=10.98.0.2 ROCE_IP=10.99.0.1 PEER_ROCE=10.99.0.2
# shellcheck source=rxi-common.sh
. /share/rxi-common.sh
log "script start nproc=$(nproc) kernel=$(uname -r)"
lspci -nn | grep -i ether
DRV=$(sed -n "s/.*dpdkdrv=\([^ ]*\).*/\1/p" /proc/cmdline); DRV=${DRV:-vfio-pci}
HUGE=$(sed -n "s/.*huge=\([^ ]*\).*/\1/p" /proc/cmdline); HUGE=${HUGE:-true}
# Worker lcores (WORKERS on the host: "1" or "1,2"; igb gets a queue each).
WK=$(sed -n "s/.*workers=\([^ ]*\).*/\1/p" /proc/cmdline); WK=${WK:-1}
log "binding 0000:00:05.0 with $DRV, eal.huge=$HUGE"
if [ "$HUGE" = true ]; then
  echo 300 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
  mount -t hugetlbfs nodev /dev/hugepages
  grep -i hugepages_ /proc/meminfo
fi
if [ "$DRV" = vfio-pci ]; then modprobe vfio-pci; else modprobe uio_pci_generic; fi
# Bind the RoCE NIC before any e1000 driver is loaded: the kernel never takes it.
dpdk-devbind.py -b "$DRV" 0000:00:05.0
modprobe e1000
sleep 2
echo "+ ip -br link"; ip -br link
MG=$(ifname_of 0000:00:06.0)
log "management NIC 0000:00:06.0 = '${MG}'; RoCE NIC 0000:00:05.0 driver: $(basename "$(readlink /sys/bus/pci/devices/0000:00:05.0/driver)")"
if [ -z "$MG" ] || [ -n "$(ifname_of 0000:00:05.0)" ]; then
  abort "interface layout wrong (mgmt '$MG', 05.0 has '$(ifname_of 0000:00:05.0)')"
fi
ip addr add 10.98.0.1/24 dev "$MG"; ip link set "$MG" up
dpdk-devbind.py -s | sed -n '1,8p'
for g in /sys/kernel/iommu_groups/*/devices/*; do [ -e "$g" ] && echo "iommu group $(basename "$(dirname "$(dirname "$g")")"): $(basename "$g")"; done | grep -E '00:0[56]\.0' || true

ldd /share/urnicd | grep -i 'not found' && echo "MISSING LIBS"
cp /share/liburnic-verbs.so /tmp/
ldd /tmp/liburnic-verbs.so | grep -i 'not found' && echo "MISSING LIBS (shim)"
mkdir -p /run/urnic
CMD="/share/urnicd -c /share/e1000-vfio.yaml -o port.pci=0000:00:05.0 -o port.ipv4=10.99.0.1/24 -o eal.huge=$HUGE -o control.socket=/tmp/u.sock -o eal.workers=[$WK] -o eal.main_lcore=0 -o eal.log_level=info -o stats.period_ms=30000"
echo "+ $CMD"
$CMD > "$R/urnicd.out" 2>&1 &
UP=$!
i=0; while [ ! -S /tmp/u.sock ] && [ $i -lt 180 ] && kill -0 $UP 2>/dev/null; do sleep 1; i=$((i + 1)); done
log "control socket after ${i}s"
if ! kill -0 $UP 2>/dev/null; then
  rc=0; wait $UP || rc=$?
  abort "urnicd died rc=$rc"; cat "$R/urnicd.out"
fi
U="/share/urnicctl -s /tmp/u.sock"
VERBS="env LD_PRELOAD=/tmp/liburnic-verbs.so URNIC_SOCKET=/tmp/u.sock"
DEV=urnic0
GIDX=0
if [ ! -f "$R/abort" ]; then
  echo "+ urnicctl version"; $U version
  echo "+ urnicctl gids"; $U gids
  echo "+ ibv_devinfo -v -d urnic0 (shim)"
  # shellcheck disable=SC2086
  timeout 60 $VERBS ibv_devinfo -v -d urnic0 | grep -E 'hca_id|transport|state|mtu|GID|link_layer|max_qp_rd_atom|atomic_cap'
fi
touch "$R/A.ready"
waitfile B.ready 600 || true
if [ ! -f "$R/abort" ]; then
  echo "+ ping -c 2 10.98.0.2 (management link)"; ping -c 2 -W 5 10.98.0.2; echo "ping rc=$?"
  echo "+ urnicctl ping 10.99.0.2 (RoCE link: urnicd resolves rxe's host)"; $U ping 10.99.0.2; echo "urnicctl ping rc=$?"
  sleep 3
  $U stats --json > "$R/0.A-stats.json"
fi
post_test() { $U stats --json > "$R/$1.A-stats.json" 2>&1; }
run_tests
# A real RDMA device beside urnic0 (issue 4): rxe on the management NIC of
# this guest. With the shim preloaded both are listed, and calls on the
# real one go to libibverbs (a loopback RC pingpong with data checked).
echo "== coexist: rxe on $MG (management NIC) next to urnic0, shim preloaded"
cx_ok=1
if modprobe rdma_rxe && rdma link add rxeA type rxe netdev "$MG"; then
  # shellcheck disable=SC2086
  devs=$(timeout 30 $VERBS ibv_devices 2>&1); echo "$devs"
  echo "$devs" | grep -q urnic0 && echo "$devs" | grep -q rxeA || cx_ok=0
  gi=1  # rxe: index 1 is the IPv4-mapped GID of the management NIC's address
  # shellcheck disable=SC2086
  timeout 60 $VERBS ibv_rc_pingpong -d rxeA -g $gi -n 100 -c -p 18999 >/tmp/cx-srv 2>&1 &
  cxs=$!
  sleep 2
  # shellcheck disable=SC2086
  timeout 60 $VERBS ibv_rc_pingpong -d rxeA -g $gi -n 100 -c -p 18999 127.0.0.1 || cx_ok=0
  wait $cxs || cx_ok=0
  sed 's/^/  server: /' /tmp/cx-srv
  rdma link delete rxeA
else
  cx_ok=0
fi
[ $cx_ok = 1 ] && echo "coexist: PASS" || echo "coexist: FAIL"
echo "+ urnicctl stats (final)"; $U stats; echo "rc=$?"
$U stats --json > "$R/A-final.json"; echo "stats --json rc=$?"
echo "+ urnicctl objects"; $U objects
if kill -0 $UP 2>/dev/null; then
  echo "+ kill -TERM urnicd"; kill -TERM $UP
  rc=0; wait $UP || rc=$?; echo "urnicd exit status: $rc"
fi
touch "$R/A.done"
echo "=== urnicd.out (tail)"; tail -n 60 "$R/urnicd.out"
dpdk-devbind.py -s | sed -n '1,8p'
