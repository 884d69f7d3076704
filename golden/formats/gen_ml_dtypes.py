#!/usr/bin/env python3
"""Conversion vectors from ml_dtypes (and numpy for float16) for format_golden_test.

Writes golden/formats/ml_dtypes_vectors.safetensors (plain safetensors, written by hand
below so that only numpy and ml_dtypes are needed). For each format F in
bf16 f16 e4m3fn e5m2 e3m2fn e2m3fn e2m1fn e8m0fnu:
  F.f32_in   F32 [n]  fp32 inputs: every representable value and every midpoint between
                      neighbours (both signs, the overflow midpoint too), each exactly and
                      +-1 fp32 ulp, specials (+-0, +-Inf, NaNs with payloads), and 4096
                      seeded random fp32 bit patterns (numpy PCG64, seed 20261202)
  F.f32_rne  codes    ml_dtypes `x.astype(F)` of F.f32_in (round to nearest even)
  F.f64_in   F64 [m]  float64 inputs just above/below each midpoint (+-2^-40 relative),
                      beyond fp32 precision: they detect double rounding through float
  F.f64_rne  codes    ml_dtypes `x.astype(F)` of F.f64_in
  F.decode   F64 [2^bits] every code widened by ml_dtypes to float64 (F32 for bf16/f16,
                      whose values fp32 holds exactly)
Codes use the safetensors dtype of the format (BF16 F16 F8_E4M3 F8_E5M2 F8_E8M0) or U8 (one
code per byte, low bits) for fp6/fp4. Metadata records the ml_dtypes and numpy versions.

Run:  python3 golden/formats/gen_ml_dtypes.py golden/formats/ml_dtypes_vectors.safetensors
"""
import json
import struct
import sys

import ml_dtypes
import numpy as np

FORMATS = [
    # name, numpy dtype, safetensors dtype of the codes, code view dtype, bits
    ("bf16", ml_dtypes.bfloat16, "BF16", np.uint16, 16),
    ("f16", np.float16, "F16", np.uint16, 16),
    ("e4m3fn", ml_dtypes.float8_e4m3fn, "F8_E4M3", np.uint8, 8),
    ("e5m2", ml_dtypes.float8_e5m2, "F8_E5M2", np.uint8, 8),
    ("e3m2fn", ml_dtypes.float6_e3m2fn, "U8", np.uint8, 6),
    ("e2m3fn", ml_dtypes.float6_e2m3fn, "U8", np.uint8, 6),
    ("e2m1fn", ml_dtypes.float4_e2m1fn, "U8", np.uint8, 4),
    ("e8m0fnu", ml_dtypes.float8_e8m0fnu, "F8_E8M0", np.uint8, 8),
]


def finite_nonneg_values(dt, view, bits):
    """Every finite value >= 0 of the format, ascending (codes decoded by ml_dtypes)."""
    codes = np.arange(2 ** bits, dtype=np.uint32).astype(view)
    with np.errstate(invalid="ignore"):
        vals = codes.view(dt).astype(np.float64)
    vals = vals[np.isfinite(vals) & (vals >= 0) & ~np.signbit(vals)]
    return np.unique(vals)


def inputs_for(dt, view, bits, rng):
    vals = finite_nonneg_values(dt, view, bits)
    top = vals[-1] + (vals[-1] - vals[-2]) if len(vals) > 1 else vals[-1] * 2
    if dt is ml_dtypes.float8_e8m0fnu:
        top = vals[-1] * 2
    nxt = np.append(vals[1:], top)
    mids = vals + (nxt - vals) / 2
    pts = np.concatenate([vals, mids, [top]])
    if bits == 16:  # keep the file small: every 8th boundary of bf16/f16
        pts = np.concatenate([pts[::8], pts[-64:], pts[:64]])
    pts = np.concatenate([pts, -pts])
    with np.errstate(over="ignore"):
        f = pts.astype(np.float32)
    up = np.nextafter(f, np.float32(np.inf))
    dn = np.nextafter(f, np.float32(-np.inf))
    specials = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                         0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x00000001, 0x807FFFFF,
                         0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32).view(np.float32)
    rnd = rng.integers(0, 2 ** 32, size=4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f32 = np.concatenate([f, up, dn, specials, rnd]).astype(np.float32)
    mids64 = np.concatenate([mids, -mids])
    mids64 = mids64[np.isfinite(mids64) & (mids64 != 0)]
    if bits == 16:
        mids64 = mids64[::8]
    f64 = np.concatenate([mids64 * (1 + 2.0 ** -40), mids64 * (1 - 2.0 ** -40)])
    return f32, f64


def main(path):
    rng = np.random.Generator(np.random.PCG64(20261202))
    tensors = []  # (name, dtype string, shape, bytes)
    for name, dt, st_dtype, view, bits in FORMATS:
        f32, f64 = inputs_for(dt, view, bits, rng)
        with np.errstate(over="ignore", invalid="ignore"):
            c32 = f32.astype(dt).view(view)
            c64 = f64.astype(dt).view(view)
            dec = np.arange(2 ** bits, dtype=np.uint32).astype(view).view(dt).astype(np.float64)
        # bf16/f16 values are exact in fp32: halve the file.
        dec_dtype = "F32" if bits == 16 else "F64"
        dec = dec.astype(np.float32) if bits == 16 else dec
        tensors.append((f"{name}.f32_in", "F32", [len(f32)], f32.tobytes()))
        tensors.append((f"{name}.f32_rne", st_dtype, [len(c32)], c32.tobytes()))
        tensors.append((f"{name}.f64_in", "F64", [len(f64)], f64.tobytes()))
        tensors.append((f"{name}.f64_rne", st_dtype, [len(c64)], c64.tobytes()))
        tensors.append((f"{name}.decode", dec_dtype, [len(dec)], dec.tobytes()))
    # safetensors: u64 header length, JSON header, data; 8-aligned data order by dtype size.
    size = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2}
    tensors.sort(key=lambda t: (-size.get(t[1], 1), t[0]))
    header = {"__metadata__": {"generator": "golden/formats/gen_ml_dtypes.py",
                               "ml_dtypes": ml_dtypes.__version__,
                               "numpy": np.__version__}}
    offset = 0
    for tname, dtype, shape, data in tensors:
        header[tname] = {"dtype": dtype, "shape": shape,
                         "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(hjson)))
        out.write(hjson)
        for _, _, _, data in tensors:
            out.write(data)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "golden/formats/ml_dtypes_vectors.safetensors")
