"""Python attention functions the package's tests check (python/tests/run_tests.py): plain
PyTorch in SDPA's calling convention, one correct and one with a seeded bug."""

import torch


def eager_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """Attention written out in PyTorch (softmax of scaled scores), in float32."""
    if enable_gqa and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else s + attn_mask.float()
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no visible key: o = 0
    return (p @ v.float()).to(q.dtype)


def sdpa_scale_bug(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The seeded bug: the softmax scale dropped on the masked path."""
    return eager_sdpa(q, k, v, attn_mask, is_causal, 1.0 if attn_mask is not None else scale,
                      enable_gqa)


def strides_ignored(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """The seeded bug of a kernel that assumes contiguous inputs: it reads each tensor's
    storage with row-major strides, whatever strides it was handed (FlashAttention #2665's
    class)."""
    def dense(x):
        strides, n = [], 1
        for size in reversed(x.shape):
            strides.insert(0, n)
            n *= size
        return torch.as_strided(x, x.shape, strides, x.storage_offset())
    return eager_sdpa(dense(q), dense(k), dense(v), attn_mask, is_causal, scale, enable_gqa)


def raises(q, k, v, **kw):
    raise RuntimeError("deliberate failure in the kernel")


def fake_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         return_attn_probs=False):
    """A FlashAttention-2-style flash_attn_func in eager PyTorch (q [B, Sq, H, D], fewer kv
    heads for GQA, causal aligned bottom-right, lse [B, H, Sq] with +inf on empty rows as
    flash-attention's softmax_lse), for the api="flash_attn" convention on a CPU."""
    hq, hkv = q.shape[2], k.shape[2]
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    kt = kt.repeat_interleave(hq // hkv, dim=1)
    vt = vt.repeat_interleave(hq // hkv, dim=1)
    s = (qt @ kt.transpose(-2, -1)) * softmax_scale
    if causal:
        sq, sk = s.shape[-2:]
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        s = s.masked_fill(j > i + (sk - sq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    o = (p @ vt).transpose(1, 2).to(q.dtype)
    lse = lse.masked_fill(torch.isneginf(lse), float("inf"))
    return (o, lse, None) if return_attn_probs else o


def sdpa_float64(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """A correct function: PyTorch's math SDPA on float64 copies of the inputs, o (and through
    autograd the gradients) rounded once to the inputs' dtype. What an exported repro.py is
    pointed at to show that it exits 0 once the finding is gone (python/tests/test_export.py)."""
    from torch.nn.attention import sdpa_kernel, SDPBackend
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.double()
    with sdpa_kernel([SDPBackend.MATH]):
        o = torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), attn_mask=attn_mask, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa)
    return o.to(q.dtype)


def flash_attn_scale_bug(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                         return_attn_probs=False):
    """The seeded bug of a flash_attn_func: softmax_scale ignored (1 used)."""
    return fake_flash_attn_func(q, k, v, dropout_p, 1.0, causal, return_attn_probs)
