#!/usr/bin/env python3
"""Checks tools/workers/torch_worker.py against numpy_worker.py through the exec protocol
itself (both run as workers, fed the same safetensors inputs): forward o and lse and the
backward gradients agree to bf16 rounding on problems covering each backend's claims, and
refusals outside the claims are honest ("unsupported"). Exit 77 (skipped) without torch.
Usage: torch_worker_test.py [--backends sdpa-math,sdpa-flash,sdpa-flash+lse,flex] [--device cpu]
(on CPU, sdpa-flash is the public F.scaled_dot_product_attention on PyTorch's CPU flash
kernel, with the claim it measures at start and no lse; sdpa-flash+lse the same kernel through
its private op, with lse; flex runs eager, forward only)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import attest_worker as aw  # noqa: E402
import torch_backends as tb  # noqa: E402

try:
    import torch  # noqa: F401
except ImportError:
    print("skip: torch is not importable")
    sys.exit(77)


class Client:
    def __init__(self, argv):
        self.p = subprocess.Popen([sys.executable] + argv, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def call(self, request):
        self.p.stdin.write(json.dumps(request) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def problem(**kw):
    p = {"batch": 2, "heads_q": 4, "heads_kv": 2, "seqlen_q": 24, "seqlen_k": 40,
         "head_dim": 32, "head_dim_v": 32, "dtype": "bf16", "scale": None, "causal": False,
         "causal_align": "bottom_right", "window": [-1, -1], "softcap": 0.0,
         "alibi_slopes": None, "cu_seqlens_q": None, "cu_seqlens_k": None}
    p.update(kw)
    return p


def shapes(p):
    if p["cu_seqlens_q"] is not None:
        tq, tk = p["cu_seqlens_q"][-1], p["cu_seqlens_k"][-1]
        return ((tq, p["heads_q"], p["head_dim"]), (tk, p["heads_kv"], p["head_dim"]),
                (tk, p["heads_kv"], p["head_dim_v"]), (tq, p["heads_q"], p["head_dim_v"]))
    b, sq, sk = p["batch"], p["seqlen_q"], p["seqlen_k"]
    return ((b, sq, p["heads_q"], p["head_dim"]), (b, sk, p["heads_kv"], p["head_dim"]),
            (b, sk, p["heads_kv"], p["head_dim_v"]), (b, sq, p["heads_q"], p["head_dim_v"]))


CASES = {
    "plain gqa Sq<Sk": problem(),
    "causal bottom-right Sq<Sk": problem(causal=True),
    "causal bottom-right Sq>Sk (empty rows)": problem(causal=True, seqlen_q=40, seqlen_k=24),
    "causal top-left": problem(causal=True, causal_align="top_left"),
    "window + alibi": problem(window=[6, 2], alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),
    "softcap causal": problem(causal=True, softcap=5.0),
    "Dv != D causal": problem(causal=True, head_dim_v=16),
    "varlen causal": problem(batch=3, causal=True, seqlen_q=16, seqlen_k=20,
                             cu_seqlens_q=[0, 7, 7, 23], cu_seqlens_k=[0, 9, 15, 35]),
    "documents": problem(batch=1, seqlen_q=32, seqlen_k=32,
                         document_ids_q=[[0] * 12 + [1] * 20], document_ids_k=[[0] * 12 + [1] * 20]),
    # SDPA's fused backends refuse a zero-length side ("No available kernel"): the public routes
    # measure that and declare shapes.min_seqlen_q, so the refusal must be honest. Run only
    # against a claim with shape limits: PyTorch 2.11's private CPU flash op (sdpa-flash+lse on
    # CPU) dies of SIGFPE on it (golden/findings/sdpa-cpu-flash-lse-sq0-sigfpe.case.json).
    "Sq = 0": problem(seqlen_q=0),
}
NEEDS_SHAPE_LIMITS = ("Sq = 0",)

# The public SDPA routes: the function returns o alone, so the claim must say "lse": false.
PUBLIC = ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")


def run(backend, device, tmp):
    ref = Client([os.path.join(HERE, "numpy_worker.py")])
    dut = Client([os.path.join(HERE, "torch_worker.py"), "--backend", backend, "--device", device])
    caps = dut.call({"op": "describe"})["capabilities"]
    ref.call({"op": "describe"})
    rng = np.random.default_rng(1)
    failures = 0
    if backend in PUBLIC and caps.get("lse", True):
        print(f"{backend:10s} FAIL: the public function returns no lse, yet the claim has one")
        failures += 1
    for name, p in CASES.items():
        if name in NEEDS_SHAPE_LIMITS and not caps.get("shapes"):
            fused = backend in PUBLIC and backend != "sdpa-math"
            print(f"{backend:10s} {name:40s} " + ("FAIL: a fused SDPA backend refuses it, and "
                  "the measured claim declares no shape limit" if fused else
                  "not run: the claim declares no shape limits"))
            failures += fused
            continue
        qs, ks, vs, os_ = shapes(p)
        inputs = {n: aw.Tensor(aw.bf16_codes(rng.standard_normal(s).astype(np.float32)), "BF16")
                  for n, s in (("q", qs), ("k", ks), ("v", vs))}
        fin = os.path.join(tmp, "in.safetensors")
        aw.write_safetensors(fin, inputs)
        replies = {}
        for who, c in (("ref", ref), ("dut", dut)):
            out = os.path.join(tmp, f"{who}.safetensors")
            r = c.call({"op": "forward", "problem": p, "inputs": fin, "outputs": out})
            replies[who] = (r, out)
        r, out = replies["dut"]
        claimed = tb.covers(caps, p) is None
        if r["status"] == "unsupported":
            verdict = "FAIL (claimed but refused)" if claimed else "ok (honest refusal)"
            failures += claimed
            print(f"{backend:10s} {name:40s} {verdict}: {r['reason']}")
            continue
        if r["status"] != "ok":
            print(f"{backend:10s} {name:40s} FAIL: {r}")
            failures += 1
            continue
        a = aw.read_safetensors(replies["dut"][1])
        b = aw.read_safetensors(replies["ref"][1])
        o_err = np.abs(aw.to_float(a["o"], np.float64) -
                       aw.to_float(b["o"], np.float64)).max(initial=0.0)
        lb = aw.to_float(b["lse"], np.float64)
        fin_ = np.isfinite(lb)
        if caps.get("lse", True):
            la = aw.to_float(a["lse"], np.float64)
            # Empty rows hold what the kernel writes there (-inf, a declared +inf, or a
            # finding for attest's special-values check); compared are the other rows.
            lse_ok = bool(np.isfinite(la[fin_]).all())
            lse_err = np.abs(la[fin_] - lb[fin_]).max() if fin_.any() else 0.0
        else:
            lse_ok, lse_err = "lse" not in a, 0.0  # "lse": false: the kernel returns none
        # Backward with the same dO, each from its own forward.
        do = aw.Tensor(aw.bf16_codes(rng.standard_normal(os_).astype(np.float32)), "BF16")
        grads = {}
        for who, c in (("ref", ref), ("dut", dut)):
            f = aw.read_safetensors(replies[who][1])
            bin_ = os.path.join(tmp, f"b{who}.safetensors")
            aw.write_safetensors(bin_, dict(inputs, do=do, **{n: f[n] for n in ("o", "lse")
                                                              if n in f}))
            out = os.path.join(tmp, f"g{who}.safetensors")
            rb = c.call({"op": "backward", "problem": p, "inputs": bin_, "outputs": out})
            grads[who] = aw.read_safetensors(out) if rb["status"] == "ok" else rb
        if "status" in grads["dut"] and grads["dut"]["status"] == "unsupported" and \
                not caps.get("backward"):
            grads = None  # an honest refusal: this backend claims no backward here
        elif "status" in grads["dut"] or "status" in grads["ref"]:
            print(f"{backend:10s} {name:40s} FAIL backward: {grads}")
            failures += 1
            continue
        g_err = 0.0 if grads is None else max(
            np.abs(aw.to_float(grads["dut"][n], np.float64) -
                   aw.to_float(grads["ref"][n], np.float64)).max(initial=0.0)
            for n in ("dq", "dk", "dv"))
        # bf16 outputs: a few bf16 ulps of O(1) values.
        ok = o_err < 0.03 and lse_ok and lse_err < 2e-3 and g_err < 0.06
        failures += not ok
        print(f"{backend:10s} {name:40s} {'ok' if ok else 'FAIL'}: |do|max {o_err:.2e} "
              f"lse {lse_err:.2e}{'' if lse_ok else ' (inf pattern differs)'} "
              + (f"grads {g_err:.2e}" if grads is not None else "no backward (not claimed)"))
    ref.close()
    dut.close()
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="sdpa-math,sdpa-flash,sdpa-flash+lse,flex-triton")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        failures = sum(run(b, args.device, tmp) for b in args.backends.split(","))
    print(f"torch_worker_test: {'FAIL' if failures else 'ok'} ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
