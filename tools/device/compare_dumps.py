#!/usr/bin/env python3
"""compare_dumps.py — the outputs of two runs of the same case (`attest repro --dump DIR`),
e.g. the CUDA example plugin on a GPU against the CPU build of the same row code
(kernels/plugin/examples/flash_rows.h). The two differ only where expf/logf/tanhf differ
between CUDA's libdevice and glibc, so the outputs should agree to a few ULPs; a race,
an indexing error or an unwritten element shows up as a large difference or a NaN.

Usage: compare_dumps.py A_DIR B_DIR  (each holding outputs.safetensors)
Prints one line per tensor: elements differing, max ULP distance in the tensor's dtype,
max |a - b| / max |b|. Exit 1 when a tensor is missing, has another shape, differs in NaN
placement, or has max |a - b| / max |b| above 1e-2 (far beyond libm differences).
Reads safetensors directly (8-byte header length, JSON header, raw little-endian data), so
only numpy is needed.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": (np.float32, np.int32), "BF16": (None, np.int16), "F16": (np.float16, np.int16),
          "F64": (np.float64, np.int64)}


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        raw = data[begin:end]
        kind = meta["dtype"]
        codes = np.frombuffer(raw, dtype=DTYPES[kind][1]).reshape(meta["shape"])
        if kind == "BF16":
            values = (codes.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(raw, dtype=DTYPES[kind][0]).reshape(meta["shape"])
        out[name] = (kind, codes, values.astype(np.float64))
    return out


def ordered(codes):
    """Sign-magnitude codes to integers in value order (ULP distance = difference)."""
    c = codes.astype(np.int64)
    bits = codes.dtype.itemsize * 8
    sign = np.int64(1) << (bits - 1)
    mag = c & (sign - 1)
    return np.where(c < 0, -mag, mag)


def main():
    a_dir, b_dir = sys.argv[1], sys.argv[2]
    try:
        a = load(a_dir + "/outputs.safetensors")
        b = load(b_dir + "/outputs.safetensors")
    except OSError as e:
        print(f"  no outputs to compare: {e}")
        return 1
    bad = False
    for name in ("o", "lse", "dq", "dk", "dv"):
        if name not in a or name not in b:
            print(f"  {name}: missing in {'A' if name not in a else 'B'}")
            bad = True
            continue
        (ka, ca, va), (kb, cb, vb) = a[name], b[name]
        if ka != kb or ca.shape != cb.shape:
            print(f"  {name}: {ka}{list(ca.shape)} vs {kb}{list(cb.shape)}")
            bad = True
            continue
        nan_a, nan_b = np.isnan(va), np.isnan(vb)
        finite = ~(nan_a | nan_b) & np.isfinite(va) & np.isfinite(vb)
        differ = int(np.count_nonzero(ca != cb))
        ulps = int(np.max(np.abs(ordered(ca) - ordered(cb))[finite], initial=0))
        scale = float(np.max(np.abs(vb[finite]), initial=0.0))
        rel = float(np.max(np.abs(va[finite] - vb[finite]), initial=0.0)) / scale if scale > 0 else 0.0
        nan_mismatch = int(np.count_nonzero(nan_a != nan_b))
        flag = ""
        if nan_mismatch or rel > 1e-2 or not np.array_equal(np.isinf(va), np.isinf(vb)):
            flag = "  <-- DIVERGES"
            bad = True
        print(f"  {name:3s} {ka:4s} {differ:8d} of {ca.size:8d} differ, max {ulps} ulp, "
              f"max|a-b|/max|b| {rel:.2e}, NaN mismatches {nan_mismatch}{flag}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
