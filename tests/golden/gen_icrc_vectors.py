#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0-only
# (links against scapy, which is GPL-2.0-only; the generated vectors are data)
"""
Generate golden RoCEv2 ICRC test vectors for urnic.

Usage (from the repository root):

    /usr/bin/python3 tests/golden/gen_icrc_vectors.py > tests/golden/icrc_vectors.txt

Must be run with Debian's /usr/bin/python3, which has scapy
(/usr/lib/python3/dist-packages/scapy).  The output is deterministic: a fixed
random seed is used and every field scapy would otherwise fill from the host
(MAC/IP addresses, ports) is set explicitly.

Output format (one vector per line, '#' lines are comments):

    <name> <ipver 4|6> <valid 1|0> <frame_hex>

frame_hex is the whole Ethernet frame (optionally with one 802.1Q tag), in
lowercase hex, ending with the 4 ICRC bytes (no Ethernet FCS).

Where the ICRC comes from
-------------------------
* IPv4 vectors: the ICRC is computed by scapy itself (scapy.contrib.roce.BTH
  with icrc=None; BTH.compute_icrc / pack_icrc).  That is an implementation
  independent of urnic.
* IPv6 vectors: scapy's BTH does not support IPv6 (it writes ICRC 0 and
  warns), so the ICRC is computed by roce_icrc() below.  roce_icrc() is a
  plain-bytes implementation that handles both IPv4 and IPv6; before it is
  trusted for IPv6 it is run over every IPv4 frame and asserted to equal
  scapy's ICRC (self-check, see main()).

ICRC derivation (IBTA Vol.1 Annex A17 "RoCEv2", section A17.4.1; identical to
Linux drivers/infiniband/sw/rxe/rxe_icrc.c):

  The ICRC is the InfiniBand invariant CRC (CRC-32, polynomial 0x04C11DB7,
  reflected, init 0xFFFFFFFF, final XOR 0xFFFFFFFF -- i.e. exactly zlib.crc32 /
  Ethernet CRC-32) computed over a pseudo-packet in which every field that may
  legitimately change in flight is replaced by all ones:

    1. 8 bytes 0xFF            -- stands in for the (absent) IB LRH, which is
                                  fully masked in the IB ICRC definition.
                                  (rxe starts its CRC with the seed 0xdebb20e3,
                                  which is the CRC-32 state after exactly these
                                  8 bytes of 0xFF.)
    2. the IP header, with
       IPv4: TOS (DSCP+ECN) = 0xFF, TTL = 0xFF, header checksum = 0xFFFF
             (version/IHL, total length, id, flags/frag offset, protocol,
             addresses unchanged);
       IPv6: Traffic Class (DSCP+ECN) = 0xFF, Flow Label = 0xFFFFF,
             Hop Limit = 0xFF (version nibble, payload length, next header,
             addresses unchanged).
    3. the UDP header with checksum = 0xFFFF (ports and length unchanged).
    4. the BTH with byte 4 (FECN, BECN and the 6 reserved bits) = 0xFF.
    5. everything after the BTH (extension headers, payload, pad bytes) up to
       but excluding the 4-byte ICRC itself.

  The IPv4 length / IPv6 payload length and UDP length are the on-the-wire
  values, i.e. they already include the 4 ICRC bytes.

  The CRC value is stored on the wire least-significant byte first
  (scapy: struct.pack('!I', icrc)[::-1]; rxe stores the u32 in CPU order on a
  little-endian host).

  Why the IPv6 rule is the IPv4 rule: in both cases the masked fields are the
  ones routers/switches may rewrite: TTL / Hop Limit (decremented per hop),
  TOS / Traffic Class including the ECN bits (DSCP remarking, ECN CE marking
  by congestion points), the IPv4 header checksum (recomputed whenever TTL/TOS
  change; IPv6 has none), the IPv6 Flow Label (may be set/rewritten by
  intermediate nodes, RFC 6437), the UDP checksum (may be zero, or updated by
  NAT/middleboxes), and the BTH FECN/BECN bits (set by IB congestion
  handling; their 6 neighbouring reserved bits are masked together with them
  because they share the byte).  Everything else -- addresses, lengths,
  protocol/next header, ports, the rest of the BTH, all extension headers and
  the payload -- is end-to-end invariant and therefore protected.  IPv6 simply
  has no header checksum field and adds the flow label to the variant set;
  in rxe terms: IPv4 sets ttl=0xff, tos=0xff, check=CSUM_MANGLED_0; IPv6 sets
  priority=0xf, flow_lbl[0..2]=0xff (together: TC and flow label all ones) and
  hop_limit=0xff; both set udph->check=0xffff and bth byte 4 to 0xff.
"""

import random
import struct
import sys
import zlib

from scapy.layers.l2 import Ether, Dot1Q
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw
from scapy.contrib.roce import BTH, AETH
import scapy

SEED = 0x0C0EC2  # "RoCE v2"
ROCE_PORT = 4791

# ---------------------------------------------------------------------------
# Independent plain-bytes ICRC implementation (no scapy involved).
# ---------------------------------------------------------------------------


def roce_icrc(frame: bytes) -> bytes:
    """Return the 4 ICRC bytes (wire order) for an Ethernet RoCEv2 frame.

    `frame` must be the complete frame including a 4-byte ICRC placeholder at
    the end (its content is ignored); lengths in IP/UDP must already count it.
    """
    off = 12
    ethertype = struct.unpack_from('!H', frame, off)[0]
    off += 2
    while ethertype in (0x8100, 0x88a8):  # skip VLAN tags (not covered)
        ethertype = struct.unpack_from('!H', frame, off + 2)[0]
        off += 4
    if ethertype == 0x0800:
        ihl = (frame[off] & 0x0F) * 4
        ip = bytearray(frame[off:off + ihl])
        assert ip[9] == 17, 'not UDP'
        ip[1] = 0xFF            # TOS (DSCP + ECN)
        ip[8] = 0xFF            # TTL
        ip[10:12] = b'\xff\xff'  # header checksum
        iplen = struct.unpack_from('!H', frame, off + 2)[0]
        assert off + iplen == len(frame), 'IPv4 total length mismatch'
    elif ethertype == 0x86DD:
        ihl = 40
        ip = bytearray(frame[off:off + ihl])
        assert ip[6] == 17, 'not UDP (extension headers unsupported)'
        # byte0: version(4) | TC hi(4); byte1: TC lo(4) | FL hi(4); 2..3: FL
        ip[0] = (ip[0] & 0xF0) | 0x0F
        ip[1] = 0xFF
        ip[2] = 0xFF
        ip[3] = 0xFF
        ip[7] = 0xFF            # hop limit
        plen = struct.unpack_from('!H', frame, off + 4)[0]
        assert off + 40 + plen == len(frame), 'IPv6 payload length mismatch'
    else:
        raise ValueError('unsupported ethertype 0x%04x' % ethertype)
    off += ihl
    udp = bytearray(frame[off:off + 8])
    assert struct.unpack_from('!H', udp, 2)[0] == ROCE_PORT, 'not RoCEv2'
    assert struct.unpack_from('!H', udp, 4)[0] == len(frame) - off, \
        'UDP length mismatch'
    udp[6:8] = b'\xff\xff'      # UDP checksum
    off += 8
    bth = bytearray(frame[off:off + 12])
    bth[4] = 0xFF               # FECN | BECN | resv6
    off += 12
    rest = frame[off:-4]
    pseudo = b'\xff' * 8 + bytes(ip) + bytes(udp) + bytes(bth) + rest
    crc = zlib.crc32(pseudo) & 0xFFFFFFFF
    return struct.pack('<I', crc)


# ---------------------------------------------------------------------------
# Opcode table: opcode -> (name, extension header list, carries payload,
# payload kind)  payload kind: 'full' (FIRST/MIDDLE: exactly one PMTU),
# 'last' (1..PMTU), 'only' (0..PMTU), None (no payload)
# ---------------------------------------------------------------------------

RC_UC_BASE = [
    # off, name, ext headers, payload kind
    (0x00, 'send_first', [], 'full'),
    (0x01, 'send_middle', [], 'full'),
    (0x02, 'send_last', [], 'last'),
    (0x03, 'send_last_imm', ['IMM'], 'last'),
    (0x04, 'send_only', [], 'only'),
    (0x05, 'send_only_imm', ['IMM'], 'only'),
    (0x06, 'write_first', ['RETH'], 'full'),
    (0x07, 'write_middle', [], 'full'),
    (0x08, 'write_last', [], 'last'),
    (0x09, 'write_last_imm', ['IMM'], 'last'),
    (0x0a, 'write_only', ['RETH'], 'only'),
    (0x0b, 'write_only_imm', ['RETH', 'IMM'], 'only'),
]

RC_ONLY = [
    (0x0c, 'read_request', ['RETH'], None),
    (0x0d, 'read_resp_first', ['AETH'], 'full'),
    (0x0e, 'read_resp_middle', [], 'full'),
    (0x0f, 'read_resp_last', ['AETH'], 'last'),
    (0x10, 'read_resp_only', ['AETH'], 'only'),
    (0x11, 'ack', ['AETH'], None),
    (0x12, 'atomic_ack', ['AETH', 'ATOMICACK'], None),
    (0x13, 'cmp_swap', ['ATOMIC'], None),
    (0x14, 'fetch_add', ['ATOMIC'], None),
    (0x16, 'send_last_inv', ['IETH'], 'last'),
    (0x17, 'send_only_inv', ['IETH'], 'only'),
]

OPCODES = {}
for (o, n, e, p) in RC_UC_BASE + RC_ONLY:
    OPCODES[0x00 + o] = ('rc_' + n, e, p)
for (o, n, e, p) in RC_UC_BASE:
    OPCODES[0x20 + o] = ('uc_' + n, e, p)
OPCODES[0x64] = ('ud_send_only', ['DETH'], 'only')
OPCODES[0x65] = ('ud_send_only_imm', ['DETH', 'IMM'], 'only')
OPCODES[0x81] = ('cnp', ['CNP'], None)

RESPONSES = {0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12}
# opcodes on which the Solicited Event bit is meaningful
SE_OK = {0x02, 0x03, 0x04, 0x05, 0x09, 0x0b, 0x16, 0x17,
         0x22, 0x23, 0x24, 0x25, 0x29, 0x2b, 0x64, 0x65}

EXT_LEN = {'IMM': 4, 'RETH': 16, 'AETH': 4, 'ATOMICACK': 8, 'ATOMIC': 28,
           'IETH': 4, 'DETH': 8, 'CNP': 16}

PMTUS = [256, 512, 1024]
DSCPS = [0, 0, 26, 26, 24, 46, 10, 48, 34, 63]
ECNS = [0, 1, 2, 2, 3]  # Not-ECT, ECT(1), ECT(0), CE
PKEYS = [0xffff, 0xffff, 0xffff, 0x8001, 0x7fff, 0x8123, 0x0001]


class Rng:
    """Thin wrapper so that all randomness comes from one seeded source."""

    def __init__(self, seed):
        self.r = random.Random(seed)

    def bits(self, n):
        return self.r.getrandbits(n)

    def choice(self, seq):
        return self.r.choice(seq)

    def randint(self, a, b):
        return self.r.randint(a, b)

    def chance(self, p):
        return self.r.random() < p

    def data(self, n):
        return bytes(self.r.getrandbits(8) for _ in range(n))


def payload_len(rng, kind, pmtu):
    if kind is None:
        return 0
    if kind == 'full':
        return pmtu
    lo = 1 if kind == 'last' else 0
    # bias towards small sizes and every residue mod 4
    pick = rng.r.random()
    if pick < 0.35:
        return rng.randint(lo, 16)
    if pick < 0.5:
        return pmtu
    return rng.randint(lo, pmtu)


def ext_bytes(rng, opcode, exts, plen, pmtu):
    """Plausible extension header bytes (in BTH order)."""
    out = b''
    for e in exts:
        if e == 'RETH':
            va = rng.bits(48) & ~0x7 | 0x7f0000000000
            rkey = rng.bits(32)
            if opcode in (0x0a, 0x0b, 0x2a, 0x2b):      # *_ONLY: whole msg
                dlen = plen
            elif opcode == 0x0c:                         # READ_REQUEST
                dlen = rng.choice([0, 1, 8, 64, 4096, 65536,
                                   rng.randint(1, 1 << 20)])
            else:                                        # WRITE_FIRST
                dlen = pmtu * rng.randint(2, 16) + rng.randint(0, pmtu - 1)
            out += struct.pack('!QII', va, rkey, dlen)
        elif e == 'AETH':
            if opcode == 0x11 and rng.chance(0.25):
                # NAK (0x60|code) or RNR NAK (0x20|timer)
                syn = rng.choice([0x60, 0x61, 0x62, 0x63, 0x64,
                                  0x20 | rng.bits(5)])
            else:
                syn = rng.bits(5)                # ACK with credit count
            out += bytes(AETH(syndrome=syn, msn=rng.bits(24)))
        elif e == 'ATOMICACK':
            out += struct.pack('!Q', rng.bits(64))
        elif e == 'ATOMIC':
            va = rng.bits(48) & ~0x7 | 0x7f0000000000
            rkey = rng.bits(32)
            if opcode == 0x14:
                swap, cmp = rng.choice([1, 0x100, rng.bits(64)]), 0
            else:
                swap, cmp = rng.bits(64), rng.bits(64)
            out += struct.pack('!QIQQ', va, rkey, swap, cmp)
        elif e == 'IMM':
            out += struct.pack('!I', rng.bits(32))
        elif e == 'IETH':
            out += struct.pack('!I', rng.bits(32))       # R_Key to invalidate
        elif e == 'DETH':
            qkey = rng.choice([0x80010000, 0x11111111, rng.bits(31)])
            out += struct.pack('!IB', qkey, 0) + rng.bits(24).to_bytes(3, 'big')
        elif e == 'CNP':
            out += bytes(16)
        else:
            raise AssertionError(e)
        assert len(out) % 4 == 0
    assert len(out) == sum(EXT_LEN[e] for e in exts)
    return out


def mac(rng):
    return ':'.join('%02x' % b for b in bytes([0x02]) + rng.data(5))


def ipv4_addr(rng):
    return '10.%d.%d.%d' % (rng.randint(0, 255), rng.randint(0, 255),
                            rng.randint(1, 254))


def ipv6_addr(rng):
    kind = rng.randint(0, 2)
    if kind == 0:     # RoCE GID style: IPv4-mapped
        return '::ffff:192.168.%d.%d' % (rng.randint(0, 255),
                                        rng.randint(1, 254))
    if kind == 1:     # ULA
        return 'fd00:%x:%x::%x' % (rng.bits(16), rng.bits(16), rng.bits(16))
    return 'fe80::%x:%x:%x:%x' % (rng.bits(16), rng.bits(16), rng.bits(16),
                                  rng.bits(16))


def build(rng, ipver, opcode, plen=None, vlan=False, pmtu=None):
    """Build one valid frame; return (frame bytes, descriptive name)."""
    name, exts, kind = OPCODES[opcode]
    if pmtu is None:
        pmtu = rng.choice(PMTUS)
    if plen is None:
        plen = payload_len(rng, kind, pmtu)
    assert kind is not None or plen == 0
    pad = (4 - plen % 4) % 4
    body = ext_bytes(rng, opcode, exts, plen, pmtu) + rng.data(plen) + \
        bytes(pad)

    if opcode == 0x81:     # CNP
        bth = BTH(opcode=opcode, solicited=0, migreq=0, padcount=0,
                  pkey=rng.choice(PKEYS), fecn=0, becn=1,
                  dqpn=rng.randint(2, 0xfffffe), ackreq=0, psn=0)
    else:
        se = int(opcode in SE_OK and rng.chance(0.4))
        ackreq = 0 if opcode in RESPONSES else int(rng.chance(0.5))
        bth = BTH(opcode=opcode, solicited=se, migreq=int(rng.chance(0.7)),
                  padcount=pad, pkey=rng.choice(PKEYS),
                  fecn=int(rng.chance(0.2)), becn=int(rng.chance(0.2)),
                  # QP0/QP1 are the special SMI/GSI QPs (MADs only) and
                  # 0xffffff is the multicast QPN: avoid them
                  dqpn=rng.randint(2, 0xfffffe),
                  ackreq=ackreq, psn=rng.choice([0, 0xffffff, rng.bits(24)]))

    sport = rng.choice([0xc000 | rng.bits(14), rng.bits(16) or 1, 49152,
                        0xffff])
    # UDP checksum: mostly 0 (what RoCE NICs send), else random non-zero.
    # (It is masked by the ICRC, so any value is valid.)
    uchk = 0 if rng.chance(0.6) else (rng.bits(16) or 0x1234)
    udp = UDP(sport=sport, dport=ROCE_PORT, chksum=uchk)
    tos = (rng.choice(DSCPS) << 2) | rng.choice(ECNS)

    eth = Ether(src=mac(rng), dst=mac(rng))
    if vlan:
        eth = eth / Dot1Q(prio=rng.randint(0, 7), vlan=rng.randint(1, 4094))

    if ipver == 4:
        ip = IP(src=ipv4_addr(rng), dst=ipv4_addr(rng), tos=tos,
                ttl=rng.choice([64, 64, 255, 1, 32, rng.randint(1, 255)]),
                id=rng.bits(16), flags='DF' if rng.chance(0.75) else 0)
        bth.icrc = None   # scapy computes the ICRC (BTH.post_build)
        pkt = eth / ip / udp / (bth / Raw(body) if body else bth)
        frame = bytes(pkt)
    else:
        ip = IPv6(src=ipv6_addr(rng), dst=ipv6_addr(rng), tc=tos,
                  fl=rng.choice([0, rng.bits(20), 0xfffff]),
                  hlim=rng.choice([64, 64, 255, 1, rng.randint(1, 255)]))
        bth.icrc = 0      # placeholder (scapy can't do IPv6), replaced below
        pkt = eth / ip / udp / (bth / Raw(body) if body else bth)
        frame = bytes(pkt)
        frame = frame[:-4] + roce_icrc(frame)

    # sanity: layout is what the C++ side will expect
    l2 = 18 if vlan else 14
    l3 = 20 if ipver == 4 else 40
    assert len(frame) == l2 + l3 + 8 + 12 + len(body) + 4
    return frame, name


def scapy_icrc(frame):
    """Let scapy recompute the ICRC of an (IPv4) frame as dissected."""
    p = Ether(frame)
    p[BTH].icrc = None
    return bytes(p)[-4:]


def flip_bit(frame, idx, bit):
    b = bytearray(frame)
    b[idx] ^= 1 << bit
    return bytes(b)


def main():
    rng = Rng(SEED)
    vectors = []   # (name, ipver, valid, frame)
    counter = [0]

    def add(prefix, name, ipver, valid, frame):
        vectors.append(('%s_%s_%03d' % (prefix, name, counter[0]), ipver,
                        valid, frame))
        counter[0] += 1

    all_ops = sorted(OPCODES)
    payload_ops = [o for o in all_ops if OPCODES[o][2] is not None]
    var_ops = [o for o in payload_ops if OPCODES[o][2] != 'full']

    # --- IPv4, scapy-computed ----------------------------------------------
    v4 = []
    for op in all_ops:                                   # every opcode once
        v4.append(build(rng, 4, op))
    for plen in [0, 1, 2, 3, 4, 5, 6, 7, 8, 255, 1021, 1022, 1023, 1024]:
        op = rng.choice([o for o in var_ops
                         if plen > 0 or OPCODES[o][2] == 'only'])
        v4.append(build(rng, 4, op, plen=plen, pmtu=1024))
    for op in [0x04, 0x0a, 0x11, 0x64, 0x81, 0x13]:      # 802.1Q tagged
        v4.append(build(rng, 4, op, vlan=True))
    for _ in range(30):                                  # random extras
        v4.append(build(rng, 4, rng.choice(all_ops), vlan=rng.chance(0.1)))
    for frame, name in v4:
        add('v4', name, 4, 1, frame)

    # --- IPv6, own derivation ----------------------------------------------
    v6 = []
    for op in all_ops:
        v6.append(build(rng, 6, op))
    for plen in [0, 1, 2, 3, 7, 1023, 1024]:
        op = rng.choice([o for o in var_ops
                         if plen > 0 or OPCODES[o][2] == 'only'])
        v6.append(build(rng, 6, op, plen=plen, pmtu=1024))
    for op in [0x04, 0x11, 0x65, 0x81]:
        v6.append(build(rng, 6, op, vlan=True))
    for _ in range(10):
        v6.append(build(rng, 6, rng.choice(all_ops), vlan=rng.chance(0.1)))
    for frame, name in v6:
        add('v6', name, 6, 1, frame)

    # --- Self-check: own implementation == scapy on every IPv4 frame --------
    nchk = 0
    for (vname, ipver, valid, frame) in vectors:
        if ipver == 4:
            mine = roce_icrc(frame)
            assert mine == frame[-4:], \
                'self-check FAILED for %s: mine %s scapy %s' % (
                    vname, mine.hex(), frame[-4:].hex())
            # and scapy's dissector rebuilds the identical frame
            assert bytes(Ether(frame)) == frame, vname
            assert scapy_icrc(frame) == frame[-4:], vname
            nchk += 1
    print('self-check: roce_icrc() == scapy ICRC for all %d IPv4 frames'
          % nchk, file=sys.stderr)

    # --- Masking vectors: mutate in-flight-variant fields, keep ICRC --------
    # (valid=1: the ICRC must still verify).  IPv4 header checksum is
    # recomputed so that the frames are otherwise well-formed.
    def mutate_variant(frame, ipver):
        b = bytearray(frame)
        off = 14
        if struct.unpack_from('!H', b, 12)[0] == 0x8100:
            off = 18
        if ipver == 4:
            b[off + 1] = rng.bits(8)             # TOS (DSCP/ECN, e.g. CE)
            b[off + 1] |= 0x03                   # ... mark CE
            b[off + 8] = rng.randint(1, 255)     # TTL
            b[off + 10:off + 12] = b'\0\0'
            s = sum(struct.unpack('!10H', bytes(b[off:off + 20])))
            s = (s & 0xffff) + (s >> 16)
            s = (s & 0xffff) + (s >> 16)
            struct.pack_into('!H', b, off + 10, ~s & 0xffff)
            uoff = off + 20
        else:
            tc = rng.bits(8) | 0x03
            fl = rng.bits(20)
            struct.pack_into('!I', b, off, (6 << 28) | (tc << 20) | fl)
            b[off + 7] = rng.randint(1, 255)     # hop limit
            uoff = off + 40
        struct.pack_into('!H', b, uoff + 6, rng.bits(16))   # UDP checksum
        b[uoff + 8 + 4] ^= 0xC0                  # toggle FECN and BECN
        return bytes(b)

    for i in range(4):
        frame, name = v4[(i * 17 + 3) % len(v4)]
        m = mutate_variant(frame, 4)
        assert roce_icrc(m) == m[-4:] and m != frame
        assert scapy_icrc(m) == m[-4:]          # scapy agrees, too
        add('v4_masked', name, 4, 1, m)
    for i in range(4):
        frame, name = v6[(i * 11 + 5) % len(v6)]
        m = mutate_variant(frame, 6)
        assert roce_icrc(m) == m[-4:] and m != frame
        add('v6_masked', name, 6, 1, m)

    # --- Negative vectors ---------------------------------------------------
    def l3off(frame):
        return 18 if struct.unpack_from('!H', frame, 12)[0] == 0x8100 else 14

    negs = []
    picks4 = [v4[i] for i in (1, 8, 20, 40, 55, 70)]
    picks6 = [v6[i] for i in (4, 12, 25, 40, 50)]
    for k, (frame, name) in enumerate(picks4 + picks6):
        ipver = 4 if k < len(picks4) else 6
        hdr = l3off(frame) + (20 if ipver == 4 else 40) + 8   # BTH offset
        mode = k % 4
        if mode == 0:      # one bit of the ICRC flipped
            bad = flip_bit(frame, len(frame) - 1 - rng.randint(0, 3),
                           rng.randint(0, 7))
            tag = 'icrcbit'
        elif mode == 1 and len(frame) > hdr + 12 + 4:   # body byte flipped
            idx = rng.randint(hdr + 12, len(frame) - 5)
            bad = flip_bit(frame, idx, rng.randint(0, 7))
            tag = 'bodybit'
        elif mode == 2:    # unmasked BTH bit (PSN LSB) flipped
            bad = flip_bit(frame, hdr + 11, 0)
            tag = 'psnbit'
        else:              # unmasked IP source address bit flipped
            src = l3off(frame) + (12 if ipver == 4 else 8)
            bad = flip_bit(frame, src + 3, 0)
            tag = 'srcipbit'
        assert roce_icrc(bad) != bad[-4:]
        if ipver == 4:
            assert scapy_icrc(bad) != bad[-4:]
        negs.append(('v%d_bad_%s' % (ipver, tag), name, ipver, bad))
    for (prefix, name, ipver, bad) in negs:
        add(prefix, name, ipver, 0, bad)

    # --- Output ---------------------------------------------------------------
    n4 = sum(1 for v in vectors if v[1] == 4 and v[2] == 1)
    n6 = sum(1 for v in vectors if v[1] == 6 and v[2] == 1)
    nbad = sum(1 for v in vectors if v[2] == 0)
    covered4 = {OPCODES[o][0] for o in all_ops}
    assert all(v[0] and ' ' not in v[0] for v in vectors)
    assert len({v[0] for v in vectors}) == len(vectors), 'duplicate names'

    out = sys.stdout
    out.write('# urnic golden RoCEv2 ICRC vectors -- GENERATED, do not edit.\n')
    out.write('# Generated by: /usr/bin/python3 tests/golden/gen_icrc_vectors.py'
              ' > tests/golden/icrc_vectors.txt\n')
    out.write('# (scapy %s, seed 0x%x; see tests/golden/README.md)\n'
              % (scapy.__version__, SEED))
    out.write('# IPv4 ICRCs computed by scapy.contrib.roce.BTH; IPv6 ICRCs by '
              'the script\'s own\n# Annex A17 / rxe_icrc.c implementation, '
              'which was asserted equal to scapy\n# on every IPv4 vector.\n')
    out.write('# *_masked_* vectors: in-flight-variant fields (TOS/TC, ECN, '
              'TTL/hop limit,\n# flow label, IPv4 csum, UDP csum, FECN/BECN) '
              'changed after ICRC computation;\n# the ICRC must still verify.\n')
    out.write('# *_bad_* vectors: deliberately corrupted after ICRC '
              'computation (valid=0).\n')
    out.write('# Counts: %d valid IPv4, %d valid IPv6, %d invalid; %d opcodes '
              'covered.\n' % (n4, n6, nbad, len(covered4)))
    out.write('# Format: <name> <ipver 4|6> <valid 1|0> <frame_hex>\n')
    out.write('# frame_hex = whole Ethernet frame (optionally one 802.1Q tag), '
              'ending with the\n# 4 ICRC bytes (LSB of the CRC first), no '
              'Ethernet FCS.\n')
    for (vname, ipver, valid, frame) in vectors:
        out.write('%s %d %d %s\n' % (vname, ipver, valid, frame.hex()))
    print('wrote %d vectors (%d v4 valid, %d v6 valid, %d invalid)'
          % (len(vectors), n4, n6, nbad), file=sys.stderr)


if __name__ == '__main__':
    main()
