#!/usr/bin/env python3
"""What each kernel API accepts, found by calling it: every backend of
tools/workers/torch_backends.py is called through its adapter on small problems, one per
feature it claims and one per head-dim pair of a sweep, forward and backward, and each call's
answer is recorded — accepted (with its error against a float64 reference, so that a feature
the API takes but ignores shows), or refused (the exception's last line). It also measures the
conventions the capabilities declare: the causal alignment (bottom-right or top-left) and what
lse holds on an empty row.

    torch_probe.py --backends sdpa-flash,fa4 --dtype bf16 --device cuda --out probe.json

Prints one table per backend; --out writes everything as JSON (docs/gpu-results/ keeps the
H200's). The gate, not this probe, is the verdict: the probe says what to claim.
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attest_worker as aw  # noqa: E402
import torch  # noqa: E402

import torch_backends as tb  # noqa: E402


def problem(**kw):
    p = {"batch": 2, "heads_q": 2, "heads_kv": 2, "seqlen_q": 64, "seqlen_k": 64,
         "head_dim": 64, "head_dim_v": 64, "dtype": "bf16", "scale": None, "causal": False,
         "causal_align": "bottom_right", "window": [-1, -1], "softcap": 0.0,
         "alibi_slopes": None, "cu_seqlens_q": None, "cu_seqlens_k": None}
    p.update(kw)
    return p


def features():
    """(name, capability it needs, problem)."""
    docs = [[0] * 20 + [1] * 30 + [2] * 14] * 2
    return [
        ("plain", None, problem()),
        ("gqa 4:2", "gqa", problem(heads_q=4)),
        ("causal bottom-right 48x80", "causal", problem(causal=True, seqlen_q=48, seqlen_k=80)),
        ("causal bottom-right 80x48 (empty rows)", "causal",
         problem(causal=True, seqlen_q=80, seqlen_k=48)),
        ("causal top-left 48x80", "causal",
         problem(causal=True, causal_align="top_left", seqlen_q=48, seqlen_k=80)),
        ("window (8, 4)", "window", problem(window=[8, 4], seqlen_q=48, seqlen_k=80)),
        ("window (-1, 8) 80x48", "window", problem(window=[-1, 8], seqlen_q=80, seqlen_k=48)),
        ("window (16, 0) causal", "window", problem(window=[16, 0], causal=True)),
        ("softcap 10", "softcap", problem(softcap=10.0)),
        ("alibi", "alibi", problem(alibi_slopes=[0.5, 0.125], seqlen_q=48, seqlen_k=80)),
        ("varlen", "varlen", problem(batch=3, seqlen_q=44, seqlen_k=55,
                                     cu_seqlens_q=[0, 20, 20, 64], cu_seqlens_k=[0, 30, 45, 100])),
        ("varlen causal", "varlen", problem(batch=3, causal=True, seqlen_q=44, seqlen_k=55,
                                            cu_seqlens_q=[0, 20, 20, 64],
                                            cu_seqlens_k=[0, 30, 45, 100])),
        ("documents", "documents", problem(document_ids_q=docs, document_ids_k=docs)),
        ("prefix-lm 10 causal", "prefix_lm", problem(causal=True, prefix_lm=10)),
        ("block-sparse 16x32", "block_sparse",
         problem(block_sparse={"block_q": 16, "block_k": 32,
                               "blocks": [[0, 0], [1, 1], [2, 0], [3, 1], [3, 0]]})),
        ("Dv 32 != D 64", "dv", problem(head_dim_v=32)),
        ("D 192 Dv 128", "dv", problem(head_dim=192, head_dim_v=128)),
    ]


HEAD_DIMS = [8, 16, 24, 40, 64, 72, 96, 100, 128, 160, 192, 224, 256, 320]


def reference(p, q, k, v):
    """float64 o, lse and the visible mask per sequence (attest_worker.visible, the mask.h
    transcription), in attest layout; empty rows o = 0, lse = -inf."""
    hq, hkv = p["heads_q"], p["heads_kv"]
    scale = aw.scale_of(p)
    rep = hq // hkv
    outs, lses = [], []
    for b, (q0, ql, k0, kl) in enumerate(aw.sequences(p)):
        if tb.is_varlen(p):
            qs, ks, vs = q[q0:q0 + ql], k[k0:k0 + kl], v[k0:k0 + kl]
        else:
            qs, ks, vs = q[b], k[b], v[b]
        if ql == 0:
            continue
        vis, off = aw.visible(p, b, ql, kl)
        s = torch.einsum("ihd,jhd->hij", qs, ks.repeat_interleave(rep, 1)) * scale
        if p.get("softcap"):
            s = p["softcap"] * torch.tanh(s / p["softcap"])
        if p.get("alibi_slopes") is not None:
            i = torch.arange(ql)[:, None]
            j = torch.arange(kl)[None, :]
            s = s - torch.tensor(p["alibi_slopes"], dtype=s.dtype)[:, None, None] * \
                (i + off - j).abs()
        s = s.masked_fill(~torch.from_numpy(vis)[None], -math.inf)
        lse = torch.logsumexp(s, -1)
        pr = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        o = torch.einsum("hij,jhd->ihd", pr, vs.repeat_interleave(rep, 1))
        outs.append(o)
        lses.append(lse)
    if tb.is_varlen(p):
        return torch.cat(outs, 0), torch.cat(lses, 1)
    return torch.stack(outs), torch.stack(lses)


def inputs(p, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    if tb.is_varlen(p):
        tq, tk = p["cu_seqlens_q"][-1], p["cu_seqlens_k"][-1]
        shapes = [(tq, p["heads_q"], p["head_dim"]), (tk, p["heads_kv"], p["head_dim"]),
                  (tk, p["heads_kv"], p["head_dim_v"]), (tq, p["heads_q"], p["head_dim_v"])]
    else:
        b, sq, sk = p["batch"], p["seqlen_q"], p["seqlen_k"]
        shapes = [(b, sq, p["heads_q"], p["head_dim"]), (b, sk, p["heads_kv"], p["head_dim"]),
                  (b, sk, p["heads_kv"], p["head_dim_v"]), (b, sq, p["heads_q"], p["head_dim_v"])]
    xs = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    return [x.to(device) for x in xs]


def last_line(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[-1][:300] if text else type(e).__name__


def call(backend, p, dtype, device, want_bwd):
    """One forward (and backward) through the adapter; the answer as a dict."""
    q, k, v, do = inputs(p, dtype, device)
    out = {}
    t0 = time.time()
    try:
        with backend.grad_mode():
            o, lse = backend.run(p, q, k, v, need_lse=backend.caps().get("lse", True))
        torch.cuda.synchronize() if device.type == "cuda" else None
    except Exception as e:  # noqa: BLE001 - a refusal is the answer we record
        return {"forward": "refused", "error": last_line(e), "seconds": time.time() - t0}
    out["forward"] = "accepted"
    out["route"] = backend.route
    ro, rl = reference(p, *(x.double().cpu() for x in (q, k, v)))
    out["o_err"] = float((o.double().cpu() - ro).abs().max()) if o.numel() else 0.0
    if lse is not None:
        lc = lse.double().cpu()
        fin = torch.isfinite(rl)
        out["lse_err"] = float((lc[fin] - rl[fin]).abs().max()) if fin.any() else 0.0
        empty = ~fin
        if empty.any():
            vals = sorted({str(x) for x in lc[empty].flatten().tolist()})
            out["empty_row_lse"] = vals[:4]
            out["empty_row_o_max"] = float(o.double().cpu().abs().amax(-1)[
                empty.transpose(-1, -2) if not tb.is_varlen(p) else empty.t()].max())
    if want_bwd:
        try:
            qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
            with torch.enable_grad():
                o2, _ = backend.run(p, qg, kg, vg, need_lse=False)
                g = torch.autograd.grad(o2, (qg, kg, vg), grad_outputs=do, allow_unused=True)
            out["backward"] = "accepted" if all(x is not None for x in g) else "no gradient"
            # float64 gradients of the reference forward.
            qd, kd, vd = (x.double().cpu().requires_grad_(True) for x in (q, k, v))
            with torch.enable_grad():
                rd, _ = reference(p, qd, kd, vd)
                rg = torch.autograd.grad(rd, (qd, kd, vd), grad_outputs=do.double().cpu(),
                                         allow_unused=True)
            out["grad_err"] = max(float((a.double().cpu() - b).abs().max())
                                  for a, b in zip(g, rg) if a is not None and b is not None)
        except Exception as e:  # noqa: BLE001
            out["backward"] = "refused"
            out["backward_error"] = last_line(e)
    out["seconds"] = round(time.time() - t0, 2)
    return out


def upcast_evidence(backend, p, dtype, device):
    """Whether the backend's answer in `dtype` is bit for bit its fp32 answer rounded once (o,
    dq, dk, dv): the evidence behind a declared "<dtype>-upcast" recipe."""
    q, k, v, do = inputs(p, dtype, device)
    answers = []
    for cast in (dtype, torch.float32):
        xs = [x.to(cast).clone().requires_grad_(True) for x in (q, k, v)]
        with torch.enable_grad():
            o, _ = backend.run(p, *xs, need_lse=False)
            g = torch.autograd.grad(o, xs, grad_outputs=do.to(cast))
        answers.append([t.detach().to(dtype) for t in (o, *g)])
    same = [torch.equal(a, b) for a, b in zip(*answers)]
    diff = [float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
            for a, b in zip(*answers)]
    return {"bit_identical": dict(zip(("o", "dq", "dk", "dv"), same)),
            "max_diff": dict(zip(("o", "dq", "dk", "dv"), diff))}


class Args:
    def __init__(self, backend, dtype, device, deterministic=False):
        self.backend, self.dtype, self.device = backend, dtype, device
        self.mask_form, self.deterministic, self.caps = "bool", deterministic, None


def probe(name, dtype, device, budget):
    t_end = time.time() + budget
    try:
        backend = tb.make(Args(name.replace("-deterministic", ""), dtype, device.type,
                                   name.endswith("-deterministic")))
    except Exception as e:  # noqa: BLE001
        return {"backend": name, "error": last_line(e)}
    caps = backend.caps()
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    rows = []
    for fname, need, p in features():
        if time.time() > t_end:
            rows.append({"feature": fname, "skipped": "probe time budget spent"})
            continue
        p = dict(p, dtype=dtype)
        claimed = tb.covers(caps, p) is None
        r = {"feature": fname, "claimed": claimed}
        # Unclaimed features are only called where the adapter has a way to pass them.
        if claimed or need in ("dv",):
            r.update(call(backend, p, torch_dtype, device, caps.get("backward", False)))
        else:
            r["not_called"] = tb.covers(caps, p)
        rows.append(r)
        print(f"  {name:18s} {fname:40s} {json.dumps({k: v for k, v in r.items() if k != 'feature'})}",
              flush=True)
    upcast = []
    if str(caps.get("recipe", "")).endswith("-upcast"):
        for fname, need, p in features():
            p = dict(p, dtype=dtype)
            if tb.covers(caps, p) is not None:
                continue
            try:
                r = upcast_evidence(backend, p, torch_dtype, device)
            except Exception as e:  # noqa: BLE001
                r = {"error": last_line(e)}
            upcast.append({"feature": fname, **r})
            print(f"  {name:18s} upcast {fname:33s} {json.dumps(r)}", flush=True)
    dims = []
    for d in HEAD_DIMS:
        if time.time() > t_end:
            break
        p = problem(head_dim=d, head_dim_v=d, dtype=dtype, batch=1, seqlen_q=40, seqlen_k=40)
        r = call(backend, p, torch_dtype, device, caps.get("backward", False))
        dims.append({"head_dim": d, **r})
        print(f"  {name:18s} head_dim {d:<4d} {r.get('forward')} {r.get('backward', '')} "
              f"{r.get('error', '')}{r.get('backward_error', '')}", flush=True)
    out = {"backend": name, "dtype": dtype, "caps": caps, "features": rows, "head_dims": dims}
    if upcast:
        out["upcast"] = upcast
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--backends", required=True)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per backend")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    results = {"torch": torch.__version__, "cuda": torch.version.cuda, "backends": []}
    for name in args.backends.split(","):
        print(f"== {name} ({args.dtype}, {args.device})", flush=True)
        try:
            results["backends"].append(probe(name, args.dtype, device, args.budget))
        except Exception:  # noqa: BLE001 - one backend's crash must not lose the others
            traceback.print_exc()
            results["backends"].append({"backend": name, "error": traceback.format_exc()[-400:]})
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
