#!/usr/bin/python3
"""Writes seed programs for tests/fuzz/fuzz_cm.cc (its header comment has the
format; keep the two in step): an RC connect/accept/disconnect trace, UD/SIDR
exchanges, a migrated listener, rejected, timed-out and stale connections,
MRAs, a connection to the server's own address, neighbour lookups, a full
event socket and multicast joins and leaves.
usage: cm_seeds.py OUT_DIR"""
import os
import struct
import sys

# Op kinds (op % 16).
OPEN, CMD, NET, INJECT, TIME, CLOSE, ENV, STALL = 0, 1, 6, 8, 9, 11, 12, 13
# Command selectors (fuzz_cm.cc command()).
CREATE, DESTROY, BIND_IP, RESOLVE_IP, RESOLVE_ROUTE, QUERY_ROUTE = range(6)
CONNECT, LISTEN, ACCEPT, REJECT, DISCONNECT, INIT_QP_ATTR = range(6, 12)
SET_OPTION, MIGRATE = 12, 13
JOIN_IP_MCAST, JOIN_MCAST, LEAVE_MCAST = 19, 20, 21
# Slots: A's channels 0-2, B's 3-5. Nodes: 0 A, 1 B.
A0, A1, B0 = 0, 1, 3
A, B = 0, 1
# Addresses (put_addr's low bits): own, peer; port selectors.
OWN, PEER = 0, 1
PORT0, PORT = 0, 1
# Port spaces / QP types (create operands).
TCP, UDP = 0, 1
RC, UD = 0, 1


def op_open(slot, flags=0):
    return bytes([OPEN, slot, flags])


def cmd(slot, sel, *operands):
    return bytes([CMD, slot, sel, 0, *operands])


def create(slot, uid, ps=TCP, qpt=RC):
    return cmd(slot, CREATE, uid, ps, qpt)


def bind_ip(slot, id_, addr=OWN, port=PORT):
    return cmd(slot, BIND_IP, id_, addr, port)


def resolve_ip(slot, id_, dst=PEER, port=PORT):
    # src 0x80: no source address; its port byte 0; timeout 100 * 20 ms.
    return cmd(slot, RESOLVE_IP, id_, dst, port, 0x80, 0, 100)


def param(qpn, pdlen=0, valid=1, rr=1, depth=1):
    return [*struct.pack("<H", qpn), rr, depth, 7, 7, 0, pdlen, valid]


def connect(slot, id_, qpn, pdlen=7):
    return cmd(slot, CONNECT, id_, *param(qpn, pdlen))


def accept(slot, id_, uid, qpn, valid=1):
    return cmd(slot, ACCEPT, id_, uid, *param(qpn, 0, valid))


def net(node, action=0, idx=0):
    return bytes([NET, node, idx, action])


def time(ms, how=0):
    return bytes([TIME, *struct.pack("<H", ms), how])


def inject_sent(node, k, patches=()):
    """A MAD the servers sent, k-th newest, patched, to node from its peer
    (INJECT hdr 0)."""
    out = bytes([INJECT, node, 0, 0, k, len(patches)])
    for off, val in patches:
        out += bytes([off, val])
    return out + bytes([0])


def inject_answer(node, attr, patches=()):
    """A MAD from node's peer answering the newest MAD sent (INJECT hdr 1):
    attr % 9 + 0x10, then (offset, value) patches."""
    out = bytes([INJECT, node, 0, 1, 0, attr, len(patches)])
    for off, val in patches:
        out += bytes([off, val])
    return out + bytes([0])


def env(node, mode):
    return bytes([ENV, node, mode])


def stall(slot, what):
    return bytes([STALL, slot, what])


def simple(slot, sel, id_, *more):
    return cmd(slot, sel, id_, *more)


def close(slot):
    return bytes([CLOSE, slot])


def rc_setup(lis_slot=A0):
    """A listens on 10.99.0.1:7174 (id 1); B (id 1) resolves and connects;
    A gets the REQ (CONNECT_REQUEST for A's id 2)."""
    return (op_open(A0) + op_open(B0) + create(A0, 1) +
            bind_ip(A0, 1) + simple(A0, LISTEN, 1, 8) + create(B0, 2) +
            resolve_ip(B0, 1) + simple(B0, RESOLVE_ROUTE, 1) +
            simple(B0, QUERY_ROUTE, 1, 0) + connect(B0, 1, 0x123) + net(B))


def rc_trace():
    return (rc_setup() + accept(A0, 2, 3, 0x456) + net(A) +
            accept(B0, 1, 2, 0, valid=0) + net(B) +
            simple(A0, INIT_QP_ATTR, 2, 1) + simple(A0, INIT_QP_ATTR, 2, 2) +
            simple(A0, INIT_QP_ATTR, 2, 3) + simple(B0, INIT_QP_ATTR, 1, 3) +
            simple(B0, QUERY_ROUTE, 1, 0) + simple(B0, DISCONNECT, 1) +
            net(B) + simple(A0, DISCONNECT, 2) + net(A) + time(1000) +
            simple(A0, DESTROY, 2) + simple(A0, DESTROY, 1) +
            simple(B0, DESTROY, 1) + close(A0) + close(B0))


def rc_lossy():
    # The REP is lost once (B's REQ goes again), A's DREQ is duplicated.
    return (rc_setup() + accept(A0, 2, 3, 0x456) + net(A, action=3) +
            time(5000) + net(B) + time(4100) + net(A) +
            accept(B0, 1, 2, 0, valid=0) + net(B) +
            simple(A0, DISCONNECT, 2) + net(A, action=4) + net(A) +
            simple(B0, DISCONNECT, 1) + net(B) + time(1000))


def rc_reject():
    return rc_setup() + simple(A0, REJECT, 2, 0, 5) + net(A) + time(10)


def rc_timeout():
    # Nothing reaches A: REQ retries until UNREACHABLE.
    out = (op_open(A0) + op_open(B0) + create(B0, 2) + resolve_ip(B0, 1) +
           simple(B0, RESOLVE_ROUTE, 1) + connect(B0, 1, 0x123))
    for _ in range(20):
        out += time(5000) + net(B, action=3)
    return out


def ud_setup():
    return (op_open(A0) + op_open(B0) + create(A0, 1, UDP, UD) +
            bind_ip(A0, 1) + simple(A0, LISTEN, 1, 8) +
            create(B0, 2, UDP, UD) + resolve_ip(B0, 1) +
            simple(B0, RESOLVE_ROUTE, 1) + connect(B0, 1, 0x77, pdlen=10) +
            net(B))


def ud_sidr():
    return (ud_setup() + accept(A0, 2, 3, 0x99) + net(A) +
            simple(B0, INIT_QP_ATTR, 1, 1) + close(A0) + close(B0))


def ud_reject():
    return ud_setup() + simple(A0, REJECT, 2, 0, 3) + net(A)


def migrate():
    # A's listener is made on channel A0 and moved to A1, which accepts.
    return (op_open(A0) + op_open(A1) + op_open(B0) + create(A0, 1) +
            simple(A1, MIGRATE, 1, A0) + bind_ip(A1, 1) +
            simple(A1, LISTEN, 1, 8) + create(B0, 2) + resolve_ip(B0, 1) +
            simple(B0, RESOLVE_ROUTE, 1) + connect(B0, 1, 0x123) + net(B) +
            simple(A0, MIGRATE, 2, A1) + accept(A0, 2, 3, 0x456) + net(A) +
            accept(B0, 1, 2, 0, valid=0) + net(B) + close(A1) + net(A) +
            time(100))


def loopback():
    # A connects to its own listener.
    return (op_open(A0) + create(A0, 1) + bind_ip(A0, 1) +
            simple(A0, LISTEN, 1, 8) + create(A0, 2) +
            resolve_ip(A0, 2, dst=OWN) + simple(A0, RESOLVE_ROUTE, 2) +
            connect(A0, 2, 0x10) + time(1) + accept(A0, 3, 3, 0x20) +
            time(1) + accept(A0, 2, 2, 0, valid=0) + time(1) +
            simple(A0, DISCONNECT, 2) + time(1) + time(1000))


def mra():
    # B's REQ and A's REP are each answered by an MRA (service timeout 24)
    # before the real answer.
    MRA = 1
    return (op_open(A0) + op_open(B0) + create(A0, 1) + bind_ip(A0, 1) +
            simple(A0, LISTEN, 1, 8) + create(B0, 2) + resolve_ip(B0, 1) +
            simple(B0, RESOLVE_ROUTE, 1) + connect(B0, 1, 0x123) +
            inject_answer(B, MRA, [(33, 0xc0)]) + time(5000) + net(B) +
            accept(A0, 2, 3, 0x456) +
            inject_answer(A, MRA, [(32, 0x40), (33, 0xc0)]) + time(5000) +
            net(A) + accept(B0, 1, 2, 0, valid=0) + net(B))


def dreq_timeout():
    # Established, then B's DREQs are all lost: timewait, DISCONNECTED.
    out = (rc_setup() + accept(A0, 2, 3, 0x456) + net(A) +
           accept(B0, 1, 2, 0, valid=0) + net(B) + simple(B0, DISCONNECT, 1))
    for _ in range(18):
        out += net(B, action=3) + time(5000)
    return out + time(1000)


def addr_pending():
    # B's neighbour lookups: pending then known, timing out, failing.
    return (op_open(B0) + env(B, 1) + create(B0, 2) + resolve_ip(B0, 1) +
            time(100) + env(B, 0) + time(100) + create(B0, 3) + env(B, 1) +
            resolve_ip(B0, 2) + time(3000) + env(B, 2) + resolve_ip(B0, 2) +
            env(B, 0) + resolve_ip(B0, 2, dst=4))


def backlog():
    # A channel with a small socket buffer, not read: events wait in the
    # server; one id moves to another channel with its waiting events.
    out = op_open(A0, flags=8) + op_open(A1) + stall(A0, 0)
    for i in range(1, 11):
        out += create(A0, i) + resolve_ip(A0, i)
    return (out + simple(A1, MIGRATE, 10, A0) + stall(A0, 1) + time(1) +
            close(A0))


def stale():
    # Once established, B's REQ comes again with another comm ID (stale:
    # REJ and DREQ), then with another comm ID, QPN and transport UC.
    return (rc_setup() + accept(A0, 2, 3, 0x456) + net(A) +
            accept(B0, 1, 2, 0, valid=0) + net(B) +
            inject_sent(A, 2, [(27, 0x55)]) + net(A) + net(A) +
            inject_sent(A, 4, [(27, 0x56), (58, 0x99), (67, 0xa2)]) + net(A))


def mcast():
    # A UD id resolves group 239.0.0.1 (put_addr's selector 6: the address
    # follows), joins it twice (JOIN_IP_MCAST; JOIN_MCAST send-only), leaves
    # once, and the channel closes with the other membership.
    group = list(struct.pack("<I", 0xef000001))
    return (op_open(B0) + create(B0, 1, UDP, UD) +
            cmd(B0, RESOLVE_IP, 1, 6, PORT, *group, 0x80, 0, 100) + time(1) +
            cmd(B0, JOIN_IP_MCAST, 1, 1) + cmd(B0, JOIN_MCAST, 1, 0x05) +
            cmd(B0, LEAVE_MCAST, 1) + time(1) + close(B0))


SEEDS = {
    "rc_trace": rc_trace,
    "rc_lossy": rc_lossy,
    "rc_reject": rc_reject,
    "rc_timeout": rc_timeout,
    "ud_sidr": ud_sidr,
    "ud_reject": ud_reject,
    "migrate": migrate,
    "loopback": loopback,
    "mra": mra,
    "dreq_timeout": dreq_timeout,
    "addr_pending": addr_pending,
    "backlog": backlog,
    "stale": stale,
    "mcast": mcast,
}

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name, make in SEEDS.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(make())
print(f"cm_seeds: {len(SEEDS)} programs in {out}")
