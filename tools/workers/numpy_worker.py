#!/usr/bin/env python3
"""A float32 NumPy attention worker for attest's exec protocol (docs/design.md "External
kernels"; docs/protocol.md). CI runs `attest check --kernel "exec:python3
tools/workers/numpy_worker.py"` to test the protocol end to end.

Semantics are attest's (reference/problem/mask.h): s = scale·q·k, softcap cap·tanh(s/cap),
ALiBi −slope·|i + off − j|, masks (causal in both alignments, windows, prefix-LM, per-token
documents, block-sparse lists, packed varlen), GQA, Dv ≠ D; empty rows give o = 0,
lse = −inf, dq = 0. One (sequence, head) at a time with the score matrix materialised.

Precision: elementwise math in float32 (scores, softcap, exp, P, dS), every reduction (the
matrix products and the softmax row sums) accumulated in float64 and rounded to float32 once,
outputs float32. A float32 kernel whose sums are exact to well below a float32 ulp is
invariant, bit for bit, to what attest's metamorphic checks change: summation order (heads
permuted within a GQA group) and masked padding (extra keys with P = 0).
The backward recomputes P = exp(S − lse) from the given lse and forms
dS = P∘(dP − D) with D = rowsum(P∘dP) (PyTorch's softmax backward; equal to rowsum(dO∘O)
for the O this P gives, and exactly dP for a single visible key), times the softcap
derivative 1 − tanh².

--no-lse models a kernel whose API returns the output alone (PyTorch's
F.scaled_dot_product_attention): it declares "lse": false, its forward writes o only, and its
backward, which then gets no lse, recomputes the softmax statistics from its own forward (as
autograd keeps what the forward saved). --omit-lse writes o only but keeps claiming lse: a
broken worker, which attest must fail (kernels/exec/exec_cli_test.sh).
"""

import argparse
import os
import sys

# One BLAS thread: results do not depend on the machine's core count (the `deterministic`
# claim), and attest's own threads are not oversubscribed.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import attest_worker as aw  # noqa: E402

F32 = np.float32
F64 = np.float64

CAPABILITIES = {
    "dtypes": ["f32", "bf16", "f16"], "head_dims": [], "head_dims_v": [],
    "causal": True, "window": True, "softcap": True, "alibi": True, "varlen": True,
    "gqa": True, "documents": True, "prefix_lm": True, "block_sparse": True,
    "backward": True, "deterministic": True, "profile": "f32",
    # NumPy reads any strides: inputs arrive as the views attest makes (docs/protocol.md "Views").
    "strides": "any",
}


def _check_dtype(problem, inputs):
    if problem["dtype"] not in CAPABILITIES["dtypes"]:
        raise aw.Unsupported(f"dtype {problem['dtype']}")
    for name in ("q", "k", "v"):
        if inputs[name].dtype != aw.ST_NAME[problem["dtype"]]:
            raise ValueError(f"input {name} is {inputs[name].dtype}, problem dtype is "
                             f"{problem['dtype']}")


def _scores(problem, b, h, qs, ks, off, vis):
    """Masked float32 scores (−inf where hidden) and tanh(s/cap) for the softcap derivative.
    qs, ks are float64 holding float32 values: the products are exact, the sums float64."""
    scale = F32(aw.scale_of(problem))
    s = (qs @ ks.T).astype(F32) * scale
    t = None
    cap = float(problem.get("softcap", 0.0) or 0.0)
    if cap > 0:
        t = np.tanh(s / F32(cap))
        s = F32(cap) * t
    slopes = problem.get("alibi_slopes")
    if slopes is not None:
        i = np.arange(qs.shape[0])[:, None]
        j = np.arange(ks.shape[0])[None, :]
        s = s - F32(slopes[h]) * np.abs(i + off - j).astype(F32)
    return np.where(vis, s, F32(-np.inf)).astype(F32), t


def _inputs(problem, inputs, names):
    """float32 values (widened exactly), held in float64 for the float64 accumulations."""
    widths = {"q": problem["head_dim"], "k": problem["head_dim"]}
    out = []
    for n in names:
        x = aw.to_float(inputs[n], np.float32).astype(F64)
        out.append(x.reshape(-1, x.shape[-2], widths.get(n, problem["head_dim_v"])))
    return out


def forward(problem, inputs):
    _check_dtype(problem, inputs)
    hq, hkv, dv = problem["heads_q"], problem["heads_kv"], problem["head_dim_v"]
    q, k, v = _inputs(problem, inputs, ("q", "k", "v"))
    o = np.zeros((q.shape[0], hq, dv), dtype=F32)
    lse = np.full((hq, q.shape[0]), -np.inf, dtype=F32)
    for b, (q0, ql, k0, kl) in enumerate(aw.sequences(problem)):
        if ql == 0:
            continue
        vis, off = aw.visible(problem, b, ql, kl)
        for h in range(hq):
            g = h // (hq // hkv)
            s, _ = _scores(problem, b, h, q[q0:q0 + ql, h], k[k0:k0 + kl, g], off, vis)
            m = s.max(axis=1, initial=-np.inf)
            live = np.isfinite(m)  # rows with at least one visible key
            p = np.exp(s - np.where(live, m, 0)[:, None])  # float32
            p[~live] = 0
            l = p.sum(axis=1, dtype=F64)
            safe = np.where(live, l, 1.0)
            lse[h, q0:q0 + ql] = np.where(live, m + np.log(safe), -np.inf).astype(F32)
            pn = (p / safe[:, None]).astype(F32)  # P rounded to float32, like a kernel's P
            o[q0:q0 + ql, h] = (pn.astype(F64) @ v[k0:k0 + kl, g]).astype(F32)
    if problem.get("cu_seqlens_q") is not None:
        return {"o": o, "lse": lse}
    bsz, sq = problem["batch"], problem["seqlen_q"]
    return {"o": o.reshape(bsz, sq, hq, dv),
            "lse": np.ascontiguousarray(lse.reshape(hq, bsz, sq).transpose(1, 0, 2))}


def backward(problem, inputs):
    _check_dtype(problem, inputs)
    hq, hkv = problem["heads_q"], problem["heads_kv"]
    q, k, v, do = _inputs(problem, inputs, ("q", "k", "v", "do"))
    if "lse" in inputs:
        lse_in = aw.to_float(inputs["lse"], np.float32)
    else:  # --no-lse: no lse input; the statistics come from this worker's own forward
        lse_in = forward(problem, inputs)["lse"]
    varlen = problem.get("cu_seqlens_q") is not None
    if not varlen:  # [B, Hq, Sq] -> [Hq, B*Sq], the packed layout
        lse_in = lse_in.transpose(1, 0, 2).reshape(hq, -1)
    scale = aw.scale_of(problem)
    dq = np.zeros(q.shape, dtype=F32)
    dk = np.zeros_like(k)   # float64 accumulators over the GQA group, rounded once
    dvv = np.zeros_like(v)
    for b, (q0, ql, k0, kl) in enumerate(aw.sequences(problem)):
        if ql == 0 or kl == 0:
            continue
        vis, off = aw.visible(problem, b, ql, kl)
        for h in range(hq):
            g = h // (hq // hkv)
            qs, ks, vs = q[q0:q0 + ql, h], k[k0:k0 + kl, g], v[k0:k0 + kl, g]
            s, t = _scores(problem, b, h, qs, ks, off, vis)
            lse = lse_in[h, q0:q0 + ql]
            live = np.isfinite(lse)  # empty rows (lse = ±inf) contribute nothing
            p = np.exp(s - np.where(live, lse, 0)[:, None]).astype(F32)
            p[~live] = 0
            p64 = p.astype(F64)
            dos = do[q0:q0 + ql, h]
            dvv[k0:k0 + kl, g] += p64.T @ dos
            dp = dos @ vs.T
            delta = (p64 * dp).sum(axis=1)
            ds = (p64 * (dp - delta[:, None])).astype(F32)
            if t is not None:
                ds = ds * (F32(1) - t * t)
            ds64 = ds.astype(F64)
            dq[q0:q0 + ql, h] = ((ds64 @ ks) * scale).astype(F32)
            dk[k0:k0 + kl, g] += (ds64.T @ qs) * scale
    dk, dvv = dk.astype(F32), dvv.astype(F32)
    if varlen:
        return {"dq": dq, "dk": dk, "dv": dvv}
    bsz, sq, sk = problem["batch"], problem["seqlen_q"], problem["seqlen_k"]
    d, dv = problem["head_dim"], problem["head_dim_v"]
    return {"dq": dq.reshape(bsz, sq, hq, d), "dk": dk.reshape(bsz, sk, hkv, d),
            "dv": dvv.reshape(bsz, sk, hkv, dv)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="numpy-f32", help="the name describe reports")
    parser.add_argument("--no-lse", action="store_true",
                        help='declare "lse": false and return o only')
    parser.add_argument("--omit-lse", action="store_true",
                        help="return o only but keep claiming lse (a broken worker, for tests)")
    parser.add_argument("--no-masks", action="store_true",
                        help="claim no mask (causal, window, prefix-LM, documents, block-sparse) "
                             "and refuse problems with one, as a kernel without masks does")
    parser.add_argument("--declare-device", choices=["host", "cuda"], default="host",
                        help='the "device" it declares (it always runs on the host): cuda '
                             "stands in for a GPU kernel in tests of --oracle-device")
    parser.add_argument("--claim-sink", action="store_true",
                        help='declare "sink": true, which the exec protocol cannot carry yet '
                             "(attest refuses the worker; for tests)")
    parser.add_argument("--claim-rel-bias", action="store_true",
                        help='declare "rel_bias": true, likewise (for tests)')
    args = parser.parse_args()
    caps = dict(CAPABILITIES, lse=False) if args.no_lse else CAPABILITIES
    if args.claim_sink:
        caps = dict(caps, sink=True)
    if args.claim_rel_bias:
        caps = dict(caps, rel_bias=True)
    if args.declare_device != "host":
        caps = dict(caps, device=args.declare_device)
    if args.no_masks:
        caps = dict(caps, causal=False, window=False, prefix_lm=False, documents=False,
                    block_sparse=False)

    def forward_o_only(problem, inputs):
        return {"o": forward(problem, inputs)["o"]}

    fwd = forward_o_only if args.no_lse or args.omit_lse else forward
    bwd = backward
    if args.no_masks:
        def refuse_masks(op):
            def call(problem, *rest):
                masked = (problem.get("causal") or problem.get("prefix_lm")
                          or problem.get("document_ids_q") is not None
                          or problem.get("block_sparse") is not None
                          or list(problem.get("window", [-1, -1])) != [-1, -1])
                if masked:
                    raise aw.Unsupported("masks (this worker runs with --no-masks)")
                return op(problem, *rest)
            return call
        fwd, bwd = refuse_masks(fwd), refuse_masks(backward)
    aw.serve(lambda: (args.name, caps), fwd, bwd)


if __name__ == "__main__":
    sys.exit(main())
