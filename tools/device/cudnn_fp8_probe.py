#!/usr/bin/env python3
"""What cuDNN's FP8 SDPA accepts on this GPU, and whether the adapter passes each feature the
way attest means it: tools/workers/torch_backends_cudnn_fp8.py's forward and backward on a
grid of problems (head dims, GQA, causal in both alignments, Sq != Sk, packed varlen, odd
lengths), each compared with a float64 attention of the same FP8-dequantised inputs and the
mask of tools/workers/attest_worker.py `visible` (reference/problem/mask.h). A mask passed
wrongly moves o by O(1); the kernel's own FP8 rounding of P and dS moves it by a few percent.
Prints one JSON line per problem (status ok / unsupported / error, relative errors) and
writes them to --out.
Usage: python3 tools/device/cudnn_fp8_probe.py [--out FILE] [--scaling static|current]
                                               [--output bf16|e4m3] [--grads bf16|e4m3]
--grads e4m3: dq, dk, dv come out as E4M3 at the calibration's power-of-two scales (what
Hopper's FP8 backward may build; the worker does not offer it).
"""

import argparse
import json
import os
import sys
import time
import types

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "workers"))
import attest_worker as aw  # noqa: E402
import torch_backends as tb  # noqa: E402
import torch_backends_cudnn_fp8 as cf  # noqa: E402


def problem(b=1, sq=256, sk=256, hq=4, hk=4, d=128, causal=False, align="bottom_right",
            lens=None):
    p = {"batch": b, "seqlen_q": sq, "seqlen_k": sk, "heads_q": hq, "heads_kv": hk,
         "head_dim": d, "head_dim_v": d, "dtype": "bf16", "causal": causal,
         "causal_align": align}
    if lens is not None:
        cq, ck = [0], [0]
        for lq, lk in lens:
            cq.append(cq[-1] + lq)
            ck.append(ck[-1] + lk)
        p.update({"batch": len(lens), "cu_seqlens_q": cq, "cu_seqlens_k": ck,
                  "seqlen_q": max(x for x, _ in lens), "seqlen_k": max(x for _, x in lens)})
    return p


def reference(p, q, k, v, do):
    """float64 o [.., Hq, D], lse [Hq, rows], dq, dk, dv in attest's layout (dense tensors
    flattened to the packed token axis)."""
    hq, hk = p["heads_q"], p["heads_kv"]
    g = hq // hk
    sc = aw.scale_of(p)
    flat = [x.reshape(-1, x.shape[-2], x.shape[-1]).double() for x in (q, k, v, do)]
    q, k, v, do = flat
    o = torch.zeros_like(do)
    lse = torch.full((hq, q.shape[0]), float("-inf"), dtype=torch.float64, device=q.device)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b, (q0, ql, k0, kl) in enumerate(aw.sequences(p)):
        if ql == 0 or kl == 0:
            continue
        vis = torch.from_numpy(aw.visible(p, b, ql, kl)[0]).to(q.device)
        for h in range(hq):
            hh = h // g
            qs, ks, vs, dos = q[q0:q0 + ql, h], k[k0:k0 + kl, hh], v[k0:k0 + kl, hh], \
                do[q0:q0 + ql, h]
            s = (qs @ ks.T * sc).masked_fill(~vis, float("-inf"))
            m = s.amax(dim=1, keepdim=True)
            rows = torch.isfinite(m[:, 0])
            pm = torch.where(vis, torch.exp(s - torch.where(rows[:, None], m, 0)), 0.0)
            lrow = pm.sum(dim=1, keepdim=True)
            pm = torch.where(rows[:, None], pm / lrow.clamp(min=1e-300), 0.0)
            oo = pm @ vs
            o[q0:q0 + ql, h] = oo
            lse[h, q0:q0 + ql] = torch.where(rows, (m + torch.log(lrow))[:, 0],
                                             torch.tensor(float("-inf"), dtype=torch.float64,
                                                          device=q.device))
            dp = dos @ vs.T
            ds = pm * (dp - (dos * oo).sum(dim=1, keepdim=True))
            dq[q0:q0 + ql, h] = ds @ ks * sc
            dk[k0:k0 + kl, hh] += ds.T @ qs * sc
            dv[k0:k0 + kl, hh] += pm.T @ dos
    return o, lse, dq, dk, dv


def rel(a, ref):
    a, ref = a.double().reshape(ref.shape), ref
    fin = torch.isfinite(ref)
    if not bool(fin.any()):
        return 0.0
    den = ref[fin].abs().max().item() or 1.0
    return float((a[fin] - ref[fin]).abs().max().item() / den)


def run_one(runner, p, dev):
    gen = torch.Generator(device="cpu").manual_seed(7)
    tq = p["cu_seqlens_q"][-1] if p.get("cu_seqlens_q") else None
    tk = p["cu_seqlens_k"][-1] if p.get("cu_seqlens_k") else None
    qs = (tq,) if tq is not None else (p["batch"], p["seqlen_q"])
    ks = (tk,) if tk is not None else (p["batch"], p["seqlen_k"])

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(dev)

    q = rnd(*qs, p["heads_q"], p["head_dim"])
    k = rnd(*ks, p["heads_kv"], p["head_dim"])
    v = rnd(*ks, p["heads_kv"], p["head_dim_v"])
    do = rnd(*qs, p["heads_q"], p["head_dim_v"])
    be = runner.backend
    am = be._amaxes({"q": q, "k": k, "v": v, "do": do})
    deq = {}
    for n, x in (("q", q), ("k", k), ("v", v), ("do", do)):
        codes, descale = cf.quantize(x, am[n])
        deq[n] = codes.double() * descale.double().reshape(())
    t0 = time.time()
    o, lse = runner.forward(p, q, k, v)
    dq, dk, dv = runner.backward(p, q, k, v, do)
    torch.cuda.synchronize()
    secs = time.time() - t0
    ro, rlse, rdq, rdk, rdv = reference(p, deq["q"], deq["k"], deq["v"], deq["do"])
    lse_flat = lse.reshape(p["heads_q"], -1) if tq is not None else \
        lse.permute(1, 0, 2).reshape(p["heads_q"], -1)
    return {"o": rel(o, ro), "lse_abs": float((lse_flat.double() - rlse)[torch.isfinite(rlse)]
                                              .abs().max().item()),
            "dq": rel(dq, rdq), "dk": rel(dk, rdk), "dv": rel(dv, rdv), "secs": round(secs, 3),
            "route": be.route}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--scaling", default="static", choices=["static", "current"])
    ap.add_argument("--output", default="bf16", choices=["bf16", "e4m3"])
    ap.add_argument("--grads", default="bf16", choices=["bf16", "e4m3"])
    args = ap.parse_args()
    ns = types.SimpleNamespace(device="cuda", dtype="bf16", fp8_scaling=args.scaling,
                               fp8_output=args.output, fp8_grads=args.grads,
                               measure_claims=False)
    runner = tb.Runner(tb.make(types.SimpleNamespace(backend="cudnn-fp8", **vars(ns))),
                       caps={"head_dims": [], "head_dims_v": []})
    import cudnn
    head = {"cudnn_frontend": getattr(cudnn, "__version__", "?"),
            "cudnn_backend": cudnn.backend_version(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0), "calibration": runner.backend.cal}
    print(json.dumps(head), flush=True)
    grid = [
        ("base d128", problem()),
        ("d64", problem(d=64)),
        ("d256", problem(d=256)),
        ("d96", problem(d=96)),
        ("gqa 8/2", problem(hq=8, hk=2)),
        ("causal square", problem(causal=True)),
        ("causal bottom-right sq<sk", problem(sq=128, sk=384, causal=True)),
        ("causal top-left sq<sk", problem(sq=128, sk=384, causal=True, align="top_left")),
        ("causal bottom-right sq>sk", problem(sq=384, sk=128, causal=True)),
        ("batch 3 sq 100 sk 77", problem(b=3, sq=100, sk=77)),
        ("sq 1", problem(sq=1, sk=300)),
        ("sk 1", problem(sq=64, sk=1)),
        ("sq 1000 sk 1000 causal", problem(sq=1000, sk=1000, causal=True)),
        ("varlen", problem(lens=[(100, 100), (37, 37), (200, 200)])),
        ("varlen causal", problem(lens=[(100, 100), (37, 37), (200, 200)], causal=True)),
        ("varlen gqa causal sq!=sk", problem(hq=8, hk=2, lens=[(50, 120), (300, 260)],
                                             causal=True)),
        ("varlen empty sequence", problem(lens=[(64, 64), (0, 0), (32, 32)])),
    ]
    lines = []
    for name, p in grid:
        rec = {"name": name, "problem": {k: v for k, v in p.items() if k != "dtype"}}
        try:
            rec.update(status="ok", **run_one(runner, p, "cuda"))
        except aw.Unsupported as e:
            rec.update(status="unsupported", reason=str(e)[:400])
        except Exception as e:  # noqa: BLE001 - every failure is the answer
            rec.update(status="error", reason=f"{type(e).__name__}: {str(e)[:400]}")
        print(json.dumps(rec), flush=True)
        lines.append(rec)
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(head) + "\n")
            for r in lines:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
