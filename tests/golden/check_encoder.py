#!/usr/bin/python3
"""Verifies frames from urnic's encoder (dump_frames) with independent code:
scapy recomputes and dissects IPv4 frames, the zlib derivation of
gen_icrc_vectors.py checks IPv4 and IPv6 ICRCs, and the IPv4 header
checksum is recomputed. usage: check_encoder.py DUMP_FRAMES_BINARY"""
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_icrc_vectors as g  # noqa: E402
from scapy.all import Ether, IP, IPv6, UDP, Dot1Q  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402

out = subprocess.run([sys.argv[1]], check=True, capture_output=True,
                     text=True).stdout
ok = bad = 0
for line in out.splitlines():
    name, ipver, _valid, hexframe = line.split()
    frame = bytes.fromhex(hexframe)
    errors = []
    if g.roce_icrc(frame) != frame[-4:]:
        errors.append("ICRC differs from the zlib derivation")
    p = Ether(frame)
    if UDP not in p or p[UDP].dport != 4791 or BTH not in p:
        errors.append("scapy does not see RoCEv2")
    else:
        if p[BTH].opcode != int(name.split("_")[1], 16):
            errors.append("scapy reads another opcode")
        if (name.find("_vlan_") >= 0) != (Dot1Q in p):
            errors.append("VLAN tag presence wrong")
        if ipver == "4":
            if g.scapy_icrc(frame) != frame[-4:]:
                errors.append("ICRC differs from scapy's")
            ip = p[IP]
            chk = ip.chksum
            del ip.chksum
            if IP(bytes(ip))[IP].chksum != chk:
                errors.append("IPv4 header checksum wrong")
            if ip.len != len(bytes(ip)):
                errors.append("IPv4 total length wrong")
        else:
            if p[IPv6].plen != len(bytes(p[IPv6].payload)):
                errors.append("IPv6 payload length wrong")
        if p[UDP].len != len(bytes(p[UDP])):
            errors.append("UDP length wrong")
    if errors:
        bad += 1
        print("FAIL", name, "; ".join(errors))
    else:
        ok += 1
print(f"{ok} passed, {bad} failed")
sys.exit(1 if bad or ok == 0 else 0)
