#!/usr/bin/env python3
"""Which mask form breaks which SDPA backend: the public F.scaled_dot_product_attention under
sdpa_kernel([backend]) on three small problems, each with its mask passed in every form a
model may pass it (boolean; additive 0 / -inf in the input dtype; additive in float32; the
same additive mask made contiguous, and one broadcast over heads), forward and backward,
against float64 attention with the boolean mask applied exactly:
  empty-row   B1 H1 Sq3 Sk2 D8, bottom-right causal: query 0 sees no key (o and dq must be 0);
  documents   B1 H1 Sq10 Sk11 D8, query 0 sees keys 0-1, queries 1-9 keys 2-10 (no empty row):
              keys 0-1 get gradient from query 0 alone;
  alibi       B1 H2 Sq64 Sk64 D64, a per-head ALiBi bias (slopes 1/2, 1/4), no mask.
Prints one line per backend, problem and form: accepted or refused, and the largest error of
o, dq, dk, dv. Written for the diagnosis of the public cuDNN route's gate failures
(docs/gpu-results.md "PyTorch's SDPA through the public function").
Usage: python3 tools/device/sdpa_mask_forms.py [--dtype bf16|f16] [--json FILE]
"""

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend


def problems():
    i3, j2 = torch.arange(3)[:, None], torch.arange(2)[None, :]
    empty = (j2 <= i3 + 2 - 3)[None, None]                      # [1, 1, 3, 2]
    docs = torch.zeros(10, 11, dtype=torch.bool)
    docs[0, :2] = True
    docs[1:, 2:] = True
    i, j = torch.arange(64)[:, None], torch.arange(64)[None, :]
    slopes = torch.tensor([0.5, 0.25])
    alibi = -slopes[:, None, None] * (i - j).abs().float()      # [2, 64, 64]
    return [("empty-row", 1, 3, 2, 8, empty, None),
            ("documents", 1, 10, 11, 8, docs[None, None], None),
            ("alibi", 2, 64, 64, 64, None, alibi[None])]


def forms(vis, bias, dtype):
    """(name, attn_mask) for every form of the problem's rule."""
    if bias is not None:
        return [("float32 [1,H,Sq,Sk]", bias.float()),
                ("input dtype [1,H,Sq,Sk]", bias.to(dtype)),
                ("float32 [1,H,Sq,Sk] as math reference", bias.float())]
    add = torch.zeros(vis.shape).masked_fill(~vis, -math.inf)
    return [("bool", vis),
            ("additive -inf input dtype", add.to(dtype)),
            ("additive -inf float32", add.float()),
            ("additive -inf input dtype, 16-aligned rows",
             torch.nn.functional.pad(add.to(dtype), (0, (-add.shape[-1]) % 16))[..., :add.shape[-1]]),
            ("additive finite lowest, input dtype",
             torch.zeros(vis.shape).masked_fill(~vis, torch.finfo(dtype).min).to(dtype))]


def reference(q, k, v, vis, bias, do):
    qd, kd, vd = (x.double().detach().requires_grad_(True) for x in (q, k, v))
    s = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias.double()
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    empty = torch.isneginf(s).all(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    o = p @ vd
    g = torch.autograd.grad(o, (qd, kd, vd), grad_outputs=do.double())
    return o.detach(), g


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    dev = torch.device(a.device)
    rows = []
    for name, h, sq, sk, d, vis, bias in problems():
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(s, generator=g).to(dtype) for s in
                       ((1, h, sq, d), (1, h, sk, d), (1, h, sk, d), (1, h, sq, d)))
        ro, rg = reference(q, k, v, vis, bias, do)
        for backend in ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"):
            for form, mask in forms(vis, bias, dtype):
                if form.endswith("as math reference") and backend != "MATH":
                    continue
                r = {"problem": name, "backend": backend, "form": form}
                try:
                    x = [t.to(dev).requires_grad_(True) for t in (q, k, v)]
                    with sdpa_kernel([getattr(SDPBackend, backend)]):
                        o = F.scaled_dot_product_attention(*x, attn_mask=mask.to(dev))
                        gr = torch.autograd.grad(o, x, grad_outputs=do.to(dev))
                    errs = [float((t.double().cpu() - ref).abs().max())
                            for t, ref in zip((o, *gr), (ro, *rg))]
                    r.update(dict(zip(("o", "dq", "dk", "dv"), errs)))
                    if name == "empty-row":
                        r["o_row0"] = float(o[0, 0, 0].abs().max())
                except Exception as e:  # noqa: BLE001 - a refusal is an answer
                    r["refused"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append(r)
                vals = r.get("refused") or " ".join(f"{kk} {r[kk]:.3g}" for kk in
                                                    ("o", "dq", "dk", "dv", "o_row0") if kk in r)
                print(f"{name:10s} {backend:20s} {form:40s} {vals}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
