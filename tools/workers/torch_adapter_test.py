#!/usr/bin/env python3
"""The adapters of tools/workers/torch_backends.py do not emulate, on a CPU: every backend,
including the CUDA-only ones, runs each problem of its claim through the worker's forward and
backward, and the test checks
  1. the answer against a float64 reference (tools/workers/torch_probe.py `reference`), so
     that a claimed feature the adapter drops or mistranslates fails;
  2. how the kernel was called: once per request, with the whole batch, kv heads as given
     (no repetition), head dims as given (no padding), packed batches through cu_seqlens, and
     the problem's mask through the API's own argument (a mask or causal flag whenever the
     problem has a mask) — the record of every call is kept by stand-ins for the entry points.
  3. for the public SDPA routes (sdpa-math, sdpa-flash, sdpa-efficient, sdpa-cudnn), that the
     call ran under the SDPA backend the route names, that the adapter returns the tensor the
     function returned (bit for bit, transposed back) and no lse of its own, and that every
     problem the route claims is accepted (its claim is measured through the same call).
The CUDA-only entry points (PyTorch's flash, memory-efficient and cuDNN ops; the public
F.scaled_dot_product_attention on those three backends; FlashAttention-2 and -4
`flash_attn_func` modules) are replaced by stand-ins that implement each API's documented
semantics in float32 (FlashAttention: bottom-right causal and windows, +inf lse on empty rows;
memory-efficient: custom_mask_type 1 top-left, 2 bottom-right, an additive bias; cuDNN:
top-left is_causal, an additive bias; the public function: the argument checks each backend
makes, aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, and CausalBias's lower-right
dispatch, torch/nn/attention/bias.py) and record their arguments; sdpa-math, PyTorch's CPU
flash kernel (through the public function and the private op) and eager FlexAttention run for
real. Last, the test shows that it can fail: an adapter that drops the window, one that repeats
kv heads and one that splits the batch are each caught, and on the public route one that runs
another SDPA backend, one that repeats kv heads instead of enable_gqa, one that returns
attention it computed itself, one that computes an lse and one that claims packed batches.
Exit 77 (skipped) without torch.
"""

import math
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("skip: torch is not importable")
    sys.exit(77)

import attest_worker as aw  # noqa: E402
import torch_backends as tb  # noqa: E402
import torch_backends_common as tbc  # noqa: E402
import torch_call as tc  # noqa: E402
import torch_probe as tp  # noqa: E402

CALLS = []


def record(api, **kw):
    CALLS.append(dict(api=api, **kw))


# ---- Reference semantics of each API, for the stand-ins ----

def attend(q, k, v, vis, scale, bias=None, softcap=0.0):
    """q [B,H,Sq,D], k/v [B,Hk,Sk,*] (fewer heads: GQA), vis bool broadcastable to
    [B,H,Sq,Sk] or None, an additive bias -> o (q's dtype), lse float32."""
    rep = q.shape[1] // k.shape[1]
    s = (q.float() @ k.float().repeat_interleave(rep, 1).transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.float()
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    # A row with no visible key: o = 0, lse = -inf, and gradients 0, not NaN (a softmax over
    # -inf alone has a NaN derivative, which the checks below would report as the adapter's).
    empty = torch.isneginf(s).all(-1, keepdim=True)
    s = s.masked_fill(empty, 0.0)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).masked_fill(empty, 0.0)
    lse = lse.masked_fill(empty[..., 0], -math.inf)
    return (p @ v.float().repeat_interleave(rep, 1)).to(q.dtype), lse


def fa_visible(sq, sk, causal, left, right):
    """FlashAttention's masks: bottom-right causal and window (-1 or None unbounded)."""
    left = -1 if left is None else left
    right = -1 if right is None else right
    if causal:
        right = 0
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    off = sk - sq
    vis = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    return vis


def fa_alibi(slopes, sq, sk):
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    return -slopes.float()[:, None, None] * (i + sk - sq - j).abs().float()


def per_sequence(q, k, v, cu_q, cu_k, fn):
    """Run fn(qs, ks, vs) on each packed sequence ([1, H, S, D] each); concatenate."""
    os_, ls = [], []
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        o, lse = fn(q[q0:q1].transpose(0, 1)[None], k[k0:k1].transpose(0, 1)[None],
                    v[k0:k1].transpose(0, 1)[None])
        os_.append(o[0].transpose(0, 1))
        ls.append(lse[0])
    return torch.cat(os_, 0), torch.cat(ls, 1)


def fake_flash_forward(q, k, v, cum_q, cum_k, max_q, max_k, dropout, is_causal, debug, *,
                       scale=None, window_size_left=None, window_size_right=None,
                       seqused_k=None, alibi_slopes=None):
    record("_flash_attention_forward", q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
           cu=cum_q is not None, causal=is_causal,
           window=(window_size_left, window_size_right), alibi=alibi_slopes is not None)
    assert q.shape[-1] == k.shape[-1] == v.shape[-1], "FlashAttention-2: one head dim"
    assert alibi_slopes is None, "This flash attention build does not support alibi."

    def one(qs, ks, vs):
        sq, sk = qs.shape[2], ks.shape[2]
        vis = fa_visible(sq, sk, is_causal, window_size_left, window_size_right)
        bias = fa_alibi(alibi_slopes, sq, sk) if alibi_slopes is not None else None
        o, lse = attend(qs, ks, vs, vis, scale, bias)
        return o, torch.where(torch.isneginf(lse), math.inf, lse)  # FA2: +inf on empty rows
    if cum_q is not None:
        o, lse = per_sequence(q, k, v, cum_q.tolist(), cum_k.tolist(), one)
    else:
        o, lse = one(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        o = o.transpose(1, 2)
    return o, lse, None, None, None


def fake_efficient_forward(q, k, v, bias, cu_q, cu_k, max_q, max_k, dropout, mask_type,
                           compute_lse=False, *, scale=None, seqlen_k=None, window_size=None):
    record("_efficient_attention_forward", q=tuple(q.shape), k=tuple(k.shape),
           v=tuple(v.shape), cu=cu_q is not None, causal=mask_type, bias=bias is not None)
    assert q.shape[2] == k.shape[2], "memory-efficient: one head count"
    assert compute_lse or not q.requires_grad, "LSE is not correctly aligned (the backward " \
        "reads the forward's lse)"
    assert bias is None or bias.stride(-2) % 16 == 0, "bias rows must be 16-aligned"

    def one(qs, ks, vs, b=None):
        sq, sk = qs.shape[2], ks.shape[2]
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        vis = None if mask_type == 0 else (j <= i if mask_type == 1 else j <= i + sk - sq)
        return attend(qs, ks, vs, vis, scale, b)
    if cu_q is not None:
        cq, ck = cu_q.tolist(), cu_k.tolist()
        outs, lses = [], []
        for s in range(len(cq) - 1):
            q0, q1, k0, k1 = cq[s], cq[s + 1], ck[s], ck[s + 1]
            bs = bias[:, :, q0:q1, k0:k1] if bias is not None else None
            o, lse = one(q[:, q0:q1].transpose(1, 2), k[:, k0:k1].transpose(1, 2),
                         v[:, k0:k1].transpose(1, 2), bs)
            outs.append(o.transpose(1, 2))
            lses.append(lse)
        o, lse = torch.cat(outs, 1), torch.cat(lses, 2)
    else:
        o, lse = one(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias)
        o = o.transpose(1, 2)
        pad = -(-lse.shape[-1] // 32) * 32  # the kernel pads lse rows to 32
        lse = torch.cat([lse, lse.new_full(lse.shape[:-1] + (pad - lse.shape[-1],), math.inf)],
                        -1)
    return o, lse, None, None, max_q, max_k


def fake_cudnn_forward(q, k, v, bias, cum_q, cum_k, max_q, max_k, compute_lse, dropout=0.0,
                       is_causal=False, debug=False, *, scale=None):
    record("_cudnn_attention_forward", q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
           cu=cum_q is not None, causal=is_causal, bias=bias is not None)
    assert compute_lse or not q.requires_grad, "the backward reads the forward's stats"

    def one(qs, ks, vs, b=None):
        sq, sk = qs.shape[2], ks.shape[2]
        vis = (torch.arange(sk)[None, :] <= torch.arange(sq)[:, None]) if is_causal else None
        return attend(qs, ks, vs, vis, scale, b)
    if cum_q is not None:
        cq, ck = cum_q.tolist(), cum_k.tolist()
        outs, lses = [], []
        for s in range(len(cq) - 1):
            q0, q1, k0, k1 = cq[s], cq[s + 1], ck[s], ck[s + 1]
            # A packed batch's bias is per sequence, padded: [B, 1, max_q, max_k].
            assert bias is None or bias.shape[0] == len(cq) - 1, "bias: [B, 1, max_q, max_k]"
            bs = bias[s:s + 1, :, :q1 - q0, :k1 - k0] if bias is not None else None
            o, lse = one(q[q0:q1].transpose(0, 1)[None], k[k0:k1].transpose(0, 1)[None],
                         v[k0:k1].transpose(0, 1)[None], bs)
            outs.append(o[0].transpose(0, 1))
            lses.append(lse[0])
        return (torch.cat(outs, 0), torch.cat(lses, 1)[..., None]) + (None,) * 7
    o, lse = one(q, k, v, bias)
    return (o, lse[..., None]) + (None,) * 7


# Which SDPA backend a call of the public function ran under: the one sdpa_kernel left enabled.
SDP_FLAGS = (("MATH", torch.backends.cuda.math_sdp_enabled),
             ("FLASH_ATTENTION", torch.backends.cuda.flash_sdp_enabled),
             ("EFFICIENT_ATTENTION", torch.backends.cuda.mem_efficient_sdp_enabled),
             ("CUDNN_ATTENTION", torch.backends.cuda.cudnn_sdp_enabled))


def sdp_enabled():
    on = [name for name, flag in SDP_FLAGS if flag()]
    return on[0] if len(on) == 1 else "+".join(on)


# True while a stand-in backend runs: the public function on CUDA's flash, memory-efficient or
# cuDNN backend is then fake_public_sdpa; otherwise PyTorch's own (math, CPU flash).
STAND_IN = [False]


def fake_public_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                     enable_gqa=False):
    """F.scaled_dot_product_attention on CUDA under sdpa_kernel([one fused backend]): the
    argument checks that backend's dispatch makes (sdp_utils.cpp: no zero-length sequence;
    flash: no attn_mask, is_causal only with Sq = Sk, one head dim up to 256; memory-efficient:
    head dims multiples of 8; cuDNN: head dims multiples of 8 up to 128, no Sk = 1), refusing
    as SDPA does ("No available kernel"), then is_causal top-left, a boolean or additive
    attn_mask, and CausalBias as its _dispatch runs it (lower-right: the flash kernel's causal
    flag)."""
    from torch.nn.attention.bias import CausalBias, CausalVariant
    sdp = sdp_enabled()
    cb = isinstance(attn_mask, CausalBias)
    record("scaled_dot_product_attention", q=tuple(q.shape), k=tuple(k.shape),
           v=tuple(v.shape), cu=False, causal=bool(is_causal) or cb,
           bias=attn_mask is not None and not cb, sdp=sdp)
    _, hq, sq, d = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[-1]

    def refuse(why):
        raise RuntimeError(f"No available kernel. Aborting execution. ({sdp}: {why})")
    if hk != hq and not enable_gqa:
        raise RuntimeError("The size of tensor a must match the size of tensor b (heads)")
    if sq == 0 or sk == 0:
        refuse("zero-length sequence")
    if sdp == "FLASH_ATTENTION":
        if attn_mask is not None and not cb:
            refuse("flash takes no attn_mask")
        if is_causal and sq != sk:
            refuse("is_causal with seqlen_q != seqlen_k")
        if not (d == k.shape[-1] == dv) or d > 256:
            refuse("one head dim up to 256")
    elif sdp == "EFFICIENT_ATTENTION":
        if d % 8 or dv % 8:
            refuse("head dims multiples of 8")
    elif sdp == "CUDNN_ATTENTION":
        if d % 8 or dv % 8 or d > 128 or dv > 128:
            refuse("head dims multiples of 8 up to 128")
        if sk == 1:
            refuse("key/value sequence length 1")
    else:
        raise AssertionError(f"the public function ran with SDPA backends {sdp} enabled: the "
                             "stand-in stands for one fused backend")
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    vis, bias = None, None
    if cb:
        vis = j <= i + (sk - sq if attn_mask.variant == CausalVariant.LOWER_RIGHT else 0)
    elif is_causal:
        vis = j <= i
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        vis = attn_mask
    elif attn_mask is not None:
        bias = attn_mask
    o, _ = attend(q, k, v, vis, scale if scale is not None else 1 / math.sqrt(d), bias)
    CALLS[-1]["out"] = o.transpose(1, 2).detach().clone()  # o in attest's layout
    return o


def fake_fa_module(convention):
    """A module with a `flash_attn_func` / `flash_attn_varlen_func` in FlashAttention-2's or
    FlashAttention-4's signature (flash_attn/flash_attn_interface.py;
    flash_attn/cute/interface.py), implementing their semantics."""
    m = types.ModuleType(f"fake_{convention}")

    def core(q, k, v, cu_q, cu_k, softmax_scale, causal, window_size, softcap, alibi_slopes):
        left, right = window_size
        if convention == "fa2":
            assert left is not None and right is not None, "FA2 windows are integers"
        else:
            assert (left is None or left >= 0) and (right is None or right >= 0), \
                "FA4: None is unbounded (-1 is not)"

        def one(qs, ks, vs):
            sq, sk = qs.shape[2], ks.shape[2]
            vis = fa_visible(sq, sk, causal, left, right)
            bias = fa_alibi(alibi_slopes, sq, sk) if alibi_slopes is not None else None
            o, lse = attend(qs, ks, vs, vis, softmax_scale, bias, softcap)
            return o, (torch.where(torch.isneginf(lse), math.inf, lse) if convention == "fa2"
                       else lse)
        if cu_q is not None:
            return per_sequence(q, k, v, cu_q.tolist(), cu_k.tolist(), one)
        o, lse = one(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2), lse

    if convention == "fa2":
        def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                            deterministic=False, return_attn_probs=False):
            record("flash_attn_func", q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
                   cu=False, causal=causal, window=window_size)
            o, lse = core(q, k, v, None, None, softmax_scale, causal, window_size, softcap,
                          alibi_slopes)
            return (o, lse, None) if return_attn_probs else o

        def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                   causal=False, window_size=(-1, -1), softcap=0.0,
                                   alibi_slopes=None, deterministic=False,
                                   return_attn_probs=False):
            record("flash_attn_varlen_func", q=tuple(q.shape), k=tuple(k.shape),
                   v=tuple(v.shape), cu=True, causal=causal, window=window_size)
            o, lse = core(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                          window_size, softcap, alibi_slopes)
            return (o, lse, None) if return_attn_probs else o
    else:
        def flash_attn_func(q, k, v, qv=None, softmax_scale=None, causal=False,
                            window_size=(None, None), softcap=0.0, deterministic=False,
                            return_lse=False):
            record("flash_attn_func", q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
                   cu=False, causal=causal, window=window_size)
            o, lse = core(q, k, v, None, None, softmax_scale, causal, window_size, softcap, None)
            return (o, lse) if return_lse else o

        def flash_attn_varlen_func(q, k, v, qv=None, cu_seqlens_q=None, cu_seqlens_k=None,
                                   max_seqlen_q=None, max_seqlen_k=None, softmax_scale=None,
                                   causal=False, window_size=(None, None), softcap=0.0,
                                   deterministic=False, return_lse=False):
            record("flash_attn_varlen_func", q=tuple(q.shape), k=tuple(k.shape),
                   v=tuple(v.shape), cu=True, causal=causal, window=window_size)
            o, lse = core(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal,
                          window_size, softcap, None)
            return (o, lse) if return_lse else o
    m.flash_attn_func = flash_attn_func
    m.flash_attn_varlen_func = flash_attn_varlen_func
    return m


# ---- The problems: each claimed feature alone and in pairs with GQA and varlen ----

def problems():
    docs = [[0] * 10 + [1] * 14 + [2] * 8] * 2
    p = tp.problem
    small = dict(seqlen_q=32, seqlen_k=32, head_dim=16, head_dim_v=16)
    return [
        ("plain", p(**small)),
        ("gqa 4:2", p(heads_q=4, **small)),
        ("batch 3", p(batch=3, **small)),
        ("causal bottom-right 24x40", p(causal=True, seqlen_q=24, seqlen_k=40, head_dim=16,
                                        head_dim_v=16)),
        ("causal bottom-right 40x24 (empty rows)",
         p(causal=True, seqlen_q=40, seqlen_k=24, head_dim=16, head_dim_v=16, heads_q=4)),
        ("causal top-left 24x40", p(causal=True, causal_align="top_left", seqlen_q=24,
                                    seqlen_k=40, head_dim=16, head_dim_v=16)),
        ("window (6, 2) gqa", p(window=[6, 2], heads_q=4, seqlen_q=24, seqlen_k=40,
                                head_dim=16, head_dim_v=16)),
        ("window (-1, 4) 40x24", p(window=[-1, 4], seqlen_q=40, seqlen_k=24, head_dim=16,
                                   head_dim_v=16)),
        ("softcap 5 causal", p(softcap=5.0, causal=True, **small)),
        ("alibi 24x40", p(alibi_slopes=[0.5, 0.125], seqlen_q=24, seqlen_k=40, head_dim=16,
                          head_dim_v=16)),
        ("varlen gqa", p(batch=3, heads_q=4, seqlen_q=20, seqlen_k=25, head_dim=16,
                         head_dim_v=16, cu_seqlens_q=[0, 12, 12, 32],
                         cu_seqlens_k=[0, 15, 22, 47])),
        ("varlen", p(batch=3, seqlen_q=20, seqlen_k=25, head_dim=16, head_dim_v=16,
                     cu_seqlens_q=[0, 12, 19, 39], cu_seqlens_k=[0, 15, 22, 47])),
        ("varlen causal top-left", p(batch=3, causal=True, causal_align="top_left",
                                     seqlen_q=20, seqlen_k=25, head_dim=16, head_dim_v=16,
                                     cu_seqlens_q=[0, 12, 19, 39],
                                     cu_seqlens_k=[0, 15, 22, 47])),
        ("varlen causal", p(batch=3, causal=True, seqlen_q=20, seqlen_k=25, head_dim=16,
                            head_dim_v=16, cu_seqlens_q=[0, 12, 12, 32],
                            cu_seqlens_k=[0, 15, 22, 47])),
        ("varlen window", p(batch=2, window=[3, 1], seqlen_q=20, seqlen_k=25, head_dim=16,
                            head_dim_v=16, cu_seqlens_q=[0, 12, 32], cu_seqlens_k=[0, 25, 45])),
        ("documents", p(document_ids_q=docs, document_ids_k=docs, **small)),
        ("prefix-lm causal", p(causal=True, prefix_lm=5, **small)),
        ("block-sparse", p(block_sparse={"block_q": 8, "block_k": 16,
                                         "blocks": [[0, 0], [1, 1], [2, 0], [3, 1]]}, **small)),
        ("Dv 8 != D 16", p(seqlen_q=32, seqlen_k=32, head_dim=16, head_dim_v=8)),
    ]


class Args:
    def __init__(self, backend, device="cpu", mask_form="bool", deterministic=False, njt=False):
        self.backend, self.device, self.dtype = backend, device, "bf16"
        self.mask_form, self.deterministic, self.caps = mask_form, deterministic, None
        self.njt = njt


def flex_recorded():
    b = tb.Flex(Args("flex"), "TRITON")
    fn = b.flex

    def wrapped(q, k, v, **kw):
        record("flex_attention", q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape),
               cu=kw.get("block_mask") is not None, bias=kw.get("block_mask") is not None)
        return fn(q, k, v, **kw)
    b.flex = wrapped
    return b


def make_backends():
    """(label, backend) pairs: the real CPU paths and the stand-in CUDA paths."""
    out = [("sdpa-math bool", tb.SdpaMath(Args("sdpa-math"))),
           ("sdpa-math additive", tb.SdpaMath(Args("sdpa-math", mask_form="additive"))),
           ("sdpa-flash (CPU, public)", tb.SdpaPublic(Args("sdpa-flash"), "sdpa-flash")),
           ("sdpa-flash+lse (CPU kernel)", tb.SdpaFlashLse(Args("sdpa-flash+lse"))),
           # Nested jagged tensors through the public function (its CPU math path takes no
           # is_causal: the claim, measured, is packed batches without masks).
           ("sdpa-math njt", tb.make(Args("sdpa-math", njt=True))),
           ("flex (eager)", flex_recorded())]
    # The public function on CUDA's fused backends, with its stand-in.
    for name in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        for form in ("bool", "additive"):
            out.append((f"{name} {form} (stand-in)", public_stand_in(name, form)))
    # The CUDA paths of the three aten ops, with the stand-ins.
    cuda = Args("sdpa-flash+lse", device="cuda")
    for cls, name in ((tb.SdpaFlashLse, "sdpa-flash+lse"),
                      (tb.SdpaEfficientLse, "sdpa-efficient+lse"),
                      (tb.SdpaCudnnLse, "sdpa-cudnn+lse")):
        b = cls.__new__(cls)
        tb.Backend.__init__(b, cuda)
        b.device = torch.device("cpu")  # tensors stay here; the code path is the CUDA one
        b.stand_in = True
        out.append((f"{name} (stand-in)", b))
    for conv in ("fa2", "fa4"):
        sys.modules[f"fake_{conv}"] = fake_fa_module(conv)
        out.append((f"fa:fake_{conv}", tb.FlashAttn(Args(f"fa:fake_{conv}:flash_attn_func"),
                                                    f"fake_{conv}", "flash_attn_func")))
    return out


def public_stand_in(name, form):
    """The public route `name` on CUDA, its calls going to fake_public_sdpa (tensors stay on
    the CPU; the code path is the CUDA one)."""
    b = tb.SdpaPublic(Args(name, mask_form=form), name)
    b.stand_in = True
    return b


def recording(api, fn):
    """The real CPU entry point, recording how it is called (SDPA layout [B, H, S, D]) and,
    for the public function, under which SDPA backend and what it returned."""
    def wrapped(q, k, v, *a, **kw):
        if api == "scaled_dot_product_attention" and STAND_IN[0] and sdp_enabled() != "MATH":
            return fake_public_sdpa(q, k, v, *a, **kw)
        mask = kw.get("attn_mask")
        causal = kw.get("is_causal", a[1] if len(a) > 1 else False)
        nested = getattr(q, "is_nested", False)

        def shape(x):  # a nested [B, H, j, D] as (B, H, its packed rows, D)
            return (x.size(0), x.size(1), x.transpose(1, 2).values().shape[0], x.size(3)) \
                if nested else \
                tuple(x.shape)
        record(api, q=shape(q), k=shape(k), v=shape(v), cu=nested, nested=nested,
               causal=causal, bias=mask is not None,
               **({"sdp": sdp_enabled()} if api == "scaled_dot_product_attention" else {}))
        out = fn(q, k, v, *a, **kw)
        if api == "scaled_dot_product_attention":
            # What the adapter must hand back: o in attest's layout, [B, S, H, Dv] or packed.
            CALLS[-1]["out"] = (out.transpose(1, 2).values() if nested else
                                out.transpose(1, 2)).detach().clone()
        return out
    return wrapped


def install_fakes():
    tb.ENTRY["scaled_dot_product_attention"] = recording(
        "scaled_dot_product_attention", torch.nn.functional.scaled_dot_product_attention)
    tb.ENTRY["_scaled_dot_product_flash_attention_for_cpu"] = recording(
        "_scaled_dot_product_flash_attention_for_cpu",
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu)
    tb.ENTRY["_flash_attention_forward"] = fake_flash_forward
    tb.ENTRY["_efficient_attention_forward"] = fake_efficient_forward
    tb.ENTRY["_cudnn_attention_forward"] = fake_cudnn_forward


def heads_of(shape, api):
    """(batch or None, rows, heads, head dim) of a recorded q/k/v shape in the API's layout:
    [B, H, S, D] for SDPA's layout, [B, S, H, D] or packed [T, H, D] for FlashAttention's
    (memory-efficient packed: [1, T, H, D])."""
    if api in ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
               "flex_attention") or (api == "_cudnn_attention_forward" and len(shape) == 4):
        return shape[0], shape[2], shape[1], shape[3]
    if len(shape) == 3:
        return None, shape[0], shape[1], shape[2]
    return shape[0], shape[1], shape[2], shape[3]


def call_shape_ok(p, c):
    """The recorded call received the whole problem as given (layout transposes aside)."""
    hq, hkv, d, dv = p["heads_q"], p["heads_kv"], p["head_dim"], p["head_dim_v"]
    if c.get("q") is None:
        return None
    bq, rq, nq, dq = heads_of(c["q"], c["api"])
    _, rk, nk, dk = heads_of(c["k"], c["api"])
    _, _, nv, dvv = heads_of(c["v"], c["api"])
    if nq != hq:
        return f"q heads changed ({nq}, problem {hq})"
    if nk != hkv or nv != hkv:
        return f"kv heads not passed as given ({nk}, problem Hkv {hkv}: repeated?)"
    if dq != d or dk != d or dvv != dv:
        return f"head dims changed (q {dq}, k {dk}, v {dvv}; problem D {d}, Dv {dv})"
    if c.get("nested"):  # nested jagged tensors: B sequences, their tokens packed
        total_q = p["cu_seqlens_q"][-1] if tb.is_varlen(p) else p["batch"] * p["seqlen_q"]
        total_k = p["cu_seqlens_k"][-1] if tb.is_varlen(p) else p["batch"] * p["seqlen_k"]
        if bq != p["batch"] or rq != total_q or rk != total_k:
            return f"batch not passed whole as nested tensors (q {c['q']}, batch {p['batch']})"
        return None
    if tb.is_varlen(p):
        if not c.get("cu"):  # flex: the packed batch is a document mask over one sequence
            return "packed batch not passed through cu_seqlens"
        if rq != p["cu_seqlens_q"][-1] or rk != p["cu_seqlens_k"][-1]:
            return "packed rows not passed whole"
    elif bq != p["batch"] or rq != p["seqlen_q"] or rk != p["seqlen_k"]:
        return f"batch not passed whole (q {c['q']}, batch {p['batch']})"
    return None


def same_bits(a, b):
    """Bit for bit the same tensor (NaNs included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check_backend(label, backend, verbose=True):
    STAND_IN[0] = getattr(backend, "stand_in", False)
    try:
        return check_backend_calls(label, backend, verbose)
    finally:
        STAND_IN[0] = False


def check_backend_calls(label, backend, verbose):
    failures = 0
    try:
        caps = backend.caps()
    except Exception as e:  # noqa: BLE001 - a backend that cannot state its claim fails
        print(f"{label:30s} FAIL: caps() raised {type(e).__name__}: {e}")
        return 1
    for name, p in problems():
        if tb.covers(caps, p) is not None:
            continue
        q, k, v, do = tp.inputs(p, torch.bfloat16, torch.device("cpu"))
        CALLS.clear()
        try:
            with backend.grad_mode():
                o, lse = backend.run(p, q, k, v, need_lse=caps.get("lse", True))
        except Exception as e:  # noqa: BLE001 - a claimed problem must be accepted
            failures += 1
            print(f"{label:30s} {name:40s} FAIL: claimed but refused: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120] if str(e) else ''}")
            continue
        fwd_calls = list(CALLS)
        ro, rl = tp.reference(p, *(x.double() for x in (q, k, v)))
        o_err = float((o.double() - ro).abs().max())
        problems_seen = []
        if not o_err <= 0.05:  # NaN fails too
            problems_seen.append(f"o err {o_err:.3g}")
        if not caps.get("lse", True) and lse is not None:
            problems_seen.append("an lse the API does not return (the adapter computed it)")
        for c in fwd_calls:
            if c["api"] == "scaled_dot_product_attention" and c.get("sdp") != backend.sdp:
                problems_seen.append(f"ran under SDPA backend {c.get('sdp')}, not {backend.sdp}")
        if len(fwd_calls) == 1 and "out" in fwd_calls[0] and \
                not same_bits(o.reshape(fwd_calls[0]["out"].shape), fwd_calls[0]["out"]):
            problems_seen.append("o is not the tensor the kernel returned (transposed back)")
        if lse is not None:
            fin = torch.isfinite(rl)
            lse_err = float((lse.double()[fin] - rl[fin]).abs().max()) if fin.any() else 0.0
            if not lse_err <= 2e-2:
                problems_seen.append(f"lse err {lse_err:.3g}")
        stand_in = bool(fwd_calls)
        if stand_in and len(fwd_calls) != 1:
            problems_seen.append(f"{len(fwd_calls)} kernel calls for one forward")
        for c in fwd_calls:
            why = call_shape_ok(p, c)
            if why:
                problems_seen.append(why)
            if tb.any_mask(p) and not (c.get("causal") or c.get("bias") or
                                       (c.get("window") not in (None, (None, None), (-1, -1)))):
                problems_seen.append("the mask was not passed to the kernel")
        if caps.get("backward"):
            qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
            CALLS.clear()
            with torch.enable_grad():
                o2, _ = backend.run(p, qg, kg, vg, need_lse=False)
                g = torch.autograd.grad(o2, (qg, kg, vg), grad_outputs=do)
            if stand_in and len(CALLS) != 1:
                problems_seen.append(f"{len(CALLS)} kernel calls for one backward")
            qd, kd, vd = (x.double().requires_grad_(True) for x in (q, k, v))
            rd, _ = tp.reference(p, qd, kd, vd)
            rg = torch.autograd.grad(rd, (qd, kd, vd), grad_outputs=do.double())
            g_err = max(float((a.double() - b).abs().max()) for a, b in zip(g, rg))
            if not g_err <= 0.1:
                problems_seen.append(f"grad err {g_err:.3g}")
        failures += bool(problems_seen)
        if verbose or problems_seen:
            print(f"{label:30s} {name:40s} {'FAIL: ' + '; '.join(problems_seen) if problems_seen else 'ok'}"
                  f"  ({backend.route})")
    return failures


def self_test():
    """Broken adapters that the checks above must catch."""
    caught = 0
    cuda = Args("sdpa-flash+lse", device="cuda")

    def stand_in_flash():
        b = tb.SdpaFlashLse.__new__(tb.SdpaFlashLse)
        tb.Backend.__init__(b, cuda)
        b.device = torch.device("cpu")
        return b

    # 1. Drops the window (a claimed feature not passed): window_of replaced where the adapter
    # reads it and where torch_backends_common's has_window does.
    b = stand_in_flash()
    real = tb.window_of
    tb.window_of = tbc.window_of = lambda p: [-1, -1]
    caught += check_backend("mutant: drops window", b, verbose=False) > 0
    tb.window_of = tbc.window_of = real
    # 2. Repeats kv heads (GQA emulated).
    b = stand_in_flash()
    b.run = repeating_kv(b.run)
    caught += check_backend("mutant: repeats kv heads", b, verbose=False) > 0
    # 3. Splits the batch (one call per batch entry).
    b = stand_in_flash()
    run2 = b.run

    def split(p, q, k, v, need_lse):
        if tb.is_varlen(p) or p["batch"] == 1:
            return run2(p, q, k, v, need_lse)
        parts = [run2(dict(p, batch=1, document_ids_q=None, document_ids_k=None),
                      q[i:i + 1], k[i:i + 1], v[i:i + 1], need_lse) for i in range(p["batch"])]
        o = torch.cat([x[0] for x in parts])
        lse = torch.cat([x[1] for x in parts]) if need_lse else None
        return o, lse
    b.run = split
    caught += check_backend("mutant: splits the batch", b, verbose=False) > 0
    return caught + self_test_public()


def repeating_kv(run):
    """A backend's run that repeats the kv heads of a GQA problem and calls the kernel as MHA:
    the adapter doing the kernel's work (docs/protocol.md "Adapters translate")."""
    def repeat_kv(p, q, k, v, need_lse):
        r = p["heads_q"] // p["heads_kv"]
        return run(dict(p, heads_kv=p["heads_q"]), q, k.repeat_interleave(r, -2),
                   v.repeat_interleave(r, -2), need_lse)
    return repeat_kv


def self_test_public():
    """Broken public routes (F.scaled_dot_product_attention under sdpa_kernel) that the checks
    must catch; returns how many were."""
    caught = 0
    # 4. Runs the math backend while naming the memory-efficient one: a route that passes every
    # accuracy check and judges the wrong kernel.
    b = public_stand_in("sdpa-efficient", "bool")

    b.context = lambda: tc.Invoke(tc.Attr("torch.nn.attention", "sdpa_kernel"),
                                  [tc.Attr("torch.nn.attention", "SDPBackend.MATH")])
    caught += check_backend("mutant: runs another backend", b, verbose=False) > 0
    # 5. Repeats kv heads instead of passing enable_gqa.
    b = public_stand_in("sdpa-cudnn", "bool")
    b.run = repeating_kv(b.run)
    caught += check_backend("mutant: public, repeats kv", b, verbose=False) > 0
    # 6. Calls the kernel, then returns attention it computed itself (in float64, rounded): as
    # accurate as the kernel or more, and not the kernel's answer.
    b = public_stand_in("sdpa-flash", "bool")
    run2 = b.run

    def own_answer(p, q, k, v, need_lse):
        run2(p, q, k, v, need_lse)
        o, _ = tp.reference(p, *(x.double() for x in (q, k, v)))
        return o.to(q.dtype), None
    b.run = own_answer
    caught += check_backend("mutant: returns its own o", b, verbose=False) > 0
    # 7. Computes an lse the public function does not return.
    b = public_stand_in("sdpa-efficient", "additive")
    run3 = b.run

    def own_lse(p, q, k, v, need_lse):
        o, _ = run3(p, q, k, v, need_lse)
        _, lse = tp.reference(p, *(x.double() for x in (q, k, v)))
        return o, lse.float()
    b.run = own_lse
    caught += check_backend("mutant: computes lse", b, verbose=False) > 0
    # 8. Claims packed batches, which the public function takes only as nested tensors.
    b = public_stand_in("sdpa-cudnn", "bool")
    real_caps = b.caps
    b.caps = lambda: dict(real_caps(), varlen=True)
    caught += check_backend("mutant: claims varlen", b, verbose=False) > 0
    return caught


def flex_mask_in_bounds():
    """FlexAttention's kernels evaluate mask_mod also where the answer is decided already: keys
    of another packed sequence and the padding of partial blocks (compiled, an out-of-range
    index into a captured table is a device-side assert). The mask_mod of flex_mods is called
    on the whole grid plus a block of padding on both axes, for a packed batch with block
    sparsity and for a padded batch with documents and block sparsity; eager CPU indexing
    raises on an index out of bounds. Its traced graph must also avoid what Inductor's CuteDSL
    code generator (flex-flash) cannot lower: clamping (`maximum`/`minimum`) and index
    division, which Inductor bounds with a `minimum`. Returns the number of failures."""
    common = dict(heads_q=2, heads_kv=2, head_dim=16, head_dim_v=16, dtype="bf16",
                  causal=True, causal_align="bottom_right", window=[24, 8], softcap=0.0,
                  alibi_slopes=None, prefix_lm=3,
                  block_sparse={"block_q": 16, "block_k": 16,
                                "blocks": [[0, 0], [1, 1], [2, 0]]})
    packed = dict(common, batch=3, seqlen_q=40, seqlen_k=37,
                  cu_seqlens_q=[0, 40, 45, 70], cu_seqlens_k=[0, 5, 42, 70])
    padded = dict(common, batch=2, seqlen_q=40, seqlen_k=37, cu_seqlens_q=None,
                  cu_seqlens_k=None,
                  document_ids_q=[[0] * 20 + [1] * 20, [0] * 10 + [2] * 30],
                  document_ids_k=[[0] * 2 + [1] * 35, [0] * 7 + [2] * 30])
    from torch.fx.experimental.proxy_tensor import make_fx
    banned = ("clamp", "maximum", "minimum", "div", "floor_divide")
    failures = 0
    for label, p in (("packed", packed), ("padded", padded)):
        mask_mod, _, _, sq, sk = tb.flex_mods(p, torch.device("cpu"))
        q_idx = torch.arange(sq + 256)[:, None]
        kv_idx = torch.arange(sk + 256)[None, :]
        zero = torch.zeros((), dtype=torch.int64)
        try:
            keep = torch.stack([mask_mod(torch.full((), b, dtype=torch.int64), zero, q_idx, kv_idx)
                                for b in range(1 if label == "packed" else p["batch"])])
        except IndexError as e:
            print(f"FAIL flex mask_mod ({label}) reads out of bounds on the padded grid: {e}")
            failures += 1
            continue
        if label == "packed":  # keys of another sequence never match
            seq_q, seq_k = (torch.repeat_interleave(torch.arange(p["batch"]),
                                                    torch.diff(torch.tensor(cu)))
                            for cu in (p["cu_seqlens_q"], p["cu_seqlens_k"]))
            if bool(keep[0, :sq, :sk][seq_q[:, None] != seq_k[None, :]].any()):
                print("FAIL flex mask_mod keeps a key of another packed sequence")
                failures += 1
        else:  # keys of another document never match
            dq, dk = (torch.tensor(p[k]) for k in ("document_ids_q", "document_ids_k"))
            if bool(keep[:, :sq, :sk][dq[:, :, None] != dk[:, None, :]].any()):
                print("FAIL flex mask_mod keeps a key of another document")
                failures += 1
        if bool(keep[:, sq:, :].any()) and label == "packed":
            print("FAIL flex mask_mod keeps a padding query of the packed axis")
            failures += 1
        one = torch.zeros((1,), dtype=torch.int64)  # 1-d: a 0-d index would be read as an int
        graph = make_fx(lambda b, h, q, k: mask_mod(b, h, q, k))(one, one, one, one)
        ops = sorted({str(n.target) for n in graph.graph.nodes if n.op == "call_function"})
        bad = [o for o in ops if any(x in o for x in banned)]
        if bad:
            print(f"FAIL flex mask_mod ({label}) uses {bad}: the CuteDSL code generator has none")
            failures += 1
    if not failures:
        print("ok   flex mask_mod: in bounds on the padded grids, no clamp or index division")
    return failures


def main():
    torch.manual_seed(0)
    install_fakes()
    failures = 0
    for label, backend in make_backends():
        failures += check_backend(label, backend)
    failures += flex_mask_in_bounds()
    caught = self_test()
    print(f"self-test: {caught} of 8 broken adapters caught")
    if caught != 8:
        failures += 1
    print(f"torch_adapter_test: {'FAIL' if failures else 'ok'} ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
