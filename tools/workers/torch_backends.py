"""The attention kernels tools/workers/torch_worker.py puts under attest's checks, one class per
backend, each calling its kernel's own entry point once per request with the whole problem.

The rule every class follows (docs/protocol.md "Adapters"): an adapter translates layouts and
declares capabilities; it never does the kernel's work. So a backend here
  - passes the full batch, and packed variable-length batches through the kernel's own
    `cu_seqlens` entry (or declares no varlen);
  - passes GQA as the kernel takes it (fewer kv heads; never repeated kv heads);
  - passes every mask through the API's own mask argument (`is_causal`, `window_size`,
    `attn_mask`/`attn_bias`, `custom_mask_type`, a FlexAttention `mask_mod`/`BlockMask`, a
    FlashAttention-4 CuTe `mask_mod`), built from the problem's rules
    (reference/problem/mask.h; docs/semantics.md), never applied to the outputs;
  - returns o, lse and the gradients exactly as the kernel wrote them (empty rows included;
    only transposes and views between layouts), head dims as given;
  - refuses (Unsupported) only what its capabilities do not claim. A claimed feature that the
    API then refuses raises, and attest reports it as a kernel error: a finding.

Capabilities follow what each API accepts on PyTorch 2.11 (its op schemas in
torch/include/ATen/ops/*_ops.h, the kernels' argument checks) and are re-measured on the GPU by
tools/workers/torch_probe.py, which calls every entry point with every feature
(docs/gpu-results.md "What each API accepts").
"""

import inspect
import math

import numpy as np
import torch
import torch.nn.functional as F

import attest_worker as aw

# ---- The kernels' entry points ----

# Looked up at each call, so that tools/workers/torch_adapter_test.py can stand in for the
# CUDA-only ones on a CPU and record how each is called.
ENTRY = {}


def entry(name):
    if name in ENTRY:
        return ENTRY[name]
    if name == "scaled_dot_product_attention":
        return F.scaled_dot_product_attention
    return getattr(torch.ops.aten, name)


# ---- Tensors between the exec protocol's NumPy codes and torch ----

TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def to_torch(t, dtype, device):
    """An input Tensor (codes in the problem's dtype) as a torch tensor, exactly; `dtype`
    None keeps the tensor's own (a forward's o and lse handed back to a backward)."""
    if t.dtype == "BF16":
        x = torch.from_numpy(t.data.view(np.int16).copy()).view(torch.bfloat16)
    elif t.dtype in ("F16", "F32", "F64"):
        x = torch.from_numpy(t.data.copy())
    else:
        raise ValueError(f"input dtype {t.dtype} is not handled")
    x = x.to(device=device, dtype=TORCH_DTYPES[dtype] if dtype else x.dtype)
    if x.numel() == 0:
        # NumPy gives an empty array zero strides; a kernel receives what torch itself makes
        # of that shape (row-major strides, last one 1), as a user's torch.empty would be.
        x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return x


def to_tensor(x):
    """A torch tensor back to a protocol Tensor in its own dtype (bf16 as codes)."""
    x = x.detach().to("cpu").contiguous()
    if x.dtype == torch.bfloat16:
        return aw.Tensor(x.view(torch.int16).numpy().view(np.uint16), "BF16")
    if x.dtype == torch.float16:
        return aw.Tensor(x.numpy(), "F16")
    return aw.Tensor(x.float().numpy(), "F32")


# ---- The problem, read the way reference/problem/problem.h defines it ----


def window_of(p):
    return list(p.get("window") or [-1, -1])


def has_window(p):
    return window_of(p) != [-1, -1]


def is_varlen(p):
    return p.get("cu_seqlens_q") is not None


def bottom_right(p):
    return p.get("causal_align", "bottom_right") == "bottom_right"


def diagonal_rules(p):
    """Rules that use the diagonal i + off (docs/semantics.md section 3)."""
    return bool(p.get("causal")) or has_window(p) or p.get("alibi_slopes") is not None


def square_everywhere(p):
    return all(ql == kl for _, ql, _, kl in aw.sequences(p))


def extra_masks(p):
    """Mask rules that FlashAttention-style APIs have no argument for."""
    return (p.get("document_ids_q") is not None or bool(p.get("prefix_lm")) or
            p.get("block_sparse") is not None)


def any_mask(p):
    return bool(p.get("causal")) or has_window(p) or extra_masks(p)


def covers(caps, p):
    """Python mirror of Capabilities::Covers (kernels/kernel.cc): None, or the first
    unclaimed feature."""
    def listed(values, v):
        return not values or v in values
    checks = [
        (listed(caps.get("dtypes", []), p["dtype"]), f"dtype {p['dtype']}"),
        (listed(caps.get("head_dims", []), p["head_dim"]), f"head_dim {p['head_dim']}"),
        (listed(caps.get("head_dims_v", []), p["head_dim_v"]), f"head_dim_v {p['head_dim_v']}"),
        (not p.get("causal") or caps.get("causal"), "causal"),
        (not has_window(p) or caps.get("window"), "window"),
        (not p.get("softcap") or caps.get("softcap"), "softcap"),
        (p.get("alibi_slopes") is None or caps.get("alibi"), "alibi"),
        (not is_varlen(p) or caps.get("varlen"), "varlen"),
        (p["heads_q"] == p["heads_kv"] or caps.get("gqa"), "gqa"),
        (p.get("document_ids_q") is None or caps.get("documents"), "documents"),
        (not p.get("prefix_lm") or caps.get("prefix_lm"), "prefix_lm"),
        (p.get("block_sparse") is None or caps.get("block_sparse"), "block_sparse"),
        (not caps.get("same_head_dim_v") or p["head_dim_v"] == p["head_dim"],
         "head_dim_v != head_dim"),
        (not caps.get("causal_bottom_right_only") or bottom_right(p) or
         not diagonal_rules(p) or square_everywhere(p), "top-left alignment with q_len != k_len"),
    ]
    for ok, why in checks:
        if not ok:
            return why
    return None


def dense_visible(p, device):
    """Boolean [B, Sq, Sk]: key j visible to query i of batch entry b (attest_worker.visible,
    the NumPy transcription of reference/problem/mask.h), for an API's mask argument."""
    b, sq, sk = p["batch"], p["seqlen_q"], p["seqlen_k"]
    vis = np.stack([aw.visible(p, i, sq, sk)[0] for i in range(b)])
    return torch.from_numpy(vis).to(device)


def packed_visible(p, device):
    """Boolean [total_q, total_k] of a packed batch: each sequence's mask on its diagonal
    block, nothing visible across sequences (the kernel's cu_seqlens already separate them;
    this is how a per-token bias over the packed axis reads)."""
    tq, tk = p["cu_seqlens_q"][-1], p["cu_seqlens_k"][-1]
    vis = np.zeros((tq, tk), dtype=bool)
    for b, (q0, ql, k0, kl) in enumerate(aw.sequences(p)):
        if ql and kl:
            vis[q0:q0 + ql, k0:k0 + kl] = aw.visible(p, b, ql, kl)[0]
    return torch.from_numpy(vis).to(device)


def padded_visible(p, device):
    """Boolean [B, max_q, max_k] of a packed batch: sequence b's mask in the top-left corner of
    entry b (the padded layout of a per-sequence bias)."""
    vis = np.zeros((p["batch"], p["seqlen_q"], p["seqlen_k"]), dtype=bool)
    for b, (_, ql, _, kl) in enumerate(aw.sequences(p)):
        if ql and kl:
            vis[b, :ql, :kl] = aw.visible(p, b, ql, kl)[0]
    return torch.from_numpy(vis).to(device)


def additive(vis, dtype, heads, align=1):
    """0 / -inf bias [1 or B, heads, Sq, Sk] in `dtype` from a boolean [B, Sq, Sk], its rows
    allocated `align`-aligned (a view of a wider buffer, as some kernels require)."""
    b, sq, sk = vis.shape
    skp = -(-sk // align) * align
    full = torch.zeros((b, heads, sq, skp), dtype=dtype, device=vis.device)
    bias = full[..., :sk]
    bias.masked_fill_(~vis[:, None], -math.inf)
    return bias


def alibi_bias(p, device):
    """float32 [Hq, Sq, Sk]: -slope_h * |i + off - j| (docs/semantics.md section 2, step 3)."""
    sq, sk = p["seqlen_q"], p["seqlen_k"]
    off = sk - sq if bottom_right(p) else 0
    slopes = torch.tensor(p["alibi_slopes"], dtype=torch.float32, device=device)
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    return -slopes[:, None, None] * (i + off - j).abs().float()


def padded_extent(n):
    """Positions a FlexAttention kernel may evaluate mask_mod at along an axis of n tokens:
    n rounded up to a whole number of 256-blocks, plus one block (its blocks are at most 128
    on the H200; the margin keeps the tables valid for larger ones)."""
    return (n + 255) // 256 * 256 + 256


def cu_tensor(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def lse_to_attest(lse, p):
    """A kernel's lse as attest's layout: [B, Hq, Sq] dense, [Hq, total_q] packed. Accepts the
    layouts kernels write: [B, H, Sq] (or padded past Sq), [B, H, Sq, 1] (cuDNN), packed
    [H, total] (FlashAttention varlen), [total, H] (torch.nn.attention.varlen's docstring),
    either with a trailing 1 (cuDNN), [1, H, total] (packed as one sequence) and
    [B, H, max_q] per sequence; where [H, total] and [total, H] coincide, FlashAttention's
    [H, total] is taken."""
    hq = p["heads_q"]
    if lse.dim() == 4 and lse.shape[-1] == 1:
        lse = lse[..., 0]
    if is_varlen(p):
        total = p["cu_seqlens_q"][-1]
        if lse.dim() == 3 and lse.shape[-1] == 1 and hq in lse.shape[:2]:
            lse = lse[..., 0]
        if lse.dim() == 3 and lse.shape[0] == 1:
            lse = lse[0]
        if lse.dim() == 2 and lse.shape[0] == hq and lse.shape[1] >= total:
            return lse[:, :total]
        if lse.dim() == 2 and lse.shape == (total, hq):
            return lse.t()
        if lse.dim() == 3 and lse.shape[0] == p["batch"]:  # [B, H, max_q], per sequence
            return torch.cat([lse[b, :, :ql] for b, (_, ql, _, _) in
                              enumerate(aw.sequences(p))], dim=1)
        raise ValueError(f"lse of shape {list(lse.shape)}: no known packed layout")
    if lse.dim() == 3 and lse.shape[:2] == (p["batch"], hq) and lse.shape[2] >= p["seqlen_q"]:
        return lse[:, :, :p["seqlen_q"]]
    raise ValueError(f"lse of shape {list(lse.shape)}: no known layout")


class Backend:
    """One kernel entry point. `run` takes attest-layout tensors ([B, S, H, D] or packed
    [total, H, D]) and returns (o, lse) in attest layout; lse is None when the API returns none
    (capabilities "lse": false) or when `need_lse` is false (a backward's recomputation)."""

    name = ""

    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.dtype = args.dtype
        # Which entry point family: the CUDA ops, or PyTorch's CPU kernels (for CI).
        self.cuda_api = args.device != "cpu"
        self.route = ""

    def caps(self):
        raise NotImplementedError

    def run(self, p, q, k, v, need_lse):
        raise NotImplementedError

    def grad_mode(self):
        """The autograd mode a forward-only call runs under."""
        return torch.no_grad()

    @staticmethod
    def base_caps(dtype):
        return {"dtypes": [dtype], "head_dims": [], "head_dims_v": [], "causal": False,
                "window": False, "softcap": False, "alibi": False, "varlen": False,
                "gqa": False, "documents": False, "prefix_lm": False, "block_sparse": False,
                "backward": True, "deterministic": False, "profile": dtype}


# ---- PyTorch SDPA: the math backend through the public function ----

class SdpaMath(Backend):
    """F.scaled_dot_product_attention under sdpa_kernel(MATH): the public API users call.
    Masks through `attn_mask` (boolean, or additive with --mask-form additive; ALiBi always as a
    float32 additive mask, which SDPA accepts beside bf16/f16 inputs) or `is_causal` where it
    says the same (top-left, or every sequence square); GQA through `enable_gqa`. SDPA returns
    no lse ("lse": false) and has no varlen entry and no score hook (no softcap)."""

    name = "sdpa-math"

    def caps(self):
        c = self.base_caps(self.dtype)
        c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                  "block_sparse": True, "alibi": True, "gqa": True, "deterministic": True,
                  "lse": False})
        # The math backend upcasts bf16/f16 to fp32 and rounds o and the gradients once,
        # unless reduced-precision reductions are allowed (then it computes in the input dtype
        # and follows no recipe attest knows: the profile alone judges it). torch_probe.py
        # checks the upcast bit for bit against an fp32 call rounded once.
        if self.dtype in ("bf16", "f16") and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
            c["recipe"] = self.dtype + "-upcast"
        return c

    def run(self, p, q, k, v, need_lse):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        mask, is_causal = sdpa_mask(p, self.device, q.dtype, self.args.mask_form,
                                    allow_is_causal=True)
        self.route = sdpa_route(mask, is_causal)
        kw = {"attn_mask": mask, "is_causal": is_causal, "scale": aw.scale_of(p)}
        if p["heads_q"] != p["heads_kv"]:
            kw["enable_gqa"] = True
        o = self.call(qt, kt, vt, **kw)
        if isinstance(o, (tuple, list)):  # a function that also returns its weights
            o = o[0]
        return o.transpose(1, 2), None

    def call(self, q, k, v, **kw):
        from torch.nn.attention import sdpa_kernel, SDPBackend
        with sdpa_kernel([SDPBackend.MATH]):
            return entry("scaled_dot_product_attention")(q, k, v, **kw)


class SdpaCallable(SdpaMath):
    """A user's function in SDPA's calling convention, fn(q, k, v, attn_mask=None,
    is_causal=False, scale=None[, enable_gqa=False]) on [B, H, S, D], returning o (the Python
    package's api="sdpa", python/attest/_kernel.py): called the way SdpaMath calls
    F.scaled_dot_product_attention. It claims what that convention can say (masks as
    `attn_mask`, ALiBi as a float mask, GQA where the function takes `enable_gqa`), no lse,
    no recipe."""

    name = "sdpa-callable"

    def __init__(self, args, fn):
        super().__init__(args)
        self.fn = fn
        try:
            params = inspect.signature(fn).parameters
            self.takes_gqa = "enable_gqa" in params or any(
                x.kind == inspect.Parameter.VAR_KEYWORD for x in params.values())
        except (TypeError, ValueError):
            # A builtin without a signature (F.scaled_dot_product_attention): its docstring's
            # own signature line says what it takes.
            self.takes_gqa = "enable_gqa" in (getattr(fn, "__doc__", "") or "")

    def caps(self):
        c = super().caps()
        c.pop("recipe", None)
        c["gqa"] = self.takes_gqa
        c["deterministic"] = False
        return c

    def call(self, q, k, v, **kw):
        return self.fn(q, k, v, **kw)


def sdpa_mask(p, device, dtype, form, allow_is_causal, align=1):
    """(attn_mask, is_causal) for an SDPA-style API: is_causal (top-left) when it is the whole
    mask, else a [B, 1, Sq, Sk] boolean mask or an additive one (0 / -inf in the input dtype);
    with ALiBi a [B, Hq, Sq, Sk] float32 additive mask (-inf where hidden)."""
    causal_only = (p.get("causal") and not has_window(p) and not extra_masks(p) and
                   (not bottom_right(p) or p["seqlen_q"] == p["seqlen_k"]))
    if allow_is_causal and causal_only and p.get("alibi_slopes") is None:
        return None, True
    if not any_mask(p) and p.get("alibi_slopes") is None:
        return None, False
    vis = dense_visible(p, device)[:, None]  # [B, 1, Sq, Sk]
    if p.get("alibi_slopes") is not None:
        bias = alibi_bias(p, device)[None]
        return torch.where(vis, bias, torch.tensor(-math.inf, device=device)), False
    if form == "bool":
        return vis, False
    return additive(vis[:, 0], dtype, 1, align), False


def sdpa_route(mask, is_causal):
    if is_causal:
        return "is_causal"
    if mask is None:
        return "no mask"
    return f"attn_mask {str(mask.dtype).replace('torch.', '')} {list(mask.shape)}"


# ---- PyTorch's flash kernel (FlashAttention-2) ----

class SdpaFlash(Backend):
    """PyTorch's vendored FlashAttention-2, through the op SDPA's flash backend and its nested
    (varlen) path call: aten._flash_attention_forward(q [B,S,H,D] or packed [T,H,D], k, v,
    cum_seq_q, cum_seq_k, max_q, max_k, dropout, is_causal, return_debug_mask, scale,
    window_size_left, window_size_right, seqused_k, alibi_slopes), which returns the
    logsumexp. FlashAttention's conventions: bottom-right causal and windows, GQA by fewer kv
    heads, one head dim for q, k and v (a multiple of 8 up to 256), lse = +inf on empty rows
    (flash-attention's `softmax_lse` convention). It has no attn_mask, no softcap, and this
    build refuses alibi_slopes.
    On CPU it is PyTorch's CPU flash kernel, aten._scaled_dot_product_flash_attention_for_cpu
    (q [B,H,S,D], is_causal top-left, an additive attn_mask, GQA, no varlen), so that this
    adapter's paths run in CI without a GPU."""

    name = "sdpa-flash"

    def caps(self):
        c = self.base_caps(self.dtype)
        if not self.cuda_api:
            c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                      "block_sparse": True, "alibi": True, "gqa": True,
                      "same_head_dim_v": True})
            return c
        # No ALiBi: "This flash attention build does not support alibi" (PyTorch 2.11's
        # vendored FlashAttention-2, measured on the H200 by torch_probe.py).
        c.update({"causal": True, "window": True, "gqa": True, "varlen": True,
                  "same_head_dim_v": True, "causal_bottom_right_only": True,
                  "head_dims": list(range(8, 257, 8)), "head_dims_v": list(range(8, 257, 8)),
                  "empty_row_lse": "+inf"})
        return c

    def run(self, p, q, k, v, need_lse):
        scale = aw.scale_of(p)
        if not self.cuda_api:
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            mask, is_causal = sdpa_mask(p, self.device, q.dtype, "additive",
                                        allow_is_causal=True)
            self.route = "cpu flash, " + sdpa_route(mask, is_causal)
            o, lse = entry("_scaled_dot_product_flash_attention_for_cpu")(
                qt, kt, vt, 0.0, is_causal, attn_mask=mask, scale=scale)
            return o.transpose(1, 2), lse_to_attest(lse, p) if need_lse else None
        kw = {"scale": scale}
        left, right = window_of(p)
        if has_window(p):
            kw["window_size_left"], kw["window_size_right"] = left, right
        if p.get("alibi_slopes") is not None:
            kw["alibi_slopes"] = torch.tensor(p["alibi_slopes"], dtype=torch.float32,
                                              device=self.device)
        causal = bool(p.get("causal"))
        if is_varlen(p):
            out = entry("_flash_attention_forward")(
                q, k, v, cu_tensor(p["cu_seqlens_q"], self.device),
                cu_tensor(p["cu_seqlens_k"], self.device), p["seqlen_q"], p["seqlen_k"], 0.0,
                causal, False, **kw)
        else:
            out = entry("_flash_attention_forward")(
                q, k, v, None, None, p["seqlen_q"], p["seqlen_k"], 0.0, causal, False, **kw)
        self.route = "aten._flash_attention_forward" + (" varlen" if is_varlen(p) else "")
        return out[0], lse_to_attest(out[1], p) if need_lse else None


# ---- PyTorch's memory-efficient kernel (xformers' CUTLASS kernel) ----

class SdpaEfficient(Backend):
    """aten._efficient_attention_forward(q [B,S,H,D] or packed [1,T,H,D], k, v, bias,
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout, custom_mask_type,
    compute_log_sumexp, scale, seqlen_k, window_size): causal in both alignments through
    custom_mask_type (1: from the top left, 2: from the bottom right), every other mask rule
    through the additive `bias` ([B, H, Sq, Sk] in the input dtype, its rows allocated
    16-aligned as the kernel requires, -inf where hidden), varlen through cu_seqlens, Dv != D.
    No GQA (the kernel takes one head count), no softcap, no ALiBi (a bias in the input dtype
    cannot hold the slopes' distances exactly)."""

    name = "sdpa-efficient"

    def caps(self):
        c = self.base_caps(self.dtype)
        # Head dims: multiples of 8 (D = 100: "cutlassF: no kernel found to launch!"), up to
        # 320 as measured (torch_probe.py on the H200).
        dims = list(range(8, 321, 8))
        c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                  "block_sparse": True, "varlen": True, "head_dims": dims, "head_dims_v": dims})
        return c

    def run(self, p, q, k, v, need_lse):
        # compute_log_sumexp is always on: the kernel's backward reads the forward's lse
        # ("LSE is not correctly aligned" otherwise, seen on the H200).
        scale = aw.scale_of(p)
        # The kernel ANDs its causal mask with the bias, so a prefix (which overrides causal,
        # docs/semantics.md section 3) goes into the bias whole.
        causal = bool(p.get("causal")) and not p.get("prefix_lm")
        mask_type = 0 if not causal else (2 if bottom_right(p) else 1)
        bias = None
        if has_window(p) or extra_masks(p):  # the bias holds every rule, causal included
            vis = packed_visible(p, self.device)[None] if is_varlen(p) else \
                dense_visible(p, self.device)
            bias = additive(vis, q.dtype, p["heads_q"], align=16)
        if is_varlen(p):
            out = entry("_efficient_attention_forward")(
                q[None], k[None], v[None], bias, cu_tensor(p["cu_seqlens_q"], self.device),
                cu_tensor(p["cu_seqlens_k"], self.device), p["seqlen_q"], p["seqlen_k"], 0.0,
                mask_type, True, scale=scale)
            o = out[0][0]
        else:
            out = entry("_efficient_attention_forward")(
                q, k, v, bias, None, None, None, None, 0.0, mask_type, True, scale=scale)
            o = out[0]
        self.route = (f"aten._efficient_attention_forward custom_mask_type {mask_type}" +
                      (" + bias" if bias is not None else "") + (" varlen" if is_varlen(p) else ""))
        return o, lse_to_attest(out[1], p) if need_lse else None


# ---- PyTorch's cuDNN kernel ----

class SdpaCudnn(Backend):
    """aten._cudnn_attention_forward(q, k, v, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k,
    compute_log_sumexp, dropout, is_causal, return_debug_mask, scale): q [B,H,S,D] (SDPA's
    layout) or packed [T,H,D] with cumulative sequence lengths (SDPA's nested-tensor path),
    is_causal (top-left) where it is the whole mask, every other rule through the additive
    attn_bias ([B, 1, Sq, Sk] in the input dtype, -inf where hidden). GQA by fewer kv heads
    and Dv != D as cuDNN's SDPA graph takes them."""

    name = "sdpa-cudnn"

    def caps(self):
        c = self.base_caps(self.dtype)
        c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                  "block_sparse": True, "gqa": True, "varlen": True,
                  "head_dims": list(range(8, 257, 8)), "head_dims_v": list(range(8, 257, 8))})
        return c

    def run(self, p, q, k, v, need_lse):
        scale = aw.scale_of(p)
        if is_varlen(p):
            causal_only = p.get("causal") and not has_window(p) and not extra_masks(p) and (
                not bottom_right(p) or square_everywhere(p))
            bias = None
            if any_mask(p) and not causal_only:
                # Per sequence, padded to [B, 1, max_q, max_k]: the layout the op expands a
                # packed batch's bias to (its error on a [1, 1, total_q, total_k] bias).
                bias = additive(padded_visible(p, self.device), q.dtype, 1, align=16)
            causal = bool(causal_only)
            # compute_log_sumexp always on: the backward reads the forward's stats.
            out = entry("_cudnn_attention_forward")(
                q, k, v, bias, cu_tensor(p["cu_seqlens_q"], self.device),
                cu_tensor(p["cu_seqlens_k"], self.device), p["seqlen_q"], p["seqlen_k"],
                True, 0.0, causal, False, scale=scale)
            self.route = "aten._cudnn_attention_forward varlen" + (
                " is_causal" if causal else "") + (" + bias" if bias is not None else "")
            return out[0], lse_to_attest(out[1], p) if need_lse else None
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        # Bias rows 16-aligned, as SDPA's own mask preprocessing leaves them for its kernels.
        mask, is_causal = sdpa_mask(p, self.device, q.dtype, "additive", allow_is_causal=True,
                                    align=16)
        self.route = "aten._cudnn_attention_forward " + sdpa_route(mask, is_causal)
        out = entry("_cudnn_attention_forward")(
            qt, kt, vt, mask, None, None, p["seqlen_q"], p["seqlen_k"], True, 0.0,
            is_causal, False, scale=scale)
        if out[0] is None:  # the op's answer, reported as such (seen for Sq = Sk = 0)
            raise RuntimeError("aten._cudnn_attention_forward returned no output tensor (None) "
                               f"for B{p['batch']} Sq{p['seqlen_q']} Sk{p['seqlen_k']}")
        return out[0].transpose(1, 2), lse_to_attest(out[1], p) if need_lse else None


# ---- FlexAttention (Triton, or FlashAttention-4 as its FLASH backend) ----

def flex_mods(p, device):
    """(mask_mod or None, score_mod or None, B, Sq, Sk) for torch's flex_attention: the
    problem's rules as functions of (b, h, q_idx, kv_idx). A packed batch is one sequence of
    total tokens whose documents are its sequences (FlexAttention's document masking), with
    every rule applied in the document's own coordinates."""
    causal, prefix = bool(p.get("causal")), int(p.get("prefix_lm") or 0)
    left, right = window_of(p)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    br = bottom_right(p)
    cap = float(p.get("softcap") or 0.0)
    slopes = (torch.tensor(p["alibi_slopes"], dtype=torch.float32, device=device)
              if p.get("alibi_slopes") is not None else None)
    # FlexAttention's kernels also evaluate mask_mod where the answer is decided already: keys
    # of another packed sequence (j < 0 or past the sequence) and the padding of partial
    # blocks past the last token. Compiled, an index out of a captured table's range is a
    # device-side assert, so every table below is padded to cover those positions, with
    # entries that never match. Padding instead of clamping: Inductor's CuteDSL code
    # generator (the FLASH backend, PyTorch 2.11) has no `maximum`/`minimum`, so a clamped
    # index fails to compile there ("UNSUPPORTED CUTEDSL OPERATION: 'maximum'").
    varlen = is_varlen(p)
    if varlen:
        cq, ck = p["cu_seqlens_q"], p["cu_seqlens_k"]
        n_seq, tq, tk = len(cq) - 1, cq[-1], ck[-1]
    else:
        tq, tk = p["seqlen_q"], p["seqlen_k"]
    q_pad, k_pad = padded_extent(tq), padded_extent(tk)
    sparse = p.get("block_sparse")
    if sparse is not None:
        bq, bk = int(sparse["block_q"]), int(sparse["block_k"])
        # Positions to blocks by lookup tables, not by division (Inductor bounds an index it
        # computes with `//` by a `minimum`: the CuteDSL failure above). Key positions are
        # shifted by k_off: j >= -tk (a key of an earlier packed sequence) looks up at
        # j + k_off >= 0, in block kb + k_shift of the shifted table.
        k_shift = -(-tk // bk) + 1 if varlen else 0
        k_off = k_shift * bk
        nqb = q_pad // bq + 1
        nkb = (k_pad + k_off) // bk + 1
        table = torch.zeros((nqb * nkb,), dtype=torch.bool, device=device)
        for qb, kb in sparse["blocks"]:
            table[qb * nkb + kb + k_shift] = True
        q_row = (torch.arange(q_pad, device=device) // bq * nkb).int()  # nkb x block of i
        k_col = (torch.arange(k_pad + k_off, device=device) // bk).int()  # block of j + k_off
    docs = p.get("document_ids_q") is not None  # never with a packed batch (problem.cc)
    if docs:
        # Padding positions get ids -1 (queries) and -2 (keys): never equal.
        dq = torch.full((p["batch"], q_pad), -1, dtype=torch.int32, device=device)
        dk = torch.full((p["batch"], k_pad), -2, dtype=torch.int32, device=device)
        dq[:, :tq] = torch.tensor(p["document_ids_q"], dtype=torch.int32, device=device)
        dk[:, :tk] = torch.tensor(p["document_ids_k"], dtype=torch.int32, device=device)

    if varlen:
        # Sequence ids per packed position; padding past the tokens belongs to sentinel
        # sequences n_seq (queries) and n_seq + 1 (keys), which match nothing, start at the
        # end of the tokens and are empty.
        seq_q = torch.full((q_pad,), n_seq, dtype=torch.int32, device=device)
        seq_k = torch.full((k_pad,), n_seq + 1, dtype=torch.int32, device=device)
        seq_q[:tq] = torch.repeat_interleave(torch.arange(n_seq, device=device),
                                             torch.tensor(np.diff(cq), device=device)).int()
        seq_k[:tk] = torch.repeat_interleave(torch.arange(n_seq, device=device),
                                             torch.tensor(np.diff(ck), device=device)).int()
        start_q = cu_tensor(list(cq) + [tq], device)
        start_k = cu_tensor(list(ck) + [tk], device)
        len_q = start_q[1:] - start_q[:-1]
        len_k = start_k[1:] - start_k[:-1]

        def where(b, q_idx, kv_idx):
            s = seq_q[q_idx]
            i = q_idx - start_q[s]
            j = kv_idx - start_k[s]
            off = (len_k[s] - len_q[s]) if br else torch.zeros_like(i)
            return s, i, j, off, seq_k[kv_idx] == s
        batch, sq, sk = 1, tq, tk
    else:
        sq0, sk0 = p["seqlen_q"], p["seqlen_k"]

        def where(b, q_idx, kv_idx):
            off = (sk0 - sq0) if br else 0
            return b, q_idx, kv_idx, off, None
        batch, sq, sk = p["batch"], sq0, sk0

    mask_mod = None
    if any_mask(p) or is_varlen(p):
        def mask_mod(b, h, q_idx, kv_idx):
            s, i, j, off, same_seq = where(b, q_idx, kv_idx)
            keep = same_seq if same_seq is not None else (kv_idx >= 0)
            band = kv_idx >= 0
            if left >= 0:
                band = band & (j >= i + off - left)
            if right >= 0:
                band = band & (j <= i + off + right)
            if prefix:
                band = band | (j < prefix)
            keep = keep & band
            if docs:  # padded batch: s = b, i = q_idx, j = kv_idx, all inside the padded tables
                keep = keep & (dq[s, i] == dk[s, j])
            if sparse is not None:
                keep = keep & table[q_row[i] + k_col[j + k_off]]
            return keep

    score_mod = None
    if cap > 0 or slopes is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            s = score
            if cap > 0:
                s = cap * torch.tanh(s / cap)
            if slopes is not None:
                _, i, j, off, _ = where(b, q_idx, kv_idx)
                s = s - slopes[h] * (i + off - j).abs()
            return s
    return mask_mod, score_mod, batch, sq, sk


class Flex(Backend):
    """torch.nn.attention.flex_attention under torch.compile, `kernel_options={"BACKEND":
    B}` with B = TRITON (flex-triton) or FLASH (flex-flash: FlexAttention's FlashAttention-4
    backend, which needs flash-attn-4 importable). Masks as a mask_mod turned into a BlockMask
    by create_block_mask, softcap and ALiBi as a score_mod, GQA with enable_gqa, a packed batch
    as documents of one sequence; lse from return_aux=AuxRequest(lse=True) in the forward only
    (the FLASH backward does not differentiate through lse). On CPU, flex_attention runs eager
    (FlexAttention's reference path), forward only."""

    def __init__(self, args, backend):
        super().__init__(args)
        from torch.nn.attention import flex_attention as fa_mod
        self.flex_backend = backend
        self.name = "flex-flash" if backend == "FLASH" else "flex-triton"
        self.create_block_mask = fa_mod.create_block_mask
        self.aux = fa_mod.AuxRequest(lse=True)
        self.eager = self.device.type == "cpu"
        import torch._dynamo as dynamo
        # torch.compile as users call it: by default (--flex-dynamic auto) flex-triton gets
        # PyTorch's default (the first shape is compiled static and the first recompile makes
        # the changing sizes dynamic, so a suite of many shapes compiles a few kernels, not one
        # per shape) and flex-flash is compiled static, because its FLASH backend refuses
        # dynamic shapes (PyTorch 2.11 raises "NYI: score_mod or mask_mod captures a dynamic
        # scalar" once a size becomes symbolic; docs/gpu-results.md). "true"/"false" force
        # dynamic=True/False for both. Past dynamo's recompile limit a compiled function
        # silently falls back to eager (FlexAttention's reference path, not the kernel under
        # test): the limits are raised so that every call stays compiled.
        for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(dynamo.config, knob):
                setattr(dynamo.config, knob, 4096)
        dynamic = {"auto": False if backend == "FLASH" else None, "true": True,
                   "false": False}[getattr(args, "flex_dynamic", None) or "auto"]
        if dynamic is False:
            dynamo.config.automatic_dynamic_shapes = False
        self.flex = (fa_mod.flex_attention if self.eager else
                     torch.compile(fa_mod.flex_attention, dynamic=dynamic))

    def caps(self):
        c = self.base_caps(self.dtype)
        c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                  "block_sparse": True, "softcap": True, "alibi": True, "gqa": True,
                  "varlen": True, "head_dims": [16, 32, 64, 128, 256],
                  "head_dims_v": [16, 32, 64, 128, 256]})
        if self.eager:
            c["backward"] = False
        return c

    def grad_mode(self):
        # Compiled flex under no_grad failed on CUDA with PyTorch 2.11 ("FakeTensorMode should
        # not be set when dispatching flex_attention") while grad mode ran; the inputs need no
        # grad, so no graph is kept.
        return torch.enable_grad()

    def run(self, p, q, k, v, need_lse):
        mask_mod, score_mod, batch, sq, sk = flex_mods(p, self.device)
        if is_varlen(p):
            qt, kt, vt = (x[None].transpose(1, 2).contiguous() for x in (q, k, v))
        else:
            qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        block_mask = None
        if mask_mod is not None:
            block_mask = self.create_block_mask(mask_mod, batch, None, sq, sk,
                                                device=str(self.device))
        kw = {"score_mod": score_mod, "block_mask": block_mask, "scale": float(aw.scale_of(p)),
              "enable_gqa": p["heads_q"] != p["heads_kv"]}
        if not self.eager:
            kw["kernel_options"] = {"BACKEND": self.flex_backend}
        self.route = f"flex_attention {self.flex_backend if not self.eager else 'eager'}" + (
            " + block_mask" if block_mask is not None else "") + (
            " + score_mod" if score_mod is not None else "")
        if need_lse:
            o, aux = self.flex(qt, kt, vt, return_aux=self.aux, **kw)
            lse = aux.lse
        else:
            o, lse = self.flex(qt, kt, vt, **kw), None
        if is_varlen(p):
            o = o[0].transpose(0, 1)
            lse = lse[0] if lse is not None else None
        else:
            o = o.transpose(1, 2)
        return o, lse


# ---- FlashAttention 2/3 and 4 (`flash_attn_func` conventions) ----

class FlashAttn(Backend):
    """A `flash_attn_func` from any module: FlashAttention-2/3 (`return_attn_probs`, window
    (-1, -1) unbounded, `alibi_slopes`) or FlashAttention-4 (`flash_attn.cute`: `return_lse`,
    window (None, None) unbounded, `mask_mod`, no ALiBi), told apart by the function's
    signature; packed batches through the module's `flash_attn_varlen_func`. The capabilities
    are what the signature accepts: causal and windows bottom-right, softcap, ALiBi, GQA;
    for FlashAttention-4 documents, prefix-LM, block-sparse and top-left masks as a CuTe DSL
    mask_mod (tools/workers/fa4_masks.py), head dims 8-256 with D != Dv on sm_90 (its
    `_validate_head_dims`), lse = -inf on empty rows. --deterministic passes
    deterministic=True."""

    def __init__(self, args, module, func, fn=None, varlen_fn=None):
        """The function `func` of `module`, or `fn` itself (the Python package's
        api="flash_attn"), with `varlen_fn` for packed batches: by default the `*_varlen_func`
        sibling in the same module."""
        super().__init__(args)
        mod = None
        if fn is None:
            import importlib
            mod = importlib.import_module(module)
            fn = getattr(mod, func)
        if varlen_fn is None:
            import sys
            mod = mod or sys.modules.get(getattr(fn, "__module__", None) or "")
            name = func or getattr(fn, "__name__", "")
            varlen_fn = getattr(mod, name.replace("_func", "_varlen_func"), None)
        self.fn = fn
        self.varlen_fn = varlen_fn if varlen_fn is not fn else None
        self.params = inspect.signature(self.fn).parameters
        self.fa4 = "return_lse" in self.params
        self.deterministic = bool(getattr(args, "deterministic", False))
        if self.deterministic and "deterministic" not in self.params:
            raise ValueError(f"{getattr(fn, '__qualname__', fn)} has no `deterministic` argument")
        self.name = ("fa4" if self.fa4 else "fa") + ("-deterministic" if self.deterministic
                                                     else "")
        self.masks = None
        if self.fa4 and "mask_mod" in self.params:
            import fa4_masks
            self.masks = fa4_masks

    def caps(self):
        c = self.base_caps(self.dtype)
        c.update({"causal": True, "gqa": True, "window": "window_size" in self.params,
                  "softcap": "softcap" in self.params, "alibi": "alibi_slopes" in self.params,
                  "varlen": self.varlen_fn is not None, "deterministic": self.deterministic,
                  "causal_bottom_right_only": self.masks is None})
        if self.fa4:
            dims = list(range(8, 257, 8))
            c.update({"head_dims": dims, "head_dims_v": dims})
            if c["softcap"]:
                # FlashAttention-4's softcap calls cute.math.tanh(..., fastmath=True)
                # (flash_attn/cute/utils.py, create_softcap_scoremod), which the CuTe DSL
                # lowers to PTX tanh.approx.f32 (tools/device/tanh_error.py --ptx); measured
                # over every fp32 input on an H200 it errs by at most 7.984e-6
                # (docs/gpu-results/tanh/h200-tanh-error.json).
                c["softcap_tanh_abs_error"] = 8.0e-6
        else:
            c.update({"same_head_dim_v": True, "empty_row_lse": "+inf"})
        if self.masks is not None:
            c.update({"documents": True, "prefix_lm": True, "block_sparse": True})
        return c

    def _kwargs(self, p, need_lse):
        kw = {"softmax_scale": aw.scale_of(p)}
        needs_mod = self.masks is not None and (
            extra_masks(p) or (diagonal_rules(p) and not bottom_right(p) and
                               not square_everywhere(p)))
        if needs_mod:
            kw["mask_mod"], kw["aux_tensors"] = self.masks.mask_mod_for(p, self.device)
            self.route = "mask_mod"
        else:
            if p.get("causal"):
                kw["causal"] = True
            if has_window(p):
                left, right = window_of(p)
                kw["window_size"] = ((None if left < 0 else left, None if right < 0 else right)
                                     if self.fa4 else (left, right))
            self.route = "native masks"
        if p.get("softcap"):
            kw["softcap"] = float(p["softcap"])
        if p.get("alibi_slopes") is not None:
            kw["alibi_slopes"] = torch.tensor(p["alibi_slopes"], dtype=torch.float32,
                                              device=self.device)
        if "deterministic" in self.params:
            kw["deterministic"] = self.deterministic
        if self.fa4:
            kw["return_lse"] = need_lse
        elif need_lse:
            kw["return_attn_probs"] = True
        return kw

    def run(self, p, q, k, v, need_lse):
        kw = self._kwargs(p, need_lse)
        if is_varlen(p):
            out = self.varlen_fn(q, k, v, cu_seqlens_q=cu_tensor(p["cu_seqlens_q"], self.device),
                                 cu_seqlens_k=cu_tensor(p["cu_seqlens_k"], self.device),
                                 max_seqlen_q=p["seqlen_q"], max_seqlen_k=p["seqlen_k"], **kw)
            self.route += ", varlen"
        else:
            out = self.fn(q, k, v, **kw)
        if isinstance(out, (tuple, list)):
            o, lse = out[0], (out[1] if len(out) > 1 else None)
        else:
            o, lse = out, None
        if need_lse and lse is None:
            raise ValueError("the function returned no lse")
        return o, lse_to_attest(lse, p) if need_lse else None


# ---- Any function in attest's own layout ----

class AttestCallable(Backend):
    """A user's function in attest's own convention (the Python package's api="attest",
    docs/python.md): fn(problem, q, k, v) with the case file's problem object (a dict) and
    tensors in attest's layout ([B, S, H, D], packed [total, H, D]), returning o or (o, lse)
    with lse [B, Hq, Sq] (packed [Hq, total]). Every mask, score rule and varlen layout is the
    function's to read from `problem`; it claims exactly the capabilities it is given."""

    name = "attest-callable"

    def __init__(self, args, fn, caps):
        super().__init__(args)
        self.fn = fn
        self.claimed = caps

    def caps(self):
        c = self.base_caps(self.dtype)
        c.update(self.claimed)
        return c

    def run(self, p, q, k, v, need_lse):
        out = self.fn(p, q, k, v)
        o, lse = (out[0], out[1] if len(out) > 1 else None) if isinstance(out, (tuple, list)) \
            else (out, None)
        if need_lse and lse is None:
            raise ValueError("the function returned no lse (declare \"lse\": false if it has "
                             "none)")
        return o, lse if need_lse else None


class Runner:
    """One backend's forward and backward on torch tensors in attest's layout, as every caller
    runs them (tools/workers/torch_worker.py over the exec protocol, the Python package in
    process): the claim checked first (a problem outside it is Unsupported), the forward under
    the backend's grad mode, the backward by autograd through the same call with the given dO
    (the forward recomputed, as docs/protocol.md allows) or by an explicit `backward(problem,
    q, k, v, o, lse, do) -> (dq, dk, dv)`."""

    def __init__(self, backend, caps=None, backward=None):
        self.backend = backend
        self.caps = backend.caps()
        self.caps.update(caps or {})
        self.explicit_backward = backward

    def _check(self, problem):
        why = covers(self.caps, problem)
        if why is not None:
            raise aw.Unsupported(why)

    def forward(self, problem, q, k, v):
        """(o, lse) as the kernel wrote them; lse None where the claim says it has none."""
        self._check(problem)
        self.backend.route = ""
        with self.backend.grad_mode():
            return self.backend.run(problem, q, k, v, need_lse=self.caps.get("lse", True))

    def backward(self, problem, q, k, v, do, o=None, lse=None):
        """(dq, dk, dv)."""
        self._check(problem)
        if not self.caps.get("backward"):
            raise aw.Unsupported(f"backward ({self.backend.name} on {self.backend.device.type})")
        self.backend.route = ""
        if self.explicit_backward is not None:
            grads = self.explicit_backward(problem, q, k, v, o, lse, do)
        else:
            q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
            with torch.enable_grad():
                o, _ = self.backend.run(problem, q, k, v, need_lse=False)
                grads = torch.autograd.grad(o, (q, k, v), grad_outputs=do, allow_unused=True)
        for name, g in zip(("dq", "dk", "dv"), grads):
            if g is None:
                raise RuntimeError(f"autograd returned no {name}: the kernel's output does not "
                                   f"depend on {name[1:]}")
        return tuple(grads)


def make(args):
    b = args.backend
    table = {"sdpa-math": SdpaMath, "sdpa-flash": SdpaFlash, "sdpa-efficient": SdpaEfficient,
             "sdpa-cudnn": SdpaCudnn}
    if b in table:
        if b in ("sdpa-efficient", "sdpa-cudnn") and args.device == "cpu":
            raise ValueError(f"{b} exists on CUDA only")
        return table[b](args)
    if b in ("flex", "flex-triton"):
        return Flex(args, "TRITON")
    if b == "flex-flash":
        return Flex(args, "FLASH")
    if b == "fa4":
        return FlashAttn(args, "flash_attn.cute", "flash_attn_func")
    if b.startswith("fa:"):
        _, module, func = b.split(":", 2)
        return FlashAttn(args, module, func)
    raise ValueError(f"unknown backend {b!r}")
