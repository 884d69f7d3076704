"""CPU stand-ins for kernels that run on CUDA only, for python/tests/export_test.py: the exported
repro.py of a GPU-only kernel is pointed at them with `--fn standins:NAME --path python/tests`.
Each correct stand-in implements its API's documented semantics in float32
(tools/workers/torch_adapter_test.py, whose stand-ins these are); each `*_bug` one seeds the
symptom of a finding of docs/findings/ into it, so that the script's exit status can be seen
to follow the function it calls: 1 on the seeded bug, 0 on the correct stand-in.
standin_torch_worker.py installs the seeded ones in the adapters' place, so that `attest repro
--export` finds the finding and renders the call."""

import functools
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "workers")
if WORKERS not in sys.path:
    sys.path.insert(0, WORKERS)

import torch  # noqa: E402
from torch.nn.attention.flex_attention import flex_attention as _flex  # noqa: E402

import torch_adapter_test as tat  # noqa: E402

efficient_forward = tat.fake_efficient_forward
cudnn_forward = tat.fake_cudnn_forward
flash_forward = tat.fake_flash_forward
FA4 = tat.fake_fa_module("fa4")
fa4_func = FA4.flash_attn_func
fa4_varlen_func = FA4.flash_attn_varlen_func


def efficient_lse_zero_bug(*args, **kwargs):
    """K3's symptom: lse = 0 on a row that sees no key (-inf expected)."""
    out = list(efficient_forward(*args, **kwargs))
    out[1] = torch.where(torch.isneginf(out[1]), torch.zeros_like(out[1]), out[1])
    return tuple(out)


def cudnn_none_bug(q, k, v, *args, **kwargs):
    """K12's symptom: no output tensor (None) for Sq = Sk = 0."""
    out = list(cudnn_forward(q, k, v, *args, **kwargs))
    if q.shape[-2] == 0 and k.shape[-2] == 0:
        out[0] = None
    return tuple(out)


def cpu_flash_lse_bug(*args, **kwargs):
    """PyTorch's CPU flash kernel with K9's symptom seeded: lse times ln 2."""
    out = list(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*args, **kwargs))
    out[1] = out[1] * math.log(2.0)
    return tuple(out)


def flex_eager(*args, kernel_options=None, **kwargs):
    """FlexAttention's eager path (its reference on a CPU), which takes no BACKEND option: the
    correct stand-in for a compiled flex_attention call (pass the script --no-wrap)."""
    return _flex(*args, **kwargs)


def flex_dense(q, k, v, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
               return_aux=None, kernel_options=None):
    """flex_attention's semantics in plain float32 PyTorch with autograd (FlexAttention's
    eager path on a CPU has no backward): score_mod and the block mask's mask_mod evaluated
    on broadcast index tensors, GQA by repeated kv heads, empty rows o = 0, lse = -inf."""
    from torch.nn.attention.flex_attention import AuxOutput
    b_, hq, sq, _ = q.shape
    sk = k.shape[2]
    r = hq // k.shape[1]
    kk, vv = (x.float().repeat_interleave(r, 1) for x in (k, v))
    s = (q.float() @ kk.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    b = torch.arange(b_)[:, None, None, None]
    h = torch.arange(hq)[None, :, None, None]
    i = torch.arange(sq)[None, None, :, None]
    j = torch.arange(sk)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, h, i, j)
    if block_mask is not None:
        s = s.masked_fill(~block_mask.mask_mod(b, h, i, j).expand(s.shape), -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    o = (p @ vv).to(q.dtype)
    return (o, AuxOutput(lse=lse)) if return_aux is not None and return_aux.lse else o


def flex_lse_ln2_bug(*args, **kwargs):
    """K9's symptom: flex_attention's lse times ln 2."""
    out = flex_eager(*args, **kwargs)
    if isinstance(out, tuple) and kwargs.get("return_aux") is not None:
        aux = type(out[1])(lse=out[1].lse * math.log(2.0))
        return out[0], aux
    return out


@functools.wraps(fa4_func)  # FlashAttention-4's signature (the adapter reads it)
def fa4_gqa_bug(q, k, v, *args, **kwargs):
    """K8's symptom, roughly: under GQA the keys past the first 64 get no gradient (dk, dv
    zero there)."""
    if k.shape[2] < q.shape[2] and k.shape[1] > 64:
        k = torch.cat([k[:, :64], k[:, 64:] * 0], 1)
        v = torch.cat([v[:, :64], v[:, 64:] * 0], 1)
    return fa4_func(q, k, v, *args, **kwargs)
