# guest A: urnicd on the DPDK-bound NIC at 00:05.0
waitfile() { i=0; while [ ! -f /share/$1 ] && [ $i -lt ${2:-400} ]; do sleep 1; i=$((i+1)); done; echo "[A waited ${i}s for $1]"; }
echo "script start uptime=$(cut -d' ' -f1 /proc/uptime) nproc=$(nproc)"
echo "cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -x -E 'sse4_1|sse4_2|popcnt|ssse3|avx|avx2|aes|pclmulqdq' | tr '\n' ' ')"
lspci -nn | grep -i ether
DRV=$(sed -n "s/.*dpdkdrv=\([^ ]*\).*/\1/p" /proc/cmdline); DRV=${DRV:-vfio-pci}
HUGE=$(sed -n "s/.*huge=\([^ ]*\).*/\1/p" /proc/cmdline); HUGE=${HUGE:-true}
echo "binding with $DRV, eal.huge=$HUGE"
if [ "$HUGE" = true ]; then
  echo 300 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
  mount -t hugetlbfs nodev /dev/hugepages
  grep -i hugepages_ /proc/meminfo
fi
if [ "$DRV" = vfio-pci ]; then modprobe vfio-pci; else modprobe uio_pci_generic; fi
dpdk-devbind.py -b $DRV 0000:00:05.0
dpdk-devbind.py -s | sed -n '1,6p'
ldd /share/urnicd | grep -i 'not found' && echo "MISSING LIBS"
mkdir -p /run/urnic
CMD="/share/urnicd -c /share/e1000-vfio.yaml -o port.pci=0000:00:05.0 -o port.ipv4=10.99.0.1/24 -o eal.huge=$HUGE -o control.socket=/tmp/u.sock -o eal.workers=[1] -o eal.main_lcore=0 -o eal.log_level=info -o stats.period_ms=5000"
echo "+ $CMD"
$CMD > /share/urnicd.out 2>&1 &
P=$!
i=0; while [ ! -S /tmp/u.sock ] && [ $i -lt 180 ] && kill -0 $P 2>/dev/null; do sleep 1; i=$((i+1)); done
echo "control socket after ${i}s"
if ! kill -0 $P 2>/dev/null; then wait $P; echo "urnicd DIED rc=$?"; cat /share/urnicd.out; touch /share/A.ready /share/A.pinged /share/A.done; exit 1; fi
U="/share/urnicctl -s /tmp/u.sock"
touch /share/A.ready
waitfile B.up
sleep 3
echo "+ urnicctl ping 10.99.0.2 (neighbour unknown: resolve path)"; $U ping 10.99.0.2; echo "urnicctl rc=$?"
sleep 6
$U stats --json > /share/A-after-ping.json; echo "stats --json rc=$?"
touch /share/A.pinged
waitfile B.done
echo "+ urnicctl ping 10.99.0.2 (neighbour known)"; $U ping 10.99.0.2; echo "urnicctl rc=$?"
sleep 4
echo "+ urnicctl stats"; $U stats; echo "rc=$?"
$U stats --json > /share/A-final.json; echo "stats --json rc=$?"
cat /share/A-final.json; echo
echo "+ kill -TERM urnicd"
kill -TERM $P; wait $P; echo "urnicd exit status: $?"
touch /share/A.done
echo "=== urnicd.out"; cat /share/urnicd.out
dpdk-devbind.py -s | sed -n '1,6p'
