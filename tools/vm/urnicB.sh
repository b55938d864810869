# guest B: kernel e1000/e1000e driver, 10.99.0.2/24
waitfile() { i=0; while [ ! -f /share/$1 ] && [ $i -lt ${2:-400} ]; do sleep 1; i=$((i+1)); done; echo "[B waited ${i}s for $1]"; }
echo "script start uptime=$(cut -d' ' -f1 /proc/uptime) nproc=$(nproc)"
lspci -nn | grep -i ether
modprobe e1000; modprobe e1000e; sleep 2
ip addr add 10.99.0.2/24 dev eth0; ip link set eth0 up
sleep 3
ethtool -i eth0 | head -2; ethtool eth0 | grep -E 'Speed|Link detected'
ip -br addr
tcpdump -i eth0 -n -e -l not ip6 > /share/tcpdumpB.out 2>&1 &
T=$!
waitfile A.ready
touch /share/B.up
waitfile A.pinged
echo "+ ip neigh (after urnicctl ping from A)"; ip neigh show dev eth0
echo "+ arping -c 3 -I eth0 10.99.0.1"; arping -c 3 -I eth0 10.99.0.1; echo "arping rc=$?"
echo "+ ping -c 5 10.99.0.1"; ping -c 5 10.99.0.1; echo "ping rc=$?"
echo "+ ping -c 3 -s 1472 -M do 10.99.0.1"; ping -c 3 -s 1472 -M do 10.99.0.1; echo "ping rc=$?"
ip neigh show dev eth0
touch /share/B.done
waitfile A.done
sleep 1
kill $T; wait $T
ip -s link show eth0
echo "=== tcpdump on B (non-IPv6)"; cat /share/tcpdumpB.out
