#!/usr/bin/env python3
"""Interop of attest's safetensors reader/writer (reference/io/safetensors.h) with the
reference implementation (huggingface/safetensors, pip package `safetensors`, whose parser is
the Rust crate's safetensors/src/tensor.rs):

  (a) files our writer makes load in safetensors.numpy.load_file with the right dtypes,
      shapes and values; BF16/F8 tensors parse in the reference with the right dtype strings
      and bytes (ml_dtypes gives them numpy dtypes where installed);
  (b) files safetensors.numpy.save_file makes are read by our reader, bit for bit;
  (c) for the same tensors and a one-key metadata, our bytes equal the reference writer's;
  (d) the reference rejects every file of our malformed corpus except the ones where we are
      deliberately stricter (listed below), and accepts every file of our valid corpus with
      the same contents as our reader.

usage: safetensors_interop_test.py PATH/TO/safetensors_interop_helper
Exit 77 (ctest SKIP_RETURN_CODE) when numpy or safetensors cannot be imported.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    import safetensors
    import safetensors.numpy as stnp
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"SKIP: {e} (pip install numpy safetensors ml_dtypes, or run tools/bootstrap)")
    sys.exit(SKIP)
try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER = sys.argv[1]

# Malformed files the reference accepts and we refuse, with the reason we refuse them.
STRICTER_THAN_REFERENCE = {
    "extra_field.safetensors": "an unknown field may change what the data means",
    "metadata_null.safetensors": "__metadata__ must be an object of strings",
    "duplicate_metadata_key.safetensors": "a JSON map keeping one of two values is ambiguous",
    "unsupported_dtype.safetensors": "attest holds no I16 tensors",
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def helper(*args):
    return subprocess.run([HELPER, *args], capture_output=True, text=True)


def expected_numpy():
    e = lambda n: np.arange(n)
    return {
        "f64": (e(6) * 0.5 - 1.0).reshape(2, 3),
        "f32": (e(4).astype(np.float32) * np.float32(0.25) - np.float32(3.0)),
        "f16": (0x3C00 + e(5)).astype(np.uint16).view(np.float16),
        "i32": (1 - 7 * e(4)).astype(np.int32).reshape(2, 2),
        "i64": (e(3) * (1 << 40) - 5).astype(np.int64),
        "u8": (e(6) * 3).astype(np.uint8).reshape(2, 1, 3),
        "empty": np.zeros((0, 4), np.float32),
        "scalar": np.array(2.5),
        "f64_transposed": np.array([[0.0, 10.0, 20.0], [1.0, 11.0, 21.0]]),
    }


# safetensors dtype -> (shape, raw little-endian bytes) of the low-precision tensors.
def expected_low_precision():
    return {
        "bf16": ("BF16", [2, 2], (0x3F80 + np.arange(4)).astype("<u2").tobytes()),
        "e4m3": ("F8_E4M3", [3], (0x38 + np.arange(3)).astype(np.uint8).tobytes()),
        "e5m2": ("F8_E5M2", [3], (0x3C + np.arange(3)).astype(np.uint8).tobytes()),
        "e8m0": ("F8_E8M0", [3], (127 + np.arange(3)).astype(np.uint8).tobytes()),
    }


ML_DTYPE = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
            "F8_E8M0": "float8_e8m0fnu"}
NP_DTYPE = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I32": np.int32,
            "I64": np.int64, "U8": np.uint8}


def array_of(dtype, shape, data):
    """A numpy array from a reference `deserialize` view (ml_dtypes for BF16/F8)."""
    if dtype in NP_DTYPE:
        np_dtype = NP_DTYPE[dtype]
    else:
        np_dtype = getattr(ml_dtypes, ML_DTYPE[dtype])
    return np.frombuffer(bytes(data), dtype=np_dtype).reshape(shape)


def dump(path):
    r = helper("dump", path)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return json.loads(r.stdout), ""


def test_a_numpy_reads_ours(tmp):
    path = os.path.join(tmp, "ours_numpy.safetensors")
    r = helper("write-numpy", path)
    check(r.returncode == 0, f"helper write-numpy: {r.stderr}")
    loaded = stnp.load_file(path)
    for name, want in expected_numpy().items():
        got = loaded.get(name)
        check(got is not None, f"(a) {name} missing")
        if got is None:
            continue
        check(got.dtype == want.dtype, f"(a) {name}: dtype {got.dtype} != {want.dtype}")
        check(got.shape == want.shape, f"(a) {name}: shape {got.shape} != {want.shape}")
        check(got.tobytes() == want.tobytes(), f"(a) {name}: values {got} != {want}")
    check(set(loaded) == set(expected_numpy()), f"(a) names {sorted(loaded)}")

    path = os.path.join(tmp, "ours_all.safetensors")
    r = helper("write-all", path)
    check(r.returncode == 0, f"helper write-all: {r.stderr}")
    with open(path, "rb") as f:
        views = dict(safetensors.deserialize(f.read()))
    for name, (dtype, shape, raw) in expected_low_precision().items():
        v = views.get(name)
        check(v is not None, f"(a) {name} missing")
        if v is None:
            continue
        check(v["dtype"] == dtype, f"(a) {name}: dtype {v['dtype']} != {dtype}")
        check(list(v["shape"]) == shape, f"(a) {name}: shape {v['shape']} != {shape}")
        check(bytes(v["data"]) == raw, f"(a) {name}: bytes differ")
        if ml_dtypes is not None:
            a = array_of(dtype, shape, v["data"])
            check(a.dtype.name == ML_DTYPE[dtype], f"(a) {name}: ml_dtypes {a.dtype}")
    with safetensors.safe_open(path, framework="np") as f:
        check(f.metadata() == {"writer": "attest"}, f"(a) metadata {f.metadata()}")
    return path


def reference_tensors():
    """Arrays for the reference writer: every dtype ml_dtypes makes available."""
    rng = np.random.default_rng(20261202)
    t = {
        "x_f64": rng.standard_normal((3, 2)),
        "x_f32": rng.standard_normal((2, 2, 2)).astype(np.float32),
        "x_f16": rng.standard_normal((5,)).astype(np.float16),
        "x_i32": rng.integers(-2**31, 2**31, (4,), dtype=np.int32),
        "x_i64": rng.integers(-2**63, 2**63 - 1, (2, 1), dtype=np.int64),
        "x_u8": rng.integers(0, 256, (7,), dtype=np.uint8),
        "x_empty": np.zeros((2, 0), np.float64),
        # A non-contiguous array: the reference writer stores it row-major.
        "x_strided": np.arange(12.0).reshape(3, 4)[:, ::2],
    }
    if ml_dtypes is not None:
        codes = rng.integers(0, 256, (6,), dtype=np.uint8)
        t["x_bf16"] = rng.integers(0, 2**16, (2, 3), dtype=np.uint16).view(ml_dtypes.bfloat16)
        t["x_e4m3"] = codes.view(ml_dtypes.float8_e4m3fn)
        t["x_e5m2"] = codes.view(ml_dtypes.float8_e5m2)
        t["x_e8m0"] = codes.view(ml_dtypes.float8_e8m0fnu)
    return t


def test_b_we_read_theirs(tmp):
    path = os.path.join(tmp, "theirs.safetensors")
    tensors = reference_tensors()
    meta = {"format": "np", "note": "é \" \\ \n"}
    stnp.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path,
                   metadata=meta)
    got, err = dump(path)
    check(got is not None, f"(b) our reader rejects the reference's file: {err}")
    if got is None:
        return
    check(got["metadata"] == meta, f"(b) metadata {got['metadata']}")
    by_name = {t["name"]: t for t in got["tensors"]}
    check(set(by_name) == set(tensors), f"(b) names {sorted(by_name)}")
    for name, want in tensors.items():
        t = by_name.get(name)
        if t is None:
            continue
        check(list(t["shape"]) == list(want.shape), f"(b) {name}: shape {t['shape']}")
        check(bytes.fromhex(t["hex"]) == np.ascontiguousarray(want).tobytes(),
              f"(b) {name}: bytes differ")


def test_c_same_bytes_as_reference_writer(ours_all):
    with open(ours_all, "rb") as f:
        ours = f.read()
    if ml_dtypes is None:
        print("(c) skipped: ml_dtypes is not installed (needed for BF16/F8 arrays)")
        return
    views = safetensors.deserialize(ours)
    arrays = {name: array_of(v["dtype"], v["shape"], v["data"]) for name, v in views}
    theirs = stnp.save(arrays, metadata={"writer": "attest"})
    check(theirs == ours, "(c) reference writer's bytes differ from ours:\n"
          f"  ours   {ours[:200]!r}\n  theirs {theirs[:200]!r}")


def test_d_corpus_agrees_with_reference():
    for path in sorted(glob.glob(os.path.join(HERE, "testdata/malformed/*.safetensors"))):
        name = os.path.basename(path)
        with open(path, "rb") as f:
            data = f.read()
        try:
            safetensors.deserialize(data)
            accepted = True
        except Exception:  # the binding raises SafetensorError; any exception is a refusal
            accepted = False
        if name in STRICTER_THAN_REFERENCE:
            check(accepted, f"(d) {name}: listed as stricter, but the reference rejects it "
                  "too (remove it from STRICTER_THAN_REFERENCE)")
        else:
            check(not accepted, f"(d) {name}: the reference accepts it but we reject it")
        got, _ = dump(path)
        check(got is None, f"(d) {name}: our reader accepts it")
    for path in sorted(glob.glob(os.path.join(HERE, "testdata/valid/*.safetensors"))):
        name = os.path.basename(path)
        with open(path, "rb") as f:
            data = f.read()
        try:
            views = {n: v for n, v in safetensors.deserialize(data)}
        except Exception as e:
            check(False, f"(d) valid/{name}: the reference rejects it: {e}")
            continue
        got, err = dump(path)
        check(got is not None, f"(d) valid/{name}: our reader rejects it: {err}")
        if got is None:
            continue
        ours = {t["name"]: t for t in got["tensors"]}
        check(set(ours) == set(views), f"(d) valid/{name}: names differ")
        for n, v in views.items():
            t = ours.get(n)
            if t is None:
                continue
            check(t["dtype"] == v["dtype"] and list(t["shape"]) == list(v["shape"]) and
                  bytes.fromhex(t["hex"]) == bytes(v["data"]), f"(d) valid/{name}: {n!r} differs")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        ours_all = test_a_numpy_reads_ours(tmp)
        test_b_we_read_theirs(tmp)
        test_c_same_bytes_as_reference_writer(ours_all)
    test_d_corpus_agrees_with_reference()
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}, ml_dtypes "
          f"{getattr(ml_dtypes, '__version__', 'absent')}: "
          f"{'FAILED ' + str(len(failures)) if failures else 'all interop checks hold'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
