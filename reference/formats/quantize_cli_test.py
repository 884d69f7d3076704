#!/usr/bin/env python3
"""End-to-end test of `attest quantize` (tools/attest/cmd_quantize.cc) against an independent
NumPy + ml_dtypes implementation of the formulas in docs/formats.md "Block quantizers"
(OCP MX v1.0 §6.3 FLOOR, torchao CEIL/EVEN, TransformerEngine RCEIL, NVFP4 TE, FP8 current
scaling): codes, scales, tensor scales and dequantised values must match bit for bit.

Usage: quantize_cli_test.py ATTEST_BINARY. Exits 77 (ctest SKIP_RETURN_CODE) when numpy,
safetensors or ml_dtypes is missing.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file
except ImportError as e:  # pragma: no cover
    print(f"skipping: {e}")
    sys.exit(77)

F32 = np.float32
ELEMENTS = {  # scheme -> (ml_dtypes type, max, emax, mantissa bits)
    "mxfp8-e4m3": (ml_dtypes.float8_e4m3fn, 448.0, 8, 3),
    "mxfp8-e5m2": (ml_dtypes.float8_e5m2, 57344.0, 15, 2),
    "mxfp6-e3m2": (ml_dtypes.float6_e3m2fn, 28.0, 4, 2),
    "mxfp6-e2m3": (ml_dtypes.float6_e2m3fn, 7.5, 2, 3),
    "mxfp4": (ml_dtypes.float4_e2m1fn, 6.0, 2, 1),
}


RAW = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I32": np.int32,
       "U8": np.uint8, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8}


def load_file(path):
    """safetensors reader by the format's README (safetensors.numpy cannot load F8_E8M0);
    fp8 tensors come back as their uint8 codes."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        raw = data[8 + n + begin:8 + n + end]
        out[name] = np.frombuffer(raw, RAW[e["dtype"]]).reshape(e["shape"])
    return out


def encode(v, dtype, vmax):
    """RNE with saturation: clip first (equivalent, since RNE is monotone), then ml_dtypes."""
    return np.clip(v, -vmax, vmax).astype(dtype)


def decode(codes, dtype):
    return codes.view(dtype).astype(np.float64)


def mx_scale(amax, mode, vmax, emax, mbits):
    bits = amax.view(np.uint32).astype(np.int64)
    if mode == "rceil":
        d = (amax * F32(1.0 / vmax)).astype(F32)
        b = d.view(np.uint32).astype(np.int64)
        e, m = b >> 23, b & 0x7FFFFF
        up = (m > 0) & (e != 0xFE) & ~((e == 0) & (m <= 0x400000))
        out = np.where(d == 0, 0, e + up)
        return np.where(np.isnan(d), 255, np.where(np.isinf(d), 254, out)).astype(np.uint8)
    finite = np.isfinite(amax)
    if mode == "even":
        bits = (bits + (1 << (22 - mbits))) & 0xFF800000
        finite &= (bits >> 23) != 0xFF
    exp = (bits >> 23) - 127
    if mode == "ceil":
        exp = exp + ((bits & 0x7FFFFF) != 0)
    shared = np.clip(exp - emax, -127, 128) + 127
    return np.where(finite, shared, 255).astype(np.uint8)


def blocks(x, size):
    """x [rows, n] -> [rows, ceil(n/size), size] zero-padded (padding never changes amax)."""
    rows, n = x.shape
    nb = -(-n // size)
    p = np.zeros((rows, nb * size), x.dtype)
    p[:, :n] = x
    return p.reshape(rows, nb, size), n


def expect_mx(x, scheme, mode):
    dtype, vmax, emax, mbits = ELEMENTS[scheme]
    xb, n = blocks(x, 32)
    amax = np.abs(xb).max(axis=-1).astype(F32)
    scale = mx_scale(amax, mode, vmax, emax, mbits)
    factor = np.ldexp(F32(1), 127 - scale.astype(np.int32)).astype(F32)
    q = encode((xb * factor[..., None]).astype(F32), dtype, vmax)
    deq = decode(q.view(np.uint8), dtype) * np.ldexp(1.0, scale.astype(np.int32) - 127)[..., None]
    cut = lambda a: a.reshape(a.shape[0], -1)[:, :n]
    return cut(q.view(np.uint8)), scale, cut(deq)


def expect_nvfp4_te(x):
    xb, n = blocks(x, 16)
    t_amax = np.abs(x).max().astype(F32)
    s_enc = F32(F32(448.0 * 6.0) / t_amax)
    s_enc = F32(1.0) if (t_amax == 0 or s_enc == 0) else min(s_enc, np.finfo(F32).max)
    s_dec = F32(F32(1.0) / s_enc)
    amax = np.abs(xb).max(axis=-1).astype(F32)
    s8 = encode((amax * F32(s_enc * F32(F32(1.0) / F32(6.0)))).astype(F32),
                ml_dtypes.float8_e4m3fn, 448.0)
    s8f = s8.astype(F32)
    with np.errstate(divide="ignore"):  # s8 = 0 gives Inf, clamped like fminf
        enc = np.minimum(F32(1.0) / (s8f * s_dec), np.finfo(F32).max).astype(F32)
    q = encode((xb * enc[..., None]).astype(F32), ml_dtypes.float4_e2m1fn, 6.0)
    deq = decode(q.view(np.uint8), ml_dtypes.float4_e2m1fn) * s8f.astype(np.float64)[..., None] \
        * np.float64(s_dec)
    cut = lambda a: a.reshape(a.shape[0], -1)[:, :n]
    return cut(q.view(np.uint8)), s8.view(np.uint8), s_dec, cut(deq)


def expect_fp8_tensor(x):
    amax = np.abs(x).max().astype(F32)
    scale = F32(F32(448.0) / amax)
    q = encode((x * scale).astype(F32), ml_dtypes.float8_e4m3fn, 448.0)
    descale = F32(F32(1.0) / scale)
    return q.view(np.uint8), descale, decode(q.view(np.uint8), ml_dtypes.float8_e4m3fn) * \
        np.float64(descale)


def run(attest, args, inp, out):
    r = subprocess.run([attest, "quantize", "--quiet", *args, "--in", inp, "--out", out],
                       capture_output=True, text=True)
    return r.returncode, r.stderr


def main():
    attest = sys.argv[1]
    rng = np.random.default_rng(2026)
    # Rows spanning many binades, exact ties, zeros and a partial last block (n = 72).
    x = (rng.standard_normal((6, 72)) * np.ldexp(1.0, rng.integers(-20, 20, (6, 1)))).astype(F32)
    x[0, :32] = 0.0
    x[1, :4] = [500.0, 448.0, 7.0, 0.75]
    x[2, :32] = np.float32(2.0 ** -140)  # fp32 subnormal amax
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({"x": x, "xt": np.ascontiguousarray(x.T)}, inp)

        def check(what, got, want):
            nonlocal failures
            if got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
                failures += 1
                bad = np.argwhere(~((got == want) | (np.isnan(got) & np.isnan(want))))[:3] \
                    if got.shape == want.shape else "shape"
                print(f"FAIL {what}: shapes {got.shape} vs {want.shape}, first mismatches {bad}")

        for scheme in ELEMENTS:
            for mode in ("floor", "ceil", "rceil", "even"):
                rc, err = run(attest, ["--scheme", scheme, "--scale-mode", mode], inp, out)
                assert rc == 0, err
                got = load_file(out)
                codes, scale, deq = expect_mx(x, scheme, mode)
                check(f"{scheme} {mode} codes", got["x"].view(np.uint8), codes)
                check(f"{scheme} {mode} scale", got["x.scale"].view(np.uint8), scale)
                check(f"{scheme} {mode} dequant", got["x.dequant"], deq)
                # Blocking xt along axis 0 is the transpose of blocking x along axis 1.
                rc, err = run(attest, ["--scheme", scheme, "--scale-mode", mode, "--axis", "0"],
                              inp, out)
                assert rc == 0, err
                got = load_file(out)
                check(f"{scheme} {mode} axis 0", got["xt.dequant"], deq.T)
        rc, err = run(attest, ["--scheme", "nvfp4"], inp, out)
        assert rc == 0, err
        got = load_file(out)
        codes, s8, s_dec, deq = expect_nvfp4_te(x)
        check("nvfp4 codes", got["x"], codes)
        check("nvfp4 scale", got["x.scale"].view(np.uint8), s8)
        check("nvfp4 tensor_scale", got["x.tensor_scale"], np.array([s_dec], F32))
        check("nvfp4 dequant", got["x.dequant"], deq)
        rc, err = run(attest, ["--scheme", "fp8-tensor-e4m3"], inp, out)
        assert rc == 0, err
        got = load_file(out)
        codes, descale, deq = expect_fp8_tensor(x)
        check("fp8-tensor codes", got["x"].view(np.uint8), codes)
        check("fp8-tensor scale", got["x.scale"], np.array([[descale]], F32))
        check("fp8-tensor dequant", got["x.dequant"], deq)
        # Bad input exits 2.
        for bad in (["--scheme", "mxfp9"], ["--scheme", "mxfp4", "--axis", "7"]):
            rc, _ = run(attest, bad, inp, out)
            if rc != 2:
                failures += 1
                print(f"FAIL {bad}: exit {rc}, expected 2")
        rc, _ = run(attest, ["--scheme", "mxfp4"], os.path.join(tmp, "missing"), out)
        if rc != 2:
            failures += 1
            print(f"FAIL missing input: exit {rc}, expected 2")
    print("quantize CLI:", "OK" if failures == 0 else f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
