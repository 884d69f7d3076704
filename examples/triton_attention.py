"""A Triton attention kernel, forward and backward, with the shape limits of a first tiled
kernel (docs/byok.md "Bring your own kernel"; examples/tiled_attention_cpu.py is the same
algorithm in plain PyTorch).

One tile size, BLOCK = 64, for queries and keys, and no boundary masks: Sq = Sk, a multiple of
64; head dims 16, 32, 64, 128 with Dv = D; causal or no mask; MHA; bf16 or f16 inputs, fp32
accumulation. Tensors in attest's layout [B, S, H, D], contiguous; lse [B, H, S] in fp32.

  forward   one program per (64-query tile, batch x head): online softmax over the key tiles
            in base 2 (scores scaled by scale * log2(e) once, exp2), P rounded to the input
            dtype before P @ V (what tensor cores take), o = acc / l, lse = (m + log2 l) ln 2.
            Causal: the key tiles before the diagonal unmasked, the diagonal tile masked.
  backward  FlashAttention-2's split into three kernels, none with atomics, so that repeat runs
            are bitwise equal: D = rowsum(dO * O); dK and dV, one program per key tile walking
            the query tiles that see it; dQ, one program per query tile walking its key tiles.
            P is recomputed from lse; P and dS are rounded to the input dtype before their
            products, as in the forward.

Triton compiles it for the GPU; with TRITON_INTERPRET=1 set before this module is imported it
runs on CPU tensors in Triton's interpreter (slowly: for verification on small problems).

    import attest, triton_attention as k
    attest.check(k.attention, api="attest", caps=k.CAPS, dtype="bf16", device="cuda")
"""

import math

import torch
import triton
import triton.language as tl

try:  # attest's honest refusal: the package's, or the exec workers' (tools/workers/)
    from attest import Unsupported
except ImportError:
    try:
        from attest_worker import Unsupported
    except ImportError:
        class Unsupported(ValueError):
            pass


def _fix_interpreter_loop_bounds():
    """Triton 3.6's interpreter turns a loop bound held in a tensor (`range(0, end, BLOCK)`
    with `end` from program_id) into a Python int by int() of a one-element array, which
    NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"). Triton's
    main branch takes the array's element first (python/triton/runtime/interpreter.py,
    `_patch_lang_tensor`); this does the same here, right with any NumPy. Interpreter only:
    compiled kernels never reach it."""
    from triton.runtime import interpreter
    patch = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))
    interpreter._patch_lang_tensor = patch_lang_tensor


if triton.knobs.runtime.interpret:
    _fix_interpreter_loop_bounds()

BLOCK = 64
HEAD_DIMS = (16, 32, 64, 128)
LOG2E = 1.4426950408889634

# The claim (docs/protocol.md "Capabilities"); the dtype is the one attest is told to run
# (attest.check's dtype=, torch_worker.py's --dtype), bf16 or f16.
CAPS = {"causal": True, "head_dims": list(HEAD_DIMS),
        "head_dims_v": list(HEAD_DIMS), "same_head_dim_v": True, "deterministic": True,
        "shapes": {"seqlen_q_multiple": BLOCK, "seqlen_k_multiple": BLOCK,
                   "equal_seqlens": True}}
# The same claim through flash_attn_func below and torch_worker.py's fa: adapter, whose
# FlashAttention convention claims GQA (tools/workers/torch_backends_fa.py FlashAttn.caps).
FLASH_ATTN_CAPS = {**CAPS, "gqa": False}


@triton.jit
def _tile(base, b, h, start, S, H, D: tl.constexpr, BLOCK: tl.constexpr):
    """Pointers to rows start..start+BLOCK of head h, batch b of a contiguous [B, S, H, D]."""
    rows = (b * S + start + tl.arange(0, BLOCK)).to(tl.int64)
    return base + (rows[:, None] * H + h) * D + tl.arange(0, D)[None, :]


@triton.jit
def _row_stats(base, b, h, start, S, H, BLOCK: tl.constexpr):
    """Pointers to rows start..start+BLOCK of a contiguous [B, H, S] (lse, D)."""
    return base + ((b * H + h) * S).to(tl.int64) + start + tl.arange(0, BLOCK)


@triton.jit
def _fwd_step(q, k_ptrs, v_ptrs, m, l, acc, start_m, start_n, qk_scale,
              BLOCK: tl.constexpr, DIAGONAL: tl.constexpr):
    """One key tile of the online softmax, in base 2: (m, l, acc) updated."""
    k = tl.load(k_ptrs)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if DIAGONAL:
        offs_m = start_m + tl.arange(0, BLOCK)
        offs_n = start_n + tl.arange(0, BLOCK)
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, -float("inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l = l * alpha + tl.sum(p, 1)
    v = tl.load(v_ptrs)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l, acc


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, S, H, qk_scale,
                D: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    q = tl.load(_tile(Q, b, h, start_m, S, H, D, BLOCK))
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, D], tl.float32)
    end = start_m if CAUSAL else S
    for start_n in range(0, end, BLOCK):
        m, l, acc = _fwd_step(q, _tile(K, b, h, start_n, S, H, D, BLOCK),
                              _tile(V, b, h, start_n, S, H, D, BLOCK), m, l, acc, start_m,
                              start_n, qk_scale, BLOCK, False)
    if CAUSAL:
        m, l, acc = _fwd_step(q, _tile(K, b, h, start_m, S, H, D, BLOCK),
                              _tile(V, b, h, start_m, S, H, D, BLOCK), m, l, acc, start_m,
                              start_m, qk_scale, BLOCK, True)
    o = acc / l[:, None]
    tl.store(_tile(O, b, h, start_m, S, H, D, BLOCK), o.to(O.dtype.element_ty))
    tl.store(_row_stats(LSE, b, h, start_m, S, H, BLOCK), (m + tl.log2(l)) * 0.6931471805599453)


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, S, H, D: tl.constexpr, BLOCK: tl.constexpr):
    """D = rowsum(dO * O) in fp32, O as the forward wrote it."""
    start_m = tl.program_id(0) * BLOCK
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    o = tl.load(_tile(O, b, h, start_m, S, H, D, BLOCK)).to(tl.float32)
    do = tl.load(_tile(DO, b, h, start_m, S, H, D, BLOCK)).to(tl.float32)
    tl.store(_row_stats(DELTA, b, h, start_m, S, H, BLOCK), tl.sum(o * do, 1))


@triton.jit
def _bwd_dkdv_step(k, v, dk, dv, Q, DO, LSE, DELTA, b, h, start_m, start_n, S, H, qk_scale,
                   D: tl.constexpr, BLOCK: tl.constexpr, DIAGONAL: tl.constexpr):
    """One query tile's contribution to a key tile's dK, dV, in the transposed frame
    (rows: keys, columns: queries)."""
    q = tl.load(_tile(Q, b, h, start_m, S, H, D, BLOCK))
    do = tl.load(_tile(DO, b, h, start_m, S, H, D, BLOCK))
    lse2 = tl.load(_row_stats(LSE, b, h, start_m, S, H, BLOCK)) * 1.4426950408889634
    delta = tl.load(_row_stats(DELTA, b, h, start_m, S, H, BLOCK))
    s_t = tl.dot(k, tl.trans(q)) * qk_scale
    if DIAGONAL:
        offs_m = start_m + tl.arange(0, BLOCK)
        offs_n = start_n + tl.arange(0, BLOCK)
        s_t = tl.where(offs_m[None, :] >= offs_n[:, None], s_t, -float("inf"))
    p_t = tl.exp2(s_t - lse2[None, :])
    dv = tl.dot(p_t.to(do.dtype), do, dv)
    dp_t = tl.dot(v, tl.trans(do))
    ds_t = p_t * (dp_t - delta[None, :])
    dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, S, H, qk_scale, sm_scale,
                     D: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    k = tl.load(_tile(K, b, h, start_n, S, H, D, BLOCK))
    v = tl.load(_tile(V, b, h, start_n, S, H, D, BLOCK))
    dk = tl.zeros([BLOCK, D], tl.float32)
    dv = tl.zeros([BLOCK, D], tl.float32)
    if CAUSAL:  # the diagonal tile masked; the query tiles after it see all of this tile
        dk, dv = _bwd_dkdv_step(k, v, dk, dv, Q, DO, LSE, DELTA, b, h, start_n, start_n, S, H,
                                qk_scale, D, BLOCK, True)
        begin = start_n + BLOCK
    else:
        begin = 0
    for start_m in range(begin, S, BLOCK):
        dk, dv = _bwd_dkdv_step(k, v, dk, dv, Q, DO, LSE, DELTA, b, h, start_m, start_n, S, H,
                                qk_scale, D, BLOCK, False)
    tl.store(_tile(DK, b, h, start_n, S, H, D, BLOCK), (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(_tile(DV, b, h, start_n, S, H, D, BLOCK), dv.to(DV.dtype.element_ty))


@triton.jit
def _bwd_dq_step(q, do, lse2, delta, dq, K, V, b, h, start_m, start_n, S, H, qk_scale,
                 D: tl.constexpr, BLOCK: tl.constexpr, DIAGONAL: tl.constexpr):
    """One key tile's contribution to a query tile's dQ."""
    k = tl.load(_tile(K, b, h, start_n, S, H, D, BLOCK))
    v = tl.load(_tile(V, b, h, start_n, S, H, D, BLOCK))
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if DIAGONAL:
        offs_m = start_m + tl.arange(0, BLOCK)
        offs_n = start_n + tl.arange(0, BLOCK)
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, -float("inf"))
    p = tl.exp2(s - lse2[:, None])
    ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
    return tl.dot(ds.to(k.dtype), k, dq)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, S, H, qk_scale, sm_scale,
                   D: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    q = tl.load(_tile(Q, b, h, start_m, S, H, D, BLOCK))
    do = tl.load(_tile(DO, b, h, start_m, S, H, D, BLOCK))
    lse2 = tl.load(_row_stats(LSE, b, h, start_m, S, H, BLOCK)) * 1.4426950408889634
    delta = tl.load(_row_stats(DELTA, b, h, start_m, S, H, BLOCK))
    dq = tl.zeros([BLOCK, D], tl.float32)
    end = start_m if CAUSAL else S
    for start_n in range(0, end, BLOCK):
        dq = _bwd_dq_step(q, do, lse2, delta, dq, K, V, b, h, start_m, start_n, S, H, qk_scale,
                          D, BLOCK, False)
    if CAUSAL:
        dq = _bwd_dq_step(q, do, lse2, delta, dq, K, V, b, h, start_m, start_m, S, H, qk_scale,
                          D, BLOCK, True)
    tl.store(_tile(DQ, b, h, start_m, S, H, D, BLOCK), (dq * sm_scale).to(DQ.dtype.element_ty))


def check_shapes(q, k, v):
    """Raises Unsupported for a problem outside the limits (q, k, v [B, S, H, D])."""
    b, sq, h, d = q.shape
    sk, hk, dv = k.shape[1], k.shape[2], v.shape[-1]
    if sq != sk or sq % BLOCK:
        raise Unsupported(f"Sq {sq}, Sk {sk}: lengths must be equal multiples of {BLOCK}")
    if d not in HEAD_DIMS or dv != d:
        raise Unsupported(f"head dims {d}/{dv}: one of {HEAD_DIMS} for q, k and v")
    if hk != h:
        raise Unsupported(f"{h} query heads, {hk} kv heads: MHA only")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise Unsupported(f"dtype {q.dtype}: bf16 or f16")


class TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal):
        q, k, v = (x.contiguous() for x in (q, k, v))
        b, s, h, d = q.shape
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
        if s and b * h:  # a grid with no programs is not launched
            _fwd_kernel[(s // BLOCK, b * h)](q, k, v, o, lse, s, h, scale * LOG2E, D=d,
                                             BLOCK=BLOCK, CAUSAL=causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.scale, ctx.causal = scale, causal
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        do = do.contiguous()
        b, s, h, d = q.shape
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if s and b * h:
            grid = (s // BLOCK, b * h)
            delta = torch.empty_like(lse)
            _bwd_delta_kernel[grid](o, do, delta, s, h, D=d, BLOCK=BLOCK)
            args = (s, h, ctx.scale * LOG2E, ctx.scale)
            _bwd_dkdv_kernel[grid](q, k, v, do, lse, delta, dk, dv, *args, D=d, BLOCK=BLOCK,
                                   CAUSAL=ctx.causal)
            _bwd_dq_kernel[grid](q, k, v, do, lse, delta, dq, *args, D=d, BLOCK=BLOCK,
                                 CAUSAL=ctx.causal)
        return dq, dk, dv, None, None


def triton_attention(q, k, v, causal=False, scale=None):
    """The kernel's own API: q, k, v [B, S, H, D] -> (o [B, S, H, D], lse [B, H, S])."""
    check_shapes(q, k, v)
    if triton.knobs.runtime.interpret and q.dtype == torch.bfloat16:
        raise RuntimeError("Triton's interpreter does not compute in bfloat16 (its tl.dot "
                           "multiplies the stored bf16 codes as integers, its casts to bf16 "
                           "truncate; triton-lang.org 'Debugging Triton'): use f16 there")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return TritonAttention.apply(q, k, v, scale, bool(causal))


def attention(problem, q, k, v):
    """attest's calling convention (api="attest", docs/python.md): q, k, v are already in this
    kernel's layout. With Sq = Sk both causal alignments are the same mask."""
    return triton_attention(q, k, v, causal=problem.get("causal"), scale=problem.get("scale"))


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, return_attn_probs=False):
    """FlashAttention-2's calling convention, for attest's exec worker without the Python
    package (`tools/workers/torch_worker.py --backend fa:triton_attention:flash_attn_func`,
    what tools/device/byok_triton_gate.sh runs on a GPU host): (o, lse, None) or o."""
    o, lse = triton_attention(q, k, v, causal=causal, scale=softmax_scale)
    return (o, lse, None) if return_attn_probs else o


def reference(q, k, v, causal=False, scale=None):
    """float64 attention (o, lse) on [B, S, H, D], for checking the kernel by hand."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool,
                                     device=s.device).triu(1), -math.inf)
    lse = torch.logsumexp(s, -1)
    return (torch.exp(s - lse[..., None]) @ v).transpose(1, 2), lse
