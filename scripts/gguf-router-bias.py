#!/usr/bin/env python3
"""Skews a Kimi GGUF's routing in place (issue 51): writes every MoE layer's router bias
(blk.N.exp_probs_b.bias, F32 [experts], the bias that only the top-k selection adds) as

    b_e = -BETA * ln(rank_e),  rank_e = 1 + a per-layer random permutation of the experts (SEED),

so that an expert's share of the routing falls with its rank, Zipf-like, and each layer favours
different experts. hyla and llama.cpp both add this bias before the top-k, so both read the same
skewed routing from the same file. BETA 0 writes zeros: the file's routing as `hyla init` wrote it.
How skewed the result is, is measured, not assumed: hyla bench reports the share of the routed
rows that the top 20% of the experts took (expert_top20_share).

Only the bias tensors' bytes change (26 KB of a 29 GB file, written in place and fsynced: copying
the file would need its size again on disk).
    python3 scripts/gguf-router-bias.py FILE.gguf BETA [SEED]
"""
import math
import os
import random
import re
import struct
import sys

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


def read(f, fmt):
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        sys.exit(f"{f.name}: truncated GGUF header")
    return struct.unpack("<" + fmt, data)[0]


def read_string(f):
    return f.read(read(f, "Q")).decode("utf-8")


def read_value(f, kind):
    if kind == STRING:
        return read_string(f)
    if kind == ARRAY:
        inner, n = read(f, "I"), read(f, "Q")
        return [read_value(f, inner) for _ in range(n)]
    if kind not in SCALAR:
        sys.exit(f"{f.name}: unknown GGUF value type {kind}")
    return read(f, SCALAR[kind])


def bias_tensors(path):
    """(name, experts, absolute offset) of every blk.N.exp_probs_b.bias, which must be F32."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = read(f, "I"), read(f, "Q"), read(f, "Q")
        if version < 2:
            sys.exit(f"{path}: GGUF version {version} is too old")
        alignment = 32
        for _ in range(n_kv):
            key, kind = read_string(f), read(f, "I")
            value = read_value(f, kind)
            if key == "general.alignment":
                alignment = value
        tensors = []
        for _ in range(n_tensors):
            name = read_string(f)
            dims = [read(f, "Q") for _ in range(read(f, "I"))]
            ggml_type, offset = read(f, "I"), read(f, "Q")
            tensors.append((name, dims, ggml_type, offset))
        data_start = (f.tell() + alignment - 1) // alignment * alignment
    out = []
    for name, dims, ggml_type, offset in tensors:
        if re.fullmatch(r"blk\.\d+\.exp_probs_b\.bias", name):
            if ggml_type != 0 or len(dims) != 1:
                sys.exit(f"{path}: {name} is not an F32 vector (type {ggml_type}, dims {dims})")
            out.append((name, dims[0], data_start + offset))
    if not out:
        sys.exit(f"{path}: no blk.N.exp_probs_b.bias tensors (not a Kimi MoE GGUF?)")
    return out


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    path, beta = sys.argv[1], float(sys.argv[2])
    seed = int(sys.argv[3]) if len(sys.argv) == 4 else 1
    if not (beta >= 0 and math.isfinite(beta)):
        sys.exit(f"BETA must be a finite number >= 0, not {sys.argv[2]}")
    rng = random.Random(seed)
    tensors = bias_tensors(path)
    with open(path, "r+b") as f:
        for name, experts, offset in tensors:
            ranks = list(range(1, experts + 1))
            rng.shuffle(ranks)
            f.seek(offset)
            f.write(struct.pack(f"<{experts}f", *(-beta * math.log(r) for r in ranks)))
        f.flush()
        os.fsync(f.fileno())
    print(f"{path}: {len(tensors)} router biases written, beta {beta}, seed {seed}")


if __name__ == "__main__":
    main()
