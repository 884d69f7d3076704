#!/usr/bin/env python3
"""What each kernel API accepts, found by calling it: every backend of
tools/workers/torch_backends.py is called through its adapter on small problems, one per
feature it claims and one per head-dim pair of a sweep, forward and backward, and each call's
answer is recorded — accepted (with its error against a float64 reference, so that a feature
the API takes but ignores shows), or refused (the exception's last line). It also measures the
conventions the capabilities declare: the causal alignment (bottom-right or top-left) and what
lse holds on an empty row.

    torch_probe.py --backends sdpa-flash,sdpa-flash+lse,fa4 --dtype bf16 --device cuda --out probe.json
    torch_probe.py --njt --backends "" ...   # the public function on nested jagged tensors

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


NJT_CASES = [  # (name, causal, q_lens, k_lens, heads_q, heads_kv)
    ("plain", False, [20, 33, 11], [20, 33, 11], 2, 2),
    ("plain q_len != k_len", False, [12, 20, 7], [20, 33, 11], 2, 2),
    ("causal q_len == k_len", True, [20, 33, 11], [20, 33, 11], 2, 2),
    ("causal q_len < k_len", True, [12, 20, 7], [20, 33, 11], 2, 2),
    ("causal q_len > k_len", True, [20, 33, 11], [12, 20, 7], 2, 2),
    ("zero-length sequence", False, [20, 0, 11], [20, 5, 11], 2, 2),
    ("gqa 4:2", False, [20, 33, 11], [20, 33, 11], 4, 2),
    ("long: 200-token sequences (cuDNN's nested path needs max q_len > 128)", True,
     [200, 150, 90], [200, 150, 90], 2, 2),
]


def njt_probe(dtype, device, d=64):
    """The public function on packed batches, in the one form it takes them: nested jagged
    tensors (torch.nested.nested_tensor_from_jagged over the packed values and cu_seqlens,
    transposed to [B, H, j, D]), under sdpa_kernel of each fused backend, forward and
    backward. Per case: accepted or refused (its error's last line), and o's largest error
    against float64 attention per sequence with no mask, a top-left and a bottom-right causal
    mask, so that the alignment is_causal gets on this path shows (SDPA documents top-left).
    This is the measurement behind SdpaPublic's "no varlen" (torch_backends.py)."""
    from torch.nn.attention import sdpa_kernel, SDPBackend
    import torch.nn.functional as F
    out = []
    for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        for name, causal, ql, kl, hq, hk in NJT_CASES:
            g = torch.Generator().manual_seed(0)
            tq, tk = sum(ql), sum(kl)
            xs = [torch.randn(s, generator=g).to(dtype) for s in
                  ((tq, hq, d), (tk, hk, d), (tk, hk, d), (tq, hq, d))]
            q, k, v, do = (x.to(device) for x in xs)
            cq = torch.tensor([0] + list(np.cumsum(ql)), device=device)
            ck = torch.tensor([0] + list(np.cumsum(kl)), device=device)
            r = {"backend": backend, "case": name}
            try:
                qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
                qn = torch.nested.nested_tensor_from_jagged(qg, cq).transpose(1, 2)
                kn = torch.nested.nested_tensor_from_jagged(kg, ck).transpose(1, 2)
                vn = torch.nested.nested_tensor_from_jagged(vg, ck).transpose(1, 2)
                with sdpa_kernel([getattr(SDPBackend, backend)]):
                    on = F.scaled_dot_product_attention(qn, kn, vn, is_causal=causal,
                                                        enable_gqa=hq != hk)
                    o = on.transpose(1, 2).values()
                    r["forward"] = "accepted"
                    try:
                        torch.autograd.grad(o, (qg, kg, vg), grad_outputs=do)
                        r["backward"] = "accepted"
                    except Exception as e:  # noqa: BLE001
                        r["backward"] = "refused: " + last_line(e)
            except Exception as e:  # noqa: BLE001
                r["forward"] = "refused: " + last_line(e)
                out.append(r)
                print(f"  njt {backend:20s} {name:40s} {r['forward']}", flush=True)
                continue
            od = o.detach().double().cpu()
            errs = {}
            for label, align in (("none", None), ("top-left", 0), ("bottom-right", 1)):
                if align is not None and not causal:
                    continue
                worst = 0.0
                for b in range(len(ql)):
                    if ql[b] == 0:
                        continue
                    qs = q[cq[b]:cq[b + 1]].double().cpu()
                    ks = k[ck[b]:ck[b + 1]].double().cpu().repeat_interleave(hq // hk, 1)
                    vs = v[ck[b]:ck[b + 1]].double().cpu().repeat_interleave(hq // hk, 1)
                    s_ = torch.einsum("ihd,jhd->hij", qs, ks) / math.sqrt(d)
                    if align is not None:
                        off = kl[b] - ql[b] if align else 0
                        i = torch.arange(ql[b])[:, None]
                        j = torch.arange(kl[b])[None, :]
                        s_ = s_.masked_fill(j > i + off, -math.inf)
                    p = torch.softmax(s_, -1).nan_to_num(0.0)
                    ref = torch.einsum("hij,jhd->ihd", p, vs)
                    worst = max(worst, float((od[cq[b]:cq[b + 1]] - ref).abs().max()))
                errs[label] = worst
            r["o_err"] = errs
            out.append(r)
            print(f"  njt {backend:20s} {name:40s} {r.get('backward', '')} "
                  f"{json.dumps(errs)}", flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--backends", required=True)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per backend")
    parser.add_argument("--out", default=None)
    parser.add_argument("--njt", action="store_true",
                        help="also the public function on nested jagged tensors (packed "
                        "batches), per fused backend (njt_probe)")
    args = parser.parse_args()
    device = torch.device(args.device)
    results = {"torch": torch.__version__, "cuda": torch.version.cuda, "backends": []}
    if args.njt:
        print(f"== nested jagged tensors ({args.dtype}, {args.device})", flush=True)
        try:
            results["njt"] = njt_probe({"bf16": torch.bfloat16, "f16": torch.float16,
                                        "f32": torch.float32}[args.dtype], device)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    for name in [n for n in args.backends.split(",") if n]:
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
