"""A first tiled attention kernel in plain PyTorch, on the CPU, with the shape limits such a
kernel has (docs/byok.md "Bring your own kernel").

The forward walks 64-query x 64-key tiles with an online softmax (FlashAttention-2's loop:
a running row maximum m, a running sum l, the output accumulator rescaled by exp(m_old - m_new)
whenever the maximum grows), in fp32 on bf16 or f16 inputs, and writes o in the input dtype and
lse = m + log(l) in fp32. The backward is an explicit tiled one (FlashAttention-2's: P
recomputed from the saved lse, D = rowsum(dO * O), dS = P * (dP - D)) rather than autograd
through the forward loop, because
  - it is the backward a GPU kernel has to be written as (examples/triton_attention.py is the
    same algorithm), so this file is its readable model;
  - autograd through the loop would keep every tile's scores and rescaled accumulators alive
    (O(Sq * Sk) memory, what tiling is meant to avoid) and differentiate the max and rescale
    chain, whose terms cancel only up to rounding;
  - attest's `consistency` check (docs/checks.md) then tests something: that a separately
    written backward differentiates the forward that ran. Autograd through the forward would
    pass it by construction.

Limits, as a kernel author would first write them: Sq = Sk, lengths a multiple of 64 (no
partial tiles), head dims 16..256 in powers of two with Dv = D, causal or no mask, as many kv
heads as query heads (no GQA). Declared to attest as `CAPS` ("shapes": kernels/shape_limits.h),
so that the suites move their rows inside them; a problem outside them is refused with
`Unsupported`, which attest counts as an honest refusal.

    import attest, tiled_attention_cpu as k
    attest.check(k.attention, api="attest", caps=k.CAPS, suite="gate", device="cpu")
"""

import math

import torch

try:  # attest's honest refusal (docs/python.md); any exception where attest is absent
    from attest import Unsupported
except ImportError:
    class Unsupported(ValueError):
        pass

BLOCK = 64
HEAD_DIMS = (16, 32, 64, 128, 256)

# The claim (docs/protocol.md "Capabilities"), merged into api="attest"'s defaults: nothing
# else (no window, softcap, ALiBi, varlen, documents, GQA).
CAPS = {"causal": True, "head_dims": list(HEAD_DIMS), "head_dims_v": list(HEAD_DIMS),
        "same_head_dim_v": True, "deterministic": True,
        "shapes": {"seqlen_q_multiple": BLOCK, "seqlen_k_multiple": BLOCK,
                   "equal_seqlens": True}}


def check_shapes(q, k, v):
    """Raises Unsupported for a problem outside the limits above."""
    b, h, sq, d = q.shape
    sk, hk, dv = k.shape[2], k.shape[1], v.shape[-1]
    if sq != sk or sq % BLOCK:
        raise Unsupported(f"Sq {sq}, Sk {sk}: lengths must be equal multiples of {BLOCK}")
    if d not in HEAD_DIMS or dv != d:
        raise Unsupported(f"head dims {d}/{dv}: one of {HEAD_DIMS} for q, k and v")
    if hk != h:
        raise Unsupported(f"{h} query heads, {hk} kv heads: MHA only")


def _upper(n):
    """True above the diagonal of an n x n tile: keys a query may not see on a diagonal tile."""
    return torch.ones(n, n, dtype=torch.bool).triu(1)


def mask_diagonal_tile(s):
    """A diagonal tile's scores with the future keys (j > i) hidden. Off-diagonal tiles need no
    mask: a causal loop visits only key tiles at or before the query tile."""
    return s.masked_fill(_upper(s.shape[-1]), -math.inf)


def forward(q, k, v, scale, causal):
    """(o, lse) for q, k, v [B, H, S, D]: o in the input dtype, lse [B, H, S] in fp32."""
    b, h, s, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
    for i in range(0, s, BLOCK):
        qi = q[:, :, i:i + BLOCK].float()
        m = torch.full((b, h, BLOCK), -math.inf, device=q.device)
        l = torch.zeros(b, h, BLOCK, device=q.device)
        acc = torch.zeros(b, h, BLOCK, d, device=q.device)
        for j in range(0, i + BLOCK if causal else s, BLOCK):
            sc = qi @ k[:, :, j:j + BLOCK].float().transpose(-1, -2) * scale
            if causal and j == i:
                sc = mask_diagonal_tile(sc)
            m_new = torch.maximum(m, sc.amax(-1))  # finite: every row sees a key of tile 0
            alpha = torch.exp(m - m_new)           # 0 on the first tile (m = -inf)
            p = torch.exp(sc - m_new[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ v[:, :, j:j + BLOCK].float()
            m = m_new
        o[:, :, i:i + BLOCK] = (acc / l[..., None]).to(q.dtype)
        lse[:, :, i:i + BLOCK] = m + torch.log(l)
    return o, lse


def backward(q, k, v, o, lse, do, scale, causal):
    """(dq, dk, dv) in the input dtype: one pass per key tile over the query tiles that see
    it, P recomputed from lse, dq accumulated across key tiles in fp32."""
    b, h, s, d = q.shape
    delta = (do.float() * o.float()).sum(-1)  # D = rowsum(dO * O), O as the forward wrote it
    dq = torch.zeros(b, h, s, d, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for j in range(0, s, BLOCK):
        kj, vj = k[:, :, j:j + BLOCK].float(), v[:, :, j:j + BLOCK].float()
        dk_acc = torch.zeros(b, h, BLOCK, d, device=q.device)
        dv_acc = torch.zeros(b, h, BLOCK, d, device=q.device)
        for i in range(j if causal else 0, s, BLOCK):
            qi, doi = q[:, :, i:i + BLOCK].float(), do[:, :, i:i + BLOCK].float()
            sc = qi @ kj.transpose(-1, -2) * scale
            if causal and j == i:
                sc = mask_diagonal_tile(sc)
            p = torch.exp(sc - lse[:, :, i:i + BLOCK, None])
            dv_acc += p.transpose(-1, -2) @ doi
            ds = p * (doi @ vj.transpose(-1, -2) - delta[:, :, i:i + BLOCK, None])
            dq[:, :, i:i + BLOCK] += ds @ kj * scale
            dk_acc += ds.transpose(-1, -2) @ qi * scale
        dk[:, :, j:j + BLOCK], dv[:, :, j:j + BLOCK] = dk_acc.to(k.dtype), dv_acc.to(v.dtype)
    return dq.to(q.dtype), dk, dv


class TiledAttention(torch.autograd.Function):
    """forward() and backward() above as one differentiable op; lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        o, lse = forward(q, k, v, scale, causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.scale, ctx.causal = scale, causal
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        return (*backward(q, k, v, o, lse, do.contiguous(), ctx.scale, ctx.causal), None, None)


def tiled_attention(q, k, v, causal=False, scale=None):
    """The kernel's own API: q, k, v [B, H, S, D] -> (o [B, H, S, D], lse [B, H, S])."""
    check_shapes(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return TiledAttention.apply(q, k, v, scale, bool(causal))


def attention(problem, q, k, v):
    """attest's calling convention (api="attest", docs/python.md): the problem object and
    q, k, v in attest's layout [B, S, H, D]; returns (o [B, S, H, D], lse [B, H, S]). With
    Sq = Sk the two causal alignments are the same mask, so `causal_align` needs no reading."""
    o, lse = tiled_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                             causal=problem.get("causal"), scale=problem.get("scale"))
    return o.transpose(1, 2), lse
