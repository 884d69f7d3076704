"""The worker side of attest's exec protocol, for Python kernels (docs/design.md "External
kernels"; docs/protocol.md): JSON lines on stdin/stdout, tensors in safetensors files.

A worker calls `serve(describe, forward, backward)`. Handlers receive the request's problem
(the case-file "problem" object) and the input tensors as NumPy arrays, and return the output
tensors; raising `Unsupported(reason)` answers "unsupported", any other exception answers
"error" with its message (the traceback goes to stderr, which attest quotes).

Only the standard library and NumPy are needed: safetensors files are read and written here
(huggingface/safetensors README "Format": u64 little-endian header length, JSON header,
row-major little-endian data), bf16 and fp8 are handled as raw codes and widened exactly.
"""

import json
import os
import struct
import sys
import traceback

import numpy as np


class Unsupported(Exception):
    """An honest refusal: the worker does not implement this feature or shape."""


# safetensors dtype -> NumPy storage type of its codes.
_STORAGE = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8, "U8": np.uint8,
    "I32": np.int32, "I64": np.int64,
}
# attest dtype names (problem.dtype) -> safetensors names.
ST_NAME = {"f64": "F64", "f32": "F32", "f16": "F16", "bf16": "BF16",
           "e4m3fn": "F8_E4M3", "e5m2": "F8_E5M2"}


class Tensor:
    """A tensor as stored: codes in `data` (NumPy) and the safetensors dtype name. An input
    sent as a view (docs/protocol.md "Views") also keeps the flat `storage` it spans and its
    `view` ({"shape", "strides", "offset"} in elements): `data` is then that NumPy view, and an
    adapter that moves tensors to a device rebuilds the view there (torch_worker.py)."""

    def __init__(self, data, dtype, storage=None, view=None):
        self.data = data
        self.dtype = dtype
        self.storage = storage
        self.view = view

    @property
    def shape(self):
        return self.data.shape


def _fp8_table(exp_bits, man_bits, bias, e4m3fn):
    """Values of all 256 codes of an OCP FP8 format (OFP8 spec v1.0 tables)."""
    table = np.zeros(256, dtype=np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if e4m3fn and e == 15 and m == 7:
            table[code] = np.nan
        elif not e4m3fn and e == 31:
            table[code] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            table[code] = sign * m * 2.0 ** (1 - bias - man_bits)
        else:
            table[code] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return table


_E4M3 = _fp8_table(4, 3, 7, True)
_E5M2 = _fp8_table(5, 2, 15, False)


def to_float(t, dtype=np.float32):
    """The tensor's values widened exactly to `dtype` (float32 or float64)."""
    if t.dtype == "BF16":
        return (t.data.astype(np.uint32) << 16).view(np.float32).astype(dtype)
    if t.dtype == "F8_E4M3":
        return _E4M3[t.data].astype(dtype)
    if t.dtype == "F8_E5M2":
        return _E5M2[t.data].astype(dtype)
    return t.data.astype(dtype)


def bf16_codes(x):
    """float32 -> bf16 codes, round to nearest even; NaN stays a quiet NaN with its sign."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def read_safetensors(path):
    """{name: Tensor} from a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry["dtype"]
        if dtype not in _STORAGE:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        begin, end = entry["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=np.dtype(_STORAGE[dtype]).newbyteorder("<"))
        out[name] = Tensor(arr.reshape(entry["shape"]).copy(), dtype)
    return out


def apply_views(inputs, views):
    """Replaces each input named in a request's "views" (docs/protocol.md "Views") by the view
    it describes of the flat storage the file holds under that name; attest has checked that
    the view stays inside it."""
    for name, spec in (views or {}).items():
        flat = inputs[name].data.reshape(-1)
        offset = int(spec.get("offset", 0))
        item = flat.dtype.itemsize
        data = np.lib.stride_tricks.as_strided(
            flat[offset:], shape=tuple(spec["shape"]),
            strides=tuple(s * item for s in spec["strides"]), writeable=False)
        inputs[name] = Tensor(data, inputs[name].dtype, storage=flat, view=spec)
    return inputs


def read_inputs(request):
    """The inputs of a forward or backward request, views applied."""
    return apply_views(read_safetensors(request["inputs"]), request.get("views"))


def write_safetensors(path, tensors):
    """Writes {name: Tensor} (or float32/float64 NumPy arrays, stored as F32/F64)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            arr = np.asarray(t)
            t = Tensor(arr, {np.dtype(np.float64): "F64", np.dtype(np.float16): "F16"}.get(
                arr.dtype, "F32"))
        arr = np.ascontiguousarray(t.data, dtype=np.dtype(_STORAGE[t.dtype]).newbyteorder("<"))
        blob = arr.tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)  # the reader never sees a half-written file


# ---- Problem helpers (docs/design.md "Semantics"; reference/problem/mask.h) ----

def sequences(problem):
    """[(q_begin, q_len, k_begin, k_len)] per sequence, in the flattened token axis."""
    b, sq, sk = problem["batch"], problem["seqlen_q"], problem["seqlen_k"]
    cq, ck = problem.get("cu_seqlens_q"), problem.get("cu_seqlens_k")
    if cq is not None:
        return [(cq[i], cq[i + 1] - cq[i], ck[i], ck[i + 1] - ck[i]) for i in range(b)]
    return [(i * sq, sq, i * sk, sk) for i in range(b)]


def visible(problem, b, q_len, k_len):
    """Boolean [q_len, k_len]: may query i of sequence b see key j (mask.h MaskView)."""
    off = k_len - q_len if problem.get("causal_align", "bottom_right") == "bottom_right" else 0
    left, right = problem.get("window", [-1, -1])
    if problem.get("causal"):
        right = 0 if right < 0 else min(right, 0)
    i = np.arange(q_len)[:, None]
    j = np.arange(k_len)[None, :]
    diag = i + off
    band = np.ones((q_len, k_len), dtype=bool)
    if left >= 0:
        band &= j >= diag - left
    if right >= 0:
        band &= j <= diag + right
    prefix = problem.get("prefix_lm", 0) or 0
    vis = band | (j < prefix)
    if problem.get("document_ids_q") is not None:
        dq = np.asarray(problem["document_ids_q"][b])[:, None]
        dk = np.asarray(problem["document_ids_k"][b])[None, :]
        vis &= dq == dk
    sparse = problem.get("block_sparse")
    if sparse is not None:
        allowed = np.zeros(((q_len + sparse["block_q"] - 1) // sparse["block_q"] + 1,
                            (k_len + sparse["block_k"] - 1) // sparse["block_k"] + 1), dtype=bool)
        for qb, kb in sparse["blocks"]:
            if qb < allowed.shape[0] and kb < allowed.shape[1]:
                allowed[qb, kb] = True
        vis &= allowed[i // sparse["block_q"], j // sparse["block_k"]]
    return vis, off


def scale_of(problem):
    s = problem.get("scale")
    return float(s) if s is not None else float(1.0 / np.sqrt(float(problem["head_dim"])))


# ---- The protocol loop ----

def serve(describe, forward, backward=None, route=None, fatal=None):
    """Answers requests until EOF on stdin. `describe()` returns (name, capabilities);
    `forward(problem, inputs)` returns {"o": ..., "lse": ...}; `backward(problem, inputs)`
    returns {"dq": ..., "dk": ..., "dv": ...}; inputs are {name: Tensor}. `route()`, if
    given, returns a note about the last call (which code path ran), sent as the optional
    "route" field of an "ok" reply (attest shows it as the kernel's last_route). `fatal(e)`,
    if given, says that an exception left the process unusable (a CUDA error is sticky: every
    later call of the process fails the same way); the worker then exits after its error
    reply, so that attest starts a fresh one for the next request."""
    # The protocol owns the real stdout; anything else printing (a library's banner, a stray
    # print) goes to stderr instead of corrupting the reply stream.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "describe":
                name, caps = describe()
                reply = {"status": "ok", "name": name, "capabilities": caps}
            elif op in ("forward", "backward"):
                handler = forward if op == "forward" else backward
                if handler is None:
                    raise Unsupported(f"{op} is not implemented")
                outputs = handler(request["problem"], read_inputs(request))
                write_safetensors(request["outputs"], outputs)
                reply = {"status": "ok"}
                note = route() if route is not None else ""
                if note:
                    reply["route"] = note
            else:
                reply = {"status": "error", "message": f"unknown op {op!r}"}
        except Unsupported as e:
            reply = {"status": "unsupported", "reason": str(e)}
        except Exception as e:  # noqa: BLE001 - every failure is reported
            traceback.print_exc(file=sys.stderr)
            reply = {"status": "error", "message": f"{type(e).__name__}: {e}"}
            if fatal is not None and fatal(e):
                # "exiting": attest reaps this process and sends the next request to a fresh
                # one, instead of writing it to a process that is about to exit.
                reply["exiting"] = True
                proto.write(json.dumps(reply) + "\n")
                proto.flush()
                print("worker: exiting after an error that leaves this process unusable",
                      file=sys.stderr)
                os._exit(70)
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
