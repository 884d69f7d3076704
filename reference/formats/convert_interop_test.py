#!/usr/bin/env python3
"""`attest convert` output read by the reference safetensors implementation (the
requirement: "attest convert output loads in PyTorch / safetensors with the right dtypes").

Writes fp32 values with safetensors.numpy, converts them with `attest convert --to X`, then
reads the result with safetensors' own parser (safe_open) and checks the header dtype string
and every code against ml_dtypes' RNE conversion of the same fp32 values.
Usage: convert_interop_test.py ATTEST_BINARY. Exit 77 (skipped) without numpy/safetensors/ml_dtypes.
"""
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import ml_dtypes
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

# format -> (safetensors dtype, ml_dtypes dtype, largest finite magnitude)
FORMATS = {
    "bf16": ("BF16", ml_dtypes.bfloat16, 3.0e38),
    "f16": ("F16", np.float16, 65504.0),
    "e4m3fn": ("F8_E4M3", ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": ("F8_E5M2", ml_dtypes.float8_e5m2, 57344.0),
    "e8m0fnu": ("F8_E8M0", ml_dtypes.float8_e8m0fnu, 1.7e38),
}


def header(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def main():
    attest = sys.argv[1]
    rng = np.random.default_rng(20261202)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (st_dtype, ml_dtype, vmax) in FORMATS.items():
            # In-range values over many binades (both signs; e8m0 positive only), subnormals
            # of the target included, plus exact zeros where the format has them.
            mag = np.exp2(rng.uniform(-30, np.log2(vmax) - 0.01, 4096)).astype(np.float32)
            sign = np.ones(4096, np.float32) if name == "e8m0fnu" else rng.choice([-1.0, 1.0], 4096)
            x = (mag * sign).astype(np.float32)
            if name != "e8m0fnu":
                x[:4] = [0.0, -0.0, 1.0, -1.0]
            src = Path(tmp) / f"in_{name}.safetensors"
            out = Path(tmp) / f"out_{name}.safetensors"
            save_file({"x": x.reshape(64, 64)}, str(src))
            subprocess.run([attest, "convert", "--to", name, "--quiet", "--in", str(src),
                            "--out", str(out)], check=True)
            hdr, _ = header(out)
            if hdr["x"]["dtype"] != st_dtype:
                print(f"{name}: header dtype {hdr['x']['dtype']}, expected {st_dtype}")
                failures += 1
                continue
            # The reference implementation's own parser must accept the file.
            with safe_open(str(out), framework="numpy") as f:
                keys = list(f.keys())
                if keys != ["x"]:
                    print(f"{name}: safe_open keys {keys}")
                    failures += 1
                try:
                    got = f.get_tensor("x")  # numpy lacks bf16/fp8: may raise, then read raw
                    got_bits = got.view(np.uint16 if got.itemsize == 2 else np.uint8).ravel()
                except Exception:
                    _, data = header(out)
                    begin, end = hdr["x"]["data_offsets"]
                    width = np.uint16 if st_dtype in ("BF16", "F16") else np.uint8
                    got_bits = np.frombuffer(data[begin:end], dtype=width)
            want = x.astype(ml_dtype)
            want_bits = want.view(np.uint16 if want.itemsize == 2 else np.uint8).ravel()
            bad = np.nonzero(got_bits != want_bits)[0]
            if bad.size:
                i = int(bad[0])
                print(f"{name}: {bad.size} codes differ from ml_dtypes, first x={x[i]!r}: "
                      f"attest {got_bits[i]:#x} ml_dtypes {want_bits[i]:#x}")
                failures += 1
            else:
                print(f"{name}: {st_dtype}, {x.size} codes equal to ml_dtypes")
    print(f"{len(FORMATS) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
