#!/usr/bin/env bash
# Integration: urnicd on net_af_packet over a veth pair between two network
# namespaces this test creates. Checks ARP/ICMP/ND answers, the resolver
# (urnicctl ping), RoCEv2 ICRC rejection (scapy), JSON stats, a second
# instance refused, clean SIGTERM exit. urnicd runs with its own port.mac,
# which on af_packet stays urnicd's: the kernel interface keeps its
# address, and its promiscuous flag is cleared again at exit. Everything
# it starts or creates is removed on exit, pass or fail.
# usage: netns_host.sh URNICD URNICCTL
set -euo pipefail
URNICD=$1
URNICCTL=$2
PY=/usr/bin/python3  # Debian's python: scapy lives there

[ "$(id -u)" = 0 ] || { echo "SKIP: needs root for network namespaces"; exit 77; }

id=$$
SVC=urnic-it-s-$id
PEER=urnic-it-p-$id
IF_S=uit${id}s
IF_P=uit${id}p
TMP=$(mktemp -d /tmp/urnic-it.XXXXXX)
SOCK=$TMP/urnicd.sock
PID=
pass=0
fail=0

cleanup() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null || true
  fi
  ip netns del "$SVC" 2>/dev/null || true
  ip netns del "$PEER" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

check() {  # check NAME COMMAND...
  local name=$1
  shift
  if "$@" >"$TMP/out" 2>&1; then
    echo "ok   - $name"
    pass=$((pass + 1))
  else
    echo "FAIL - $name"
    sed 's/^/       /' "$TMP/out" | tail -20
    fail=$((fail + 1))
  fi
}

ip netns add "$SVC"
ip netns add "$PEER"
ip link add "$IF_S" netns "$SVC" type veth peer name "$IF_P" netns "$PEER"
ip -n "$SVC" link set lo up
ip -n "$SVC" link set "$IF_S" up
ip -n "$PEER" link set lo up
ip -n "$PEER" addr add 10.77.0.2/24 dev "$IF_P"
ip -n "$PEER" addr add fd00:77::2/64 dev "$IF_P" nodad
ip -n "$PEER" link set "$IF_P" up

KMAC=$(ip netns exec "$SVC" cat "/sys/class/net/$IF_S/address")
MAC=02:00:00:77:00:01
ip netns exec "$SVC" "$URNICD" \
  -o "port.vdev=net_af_packet0,iface=$IF_S,qpairs=1" -o "port.mac=$MAC" \
  -o port.ipv6=fd00:77::1/64 \
  -o "control.socket=$SOCK" -o "eal.file_prefix=urnic-it-$id" \
  -o stats.period_ms=0 >"$TMP/urnicd.log" 2>&1 &
PID=$!

ctl() { "$URNICCTL" -s "$SOCK" "$@"; }
counter() {  # counter SECTION NAME
  ctl stats --json | $PY -c "import json,sys; print(json.load(sys.stdin)['$1']['$2'])"
}
wait_counter() {  # wait_counter SECTION NAME MIN
  for _ in $(seq 50); do
    [ "$(counter "$1" "$2")" -ge "$3" ] && return 0
    sleep 0.1
  done
  echo "$1.$2 = $(counter "$1" "$2"), expected >= $3"
  return 1
}

up=0
for _ in $(seq 100); do
  if ctl version >/dev/null 2>&1; then up=1; break; fi
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.2
done
if [ $up = 0 ]; then
  echo "FAIL - urnicd did not come up"; cat "$TMP/urnicd.log"; exit 1
fi
echo "ok   - urnicd up: $(ctl version)"
check "port.mac is urnicd's own on af_packet" \
  grep -q "mac $MAC (ours; the interface keeps its own)" "$TMP/urnicd.log"
check "the kernel interface kept its address" bash -c \
  "test \"\$(ip netns exec '$SVC' cat /sys/class/net/$IF_S/address)\" = '$KMAC'"

check "GID table: IPv4-mapped at 0, link-local at 1, fd00:77::1 at 2" bash -c "
  g=\$('$URNICCTL' -s '$SOCK' gids); echo \"\$g\";
  echo \"\$g\" | grep -q '^0 0000:0000:0000:0000:0000:ffff:0a4d:0001 RoCEv2 IPv4' &&
  echo \"\$g\" | grep -q '^1 fe80:' &&
  echo \"\$g\" | grep -q '^2 fd00:0077:0000:0000:0000:0000:0000:0001 RoCEv2 IPv6'"
check "link state logged" grep -q 'link up' "$TMP/urnicd.log"

# The resolver first, before the peer has talked to us: ARP request out,
# reply learned, the queued echo request released, its reply counted.
check "urnicctl ping resolves the peer by ARP" ctl ping 10.77.0.2
check "echo reply received" wait_counter totals icmp_echo_reply_rx 1
check "resolver counters" bash -c "
  j=\$('$URNICCTL' -s '$SOCK' stats --json)
  echo \"\$j\" | $PY -c 'import json,sys; t=json.load(sys.stdin)[\"totals\"]; \
    assert t[\"arp_tx_request\"] >= 1, t; assert t[\"neigh_resolved\"] >= 1, t; \
    assert t[\"pending_sent\"] >= 1, t'"

check "ping from the peer gets 3 replies" \
  ip netns exec "$PEER" ping -c 3 -i 0.2 -W 2 10.77.0.1
check "the peer learned urnicd's own MAC" bash -c \
  "ip -n '$PEER' neigh show 10.77.0.1 | grep -qi '$MAC'"
check "arping from the peer gets answers" \
  ip netns exec "$PEER" arping -c 2 -w 4 -I "$IF_P" 10.77.0.1
check "IPv6 ping (ND + ICMPv6 echo) gets replies" \
  ip netns exec "$PEER" ping -6 -c 2 -i 0.2 -W 2 fd00:77::1

before_icrc=$(counter malformed bad_icrc)
before_roce=$(counter totals roce_rx)
before_trunc=$(counter malformed truncated)
before_other=$(counter totals non_roce_ignored)
before_nfu=$(counter totals not_for_us)
before_vlan=$(counter totals vlan_mismatch)
before_noqp=$(counter transport rx_no_qp)
check "scapy sends good, bad-ICRC, truncated and non-RoCE packets" \
  ip netns exec "$PEER" $PY - "$IF_P" "$MAC" "$KMAC" <<'PYEOF'
import sys
from scapy.all import Ether, IP, UDP, Raw, sendp, conf
from scapy.contrib.roce import BTH
conf.verb = 0
iface, mac, kmac = sys.argv[1], sys.argv[2], sys.argv[3]
p = (Ether(dst=mac) / IP(src="10.77.0.2", dst="10.77.0.1") /
     UDP(sport=49152, dport=4791) / BTH(opcode=4, dqpn=17, psn=5) /
     Raw(b"urnic-it"))
good = bytes(p)
bad = bytearray(good); bad[-1] ^= 0xff
# Truncated: UDP says more than the frame holds -> IP total length error;
# craft a BTH cut short inside a consistent IP/UDP instead.
short = (Ether(dst=mac) / IP(src="10.77.0.2", dst="10.77.0.1") /
         UDP(sport=49152, dport=4791) / Raw(b"\x04\x00\xff\xff\x00\x00"))
other = (Ether(dst=mac) / IP(src="10.77.0.2", dst="10.77.0.1") /
         UDP(sport=5000, dport=5001) / Raw(b"x"))
# Another host's unicast MAC (we run promiscuous), the kernel interface's
# own, and a tagged frame on an untagged port: all refused and counted.
stranger = bytes(Ether(dst="02:00:00:00:00:99") / IP(src="10.77.0.2", dst="10.77.0.1") /
                 UDP(sport=49152, dport=4791) / Raw(b"x" * 16))
kernels = bytes(Ether(dst=kmac) / IP(src="10.77.0.2", dst="10.77.0.1") /
                UDP(sport=49152, dport=4791) / Raw(b"x" * 16))
from scapy.all import Dot1Q
tagged = bytes(Ether(dst=mac) / Dot1Q(vlan=5) / IP(src="10.77.0.2", dst="10.77.0.1") /
               UDP(sport=5000, dport=5001) / Raw(b"x"))
for f in (good, bytes(bad), bytes(short), bytes(other), stranger, kernels, tagged):
    sendp(Ether(f), iface=iface)
PYEOF
check "good RoCE packet counted" wait_counter totals roce_rx $((before_roce + 1))
check "it reached the transport engine: no such QP (rx_no_qp)" \
  wait_counter transport rx_no_qp $((before_noqp + 1))
check "bad ICRC dropped and counted" wait_counter malformed bad_icrc $((before_icrc + 1))
check "truncated RoCE dropped and counted" wait_counter malformed truncated $((before_trunc + 1))
check "non-RoCE UDP ignored and counted" wait_counter totals non_roce_ignored $((before_other + 1))
check "frames for another MAC and the kernel's counted not_for_us" \
  wait_counter totals not_for_us $((before_nfu + 2))
check "tagged frame on untagged port counted vlan_mismatch" wait_counter totals vlan_mismatch $((before_vlan + 1))
check "urnicctl stats --json parses" bash -c "'$URNICCTL' -s '$SOCK' stats --json | $PY -m json.tool >/dev/null"
check "urnicctl stats prints the testpmd layout" bash -c \
  "'$URNICCTL' -s '$SOCK' stats | grep -q 'Throughput (since last show)'"
check "urnicctl stats shows the transport counters that moved" bash -c \
  "'$URNICCTL' -s '$SOCK' stats | grep -q 'transport: .*rx_no_qp 1'"

# Frames the kernel's af_packet ring drops (the PMD reports none) show as
# RX-missed: with urnicd stopped, 6000 frames into its 4096-frame ring
# (urnicd's default) leave at least 1904 dropped.
before_missed=$(counter port rx_missed)
burst() {
  kill -STOP "$PID"
  ip netns exec "$PEER" $PY - "$IF_P" "$MAC" <<'PYEOF'
import socket, sys
iface, mac = sys.argv[1], bytes.fromhex(sys.argv[2].replace(":", ""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
frame = mac + bytes.fromhex("020000770002") + b"\x88\xb5" + bytes(50)
for _ in range(6000):
    s.send(frame)
PYEOF
  local rc=$?
  kill -CONT "$PID"
  return $rc
}
check "6000 frames sent while urnicd is stopped" burst
check "the kernel ring's drops show as RX-missed (rx_missed)" \
  wait_counter port rx_missed $((before_missed + 1904))
check "urnicd serves again after the burst" ctl version

# Bad use: a second service on the same socket is refused before it touches
# any port; a client of a missing service gets a clear error.
check "second urnicd on the same socket refused" bash -c "
  ! ip netns exec '$SVC' '$URNICD' -o 'control.socket=$SOCK' \
     -o eal.file_prefix=urnic-it2-$id 2>'$TMP/second.err' &&
  grep -q 'already serving' '$TMP/second.err'"
check "port.mac on af_packet without promiscuous mode refused" bash -c "
  ! ip netns exec '$SVC' '$URNICD' -o 'port.vdev=net_af_packet1,iface=$IF_S' \
     -o port.mac=02:00:00:77:00:03 -o port.promiscuous=false \
     -o 'control.socket=$TMP/nopromisc.sock' -o eal.file_prefix=urnic-it3-$id \
     >'$TMP/nopromisc.err' 2>&1 && grep -q 'needs port.promiscuous: true' '$TMP/nopromisc.err'"
check "urnicctl names a missing service" bash -c "
  ! '$URNICCTL' -s '$TMP/nope.sock' stats 2>'$TMP/nope.err' &&
  grep -q 'not running at' '$TMP/nope.err'"
check "urnicctl: usage errors exit 2 without a service, a refusal 1" bash -c "
  '$URNICCTL' -s '$TMP/nope.sock' ping 1.2.3 2>'$TMP/u1.err'; [ \$? = 2 ] || exit 1
  grep -q 'not an IPv4 address' '$TMP/u1.err' || exit 1
  '$URNICCTL' -s '$TMP/nope.sock' fault tx.drop_ppm 2>'$TMP/u2.err'; [ \$? = 2 ] || exit 1
  grep -q 'not KEY=VALUE' '$TMP/u2.err' || exit 1
  '$URNICCTL' -s '$TMP/nope.sock' fault \$'tx.drop_ppm=1\\trx.delay_us=5' 2>/dev/null; [ \$? = 2 ] || exit 1
  '$URNICCTL' -s '$TMP/nope.sock' bogus 2>/dev/null; [ \$? = 2 ] || exit 1
  '$URNICCTL' -s '$SOCK' fault tx.no_such_key=1 2>'$TMP/u3.err'; [ \$? = 1 ] || exit 1
  grep -q 'no_such_key' '$TMP/u3.err'"
check "control protocol: short, foreign, wrong-version, bad-length, unknown-op and bad-argument messages get errors" \
  $PY - "$SOCK" <<'PYEOF'
import socket, struct, sys, errno
path = sys.argv[1]
MAGIC = 0x434e5255
def ask(msg):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(path)
    s.send(msg)
    r = s.recv(70000)
    s.close()
    magic, ver, op, status, ln = struct.unpack("<IHHiI", r[:16])
    return status, r[16:16 + ln].decode()
VER = 3  # ctl::kVersion
cases = [
    (b"hi", -errno.EPROTO, "short message"),
    (struct.pack("<IHHiI", 0xdeadbeef, VER, 1, 0, 0), -errno.EPROTO, "not an urnic"),
    (struct.pack("<IHHiI", MAGIC, 99, 1, 0, 0), -errno.EPROTONOSUPPORT, "version 99"),
    (struct.pack("<IHHiI", MAGIC, VER, 1, 0, 5), -errno.EPROTO, "length mismatch"),
    (struct.pack("<IHHiI", MAGIC, VER, 777, 0, 0), -errno.EOPNOTSUPP, "unknown operation"),
    (struct.pack("<IHHiI", MAGIC, VER, 4, 0, 3) + b"x.y", -errno.EINVAL, "not an IPv4"),
]
for msg, want, text in cases:
    st, body = ask(msg)
    assert st == want and text in body, (msg, st, body)
    print("ok", st, body)
# A client that connects and dies without a word costs nothing.
for _ in range(100):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(path); s.close()
PYEOF
check "urnicd still serving after all of the above" ctl version

kill -TERM "$PID"
rc=0
for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$PID" 2>/dev/null; then
  echo "FAIL - urnicd ignored SIGTERM"; fail=$((fail + 1))
else
  wait "$PID" || rc=$?
  PID=
  check "urnicd exited 0 on SIGTERM" test "$rc" = 0
  check "final stats printed and 'stopped'" grep -q 'urnicd: stopped' "$TMP/urnicd.log"
  check "control socket removed" test ! -e "$SOCK"
  check "the interface is no longer promiscuous" bash -c \
    "! ip -n '$SVC' link show '$IF_S' | grep -q PROMISC"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
