"""What every adapter of tools/workers/torch_backends.py shares: the kernels' entry points
(looked up at each call), tensors between the exec protocol and torch, the problem read the way
reference/problem/problem.h defines it (masks, windows, varlen, the claim check `covers`), lse
in attest's layout, and the Backend base class."""

import math

import numpy as np
import torch
import torch.nn.functional as F

import attest_worker as aw
import torch_call as tc

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
        (not caps.get("causal_top_left_only") or not bottom_right(p) or
         not diagonal_rules(p) or square_everywhere(p),
         "bottom-right alignment with q_len != k_len"),
    ]
    for ok, why in checks:
        if not ok:
            return why
    return shape_violation(caps.get("shapes") or {}, p)


def shape_violation(s, p):
    """Python mirror of ShapeViolation (kernels/shape_limits.cc): why `p` breaks the shape
    limits `s` (the capabilities' "shapes" object), or None. Lengths are per sequence: Sq and
    Sk of a padded batch, each packed sequence's q_len and k_len."""
    if not s:
        return None
    if s.get("max_batch", 0) > 0 and p["batch"] > s["max_batch"]:
        return f"shape: batch {p['batch']} exceeds max_batch {s['max_batch']}"
    packed = is_varlen(p)
    for b, (_, ql, _, kl) in enumerate(aw.sequences(p)):
        at = f"sequence {b}: " if packed else ""
        for side, n in (("q", ql), ("k", kl)):
            name = (side + "_len") if packed else ("seqlen_" + side)
            if n % s.get(f"seqlen_{side}_multiple", 1):
                return f"shape: {at}{name} {n} is not a multiple of {s[f'seqlen_{side}_multiple']}"
            if n < s.get(f"min_seqlen_{side}", 0):
                return f"shape: {at}{name} {n} is below min_seqlen_{side} {s[f'min_seqlen_{side}']}"
            if s.get(f"max_seqlen_{side}", 0) > 0 and n > s[f"max_seqlen_{side}"]:
                return f"shape: {at}{name} {n} exceeds max_seqlen_{side} {s[f'max_seqlen_{side}']}"
        if s.get("equal_seqlens") and ql != kl:
            return f"shape: {at}lengths {ql} != {kl} (the kernel requires equal lengths)"
        if not packed:
            break
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


def dtype_attr(dtype):
    """A torch dtype as a call description (torch_call.Attr): torch.bfloat16."""
    return tc.Attr("torch", str(dtype).replace("torch.", ""), obj=dtype)


def bias_call(vis, dtype, heads, align):
    """The additive bias `additive(vis, dtype, heads, align)` as a call description: built in
    the exported script by this module's own `additive` from the boolean `vis` it carries, so
    that the script passes the same aligned view the adapter passed."""
    return tc.Invoke(tc.Func(additive, modules=("math",)), tc.Data("visible", vis),
                     dtype_attr(dtype), heads, align=align)


def lse_call(out, p):
    """lse_to_attest(out, p) as a call description over `out` (the call's result)."""
    return tc.Invoke(tc.Func(lse_to_attest, deps=(is_varlen,)), out, tc.Global("PROBLEM", p))


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
            cq = p["cu_seqlens_q"]
            return torch.cat([lse[b, :, :cq[b + 1] - cq[b]] for b in range(p["batch"])],
                             dim=1)
        raise ValueError(f"lse of shape {list(lse.shape)}: no known packed layout")
    if lse.dim() == 3 and lse.shape[:2] == (p["batch"], hq) and lse.shape[2] >= p["seqlen_q"]:
        return lse[:, :, :p["seqlen_q"]]
    raise ValueError(f"lse of shape {list(lse.shape)}: no known layout")


# ---- SDPA-style masks ----

def sdpa_mask(p, device, dtype, form, allow_is_causal, align=1, describe=False):
    """(attn_mask, is_causal) for an SDPA-style API: is_causal (top-left) when it is the whole
    mask, else a [B, 1, Sq, Sk] boolean mask or an additive one (0 / -inf in the input dtype,
    or in float32 for the form "additive_f32"); with ALiBi a [B, Hq, Sq, Sk] float32 additive
    mask (-inf where hidden). With `describe`, an additive mask comes as its call description
    (torch_backends_common.bias_call), which the caller evaluates."""
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
    make = bias_call if describe else additive
    if form == "additive_f32":
        return make(vis[:, 0], torch.float32, 1, align), False
    return make(vis[:, 0], dtype, 1, align), False


def sdpa_route(mask, is_causal):
    if isinstance(mask, tc.Invoke):  # a description (sdpa_mask describe=True)
        mask = tc.evaluate(mask, {})
    if is_causal:
        return "is_causal"
    if mask is None:
        return "no mask"
    if type(mask).__name__ == "CausalBias":
        return f"attn_mask CausalBias {mask.variant.name.lower()}"
    return f"attn_mask {str(mask.dtype).replace('torch.', '')} {list(mask.shape)}"


class Backend:
    """One kernel entry point. `run` takes attest-layout tensors ([B, S, H, D] or packed
    [total, H, D]) and returns (o, lse) in attest layout; lse is None when the API returns none
    (capabilities "lse": false) or when `need_lse` is false (a backward's recomputation)."""

    name = ""
    # The input layouts the entry point takes (Capabilities::strides, verify/checks/layouts.h):
    # "inner" (any strides with the last dimension contiguous) for the fused kernels (PyTorch's
    # flash, memory-efficient and cuDNN backends check it: sdp_utils'
    # check_last_dim_stride_equals_1; flash_attn: "Input tensor must have contiguous last
    # dimension"; flex's generated kernels) and for a user's function in SDPA's or
    # flash_attn's convention, which models call with such views; "any" where the API computes
    # on any strides (the math backend); "contiguous" where the kernel never sees the caller's
    # layout (cuDNN's FP8 adapter casts its inputs first) or the caller declares it (attest's
    # own convention). Runner declares it unless the caller's caps say otherwise.
    input_strides = "inner"

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
