#!/usr/bin/python3
"""Writes the golden ICRC vectors as libFuzzer seed files.
usage: seed_corpus.py VECTORS_TXT OUT_DIR"""
import os
import sys

vectors, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
n = 0
with open(vectors) as f:
    for line in f:
        if not line.strip() or line.startswith("#"):
            continue
        name, _ipver, _valid, hexframe = line.split()
        with open(os.path.join(out, name), "wb") as g:
            g.write(bytes.fromhex(hexframe))
        n += 1
print(f"seed_corpus: {n} frames in {out}")
