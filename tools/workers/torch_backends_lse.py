"""The private ops behind PyTorch SDPA's fused backends, which return lse (the +lse backends of
tools/workers/torch_backends.py, which re-exports them): each adapter describes its call as data
(torch_call.py) and runs that description, which `attest repro --export` renders into repro.py
(torch_export.py)."""

import torch

import attest_worker as aw
import torch_call as tc
from torch_backends_common import (entry, window_of, has_window, is_varlen, bottom_right,
                                   square_everywhere, extra_masks, any_mask, dense_visible,
                                   packed_visible, padded_visible, cu_tensor, bias_call,
                                   lse_call, sdpa_mask, sdpa_route, Backend)


# ---- The private ops behind SDPA's fused backends, which return lse (the +lse backends) ----
#
# Extras beside the public routes above: the ops that SDPA's backends call, reached directly
# with masks the adapter builds, so that the kernels' lse is judged too and packed batches go
# through their cu_seqlens entries. Models do not call these; what PyTorch does between the
# public function and these ops is judged only by sdpa-flash, sdpa-efficient and sdpa-cudnn.

class SdpaFlashLse(Backend):
    """sdpa-flash+lse: PyTorch's vendored FlashAttention-2, through the op SDPA's flash backend
    and its nested (varlen) path call: aten._flash_attention_forward(q [B,S,H,D] or packed [T,H,D], k, v,
    cum_seq_q, cum_seq_k, max_q, max_k, dropout, is_causal, return_debug_mask, scale,
    window_size_left, window_size_right, seqused_k, alibi_slopes), which returns the
    logsumexp. FlashAttention's conventions: bottom-right causal and windows, GQA by fewer kv
    heads, one head dim for q, k and v (a multiple of 8 up to 256), lse = +inf on empty rows
    (flash-attention's `softmax_lse` convention). It has no attn_mask, no softcap, and this
    build refuses alibi_slopes.
    On CPU it is PyTorch's CPU flash kernel, aten._scaled_dot_product_flash_attention_for_cpu
    (q [B,H,S,D], is_causal top-left, an additive attn_mask, GQA, no varlen), so that this
    adapter's paths run in CI without a GPU."""

    name = "sdpa-flash+lse"

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
        call = self.describe_call(p, q.dtype, need_lse)
        self.last_call = call  # what `attest repro --export` renders (torch_export.py)
        if not self.cuda_api:
            self.route = "cpu flash, " + sdpa_route(call.kwargs["attn_mask"],
                                                    call.args[4])
        else:
            self.route = "aten._flash_attention_forward" + (" varlen" if is_varlen(p) else "")
        return call.run_both({"q": q, "k": k, "v": v})

    def describe_call(self, p, dtype, need_lse=True, device=None):
        """The call run() makes, as data (torch_call.py): on CUDA
        _flash_attention_forward(q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, 0.0, is_causal,
        False, scale=[, window_size_left=, window_size_right=][, alibi_slopes=]) on attest's
        layout (packed [T, H, D] with cu_seqlens); on CPU
        _scaled_dot_product_flash_attention_for_cpu(q, k, v [B, H, S, D], 0.0, is_causal,
        attn_mask=, scale=). o is the first result, lse the second in attest's layout."""
        device = self.device if device is None else device
        scale = aw.scale_of(p)
        lse = lse_call(tc.Index(tc.Ref("out"), 1), p) if need_lse else None
        if not self.cuda_api:
            views = [tc.Method(tc.Ref(n), "transpose", 1, 2) for n in ("q", "k", "v")]
            mask, is_causal = sdpa_mask(p, device, dtype, "additive", allow_is_causal=True,
                                        describe=True)
            return tc.Call(aten_op("_scaled_dot_product_flash_attention_for_cpu"),
                           views + [0.0, is_causal], {"attn_mask": mask, "scale": scale},
                           output=tc.Method(tc.Index(tc.Ref("out"), 0), "transpose", 1, 2),
                           lse=lse)
        kw = {"scale": scale}
        left, right = window_of(p)
        if has_window(p):
            kw["window_size_left"], kw["window_size_right"] = left, right
        if p.get("alibi_slopes") is not None:
            kw["alibi_slopes"] = tc.Data("alibi_slopes", torch.tensor(
                p["alibi_slopes"], dtype=torch.float32, device=device))
        cu = cu_data(p, device)
        return tc.Call(aten_op("_flash_attention_forward"),
                       [tc.Ref("q"), tc.Ref("k"), tc.Ref("v"), cu[0], cu[1], p["seqlen_q"],
                        p["seqlen_k"], 0.0, bool(p.get("causal")), False], kw,
                       output=tc.Index(tc.Ref("out"), 0), lse=lse)


def aten_op(name):
    """The private op `name` as the target of a call description: torch.ops.aten.<name>, the
    object entry() returns (a stand-in where torch_adapter_test.py installs one)."""
    return tc.Attr("torch", "ops.aten." + name, obj=entry(name))


def cu_data(p, device):
    """(cu_seqlens_q, cu_seqlens_k) as Data of a call description; (None, None) dense."""
    if not is_varlen(p):
        return None, None
    return (tc.Data("cu_seqlens_q", cu_tensor(p["cu_seqlens_q"], device)),
            tc.Data("cu_seqlens_k", cu_tensor(p["cu_seqlens_k"], device)))


def cudnn_output(o, p):
    """cuDNN's o, [B, H, S, D] transposed to attest's layout; its answer None reported as an
    error (seen for Sq = Sk = 0)."""
    if o is None:
        raise RuntimeError("aten._cudnn_attention_forward returned no output tensor (None) "
                           f"for B{p['batch']} Sq{p['seqlen_q']} Sk{p['seqlen_k']}")
    return o.transpose(1, 2)


class SdpaEfficientLse(Backend):
    """sdpa-efficient+lse: PyTorch's memory-efficient kernel (xformers' CUTLASS kernel) through
    aten._efficient_attention_forward(q [B,S,H,D] or packed [1,T,H,D], k, v, bias,
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout, custom_mask_type,
    compute_log_sumexp, scale, seqlen_k, window_size): causal in both alignments through
    custom_mask_type (1: from the top left, 2: from the bottom right), every other mask rule
    through the additive `bias` ([B, H, Sq, Sk] in the input dtype, its rows allocated
    16-aligned as the kernel requires, -inf where hidden), varlen through cu_seqlens, Dv != D.
    No GQA (the kernel takes one head count), no softcap, no ALiBi (a bias in the input dtype
    cannot hold the slopes' distances exactly)."""

    name = "sdpa-efficient+lse"

    def caps(self):
        c = self.base_caps(self.dtype)
        # Head dims: multiples of 8 (D = 100: "cutlassF: no kernel found to launch!"), up to
        # 320 as measured (torch_probe.py on the H200).
        dims = list(range(8, 321, 8))
        c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                  "block_sparse": True, "varlen": True, "head_dims": dims, "head_dims_v": dims})
        return c

    def run(self, p, q, k, v, need_lse):
        call = self.describe_call(p, q.dtype, need_lse)
        self.last_call = call  # what `attest repro --export` renders (torch_export.py)
        self.route = (f"aten._efficient_attention_forward custom_mask_type {call.args[9]}" +
                      (" + bias" if call.args[3] is not None else "") +
                      (" varlen" if is_varlen(p) else ""))
        return call.run_both({"q": q, "k": k, "v": v})

    def describe_call(self, p, dtype, need_lse=True, device=None):
        """The call run() makes, as data (torch_call.py): _efficient_attention_forward(q, k,
        v (packed: [1, T, H, D], q[None]), bias, cu_seqlens_q, cu_seqlens_k, max_q, max_k,
        0.0, custom_mask_type, True, scale=); o the first result ([0] of it packed), lse the
        second in attest's layout."""
        # compute_log_sumexp is always on: the kernel's backward reads the forward's lse
        # ("LSE is not correctly aligned" otherwise, seen on the H200).
        device = self.device if device is None else device
        # The kernel ANDs its causal mask with the bias, so a prefix (which overrides causal,
        # docs/semantics.md section 3) goes into the bias whole.
        causal = bool(p.get("causal")) and not p.get("prefix_lm")
        mask_type = 0 if not causal else (2 if bottom_right(p) else 1)
        bias = None
        if has_window(p) or extra_masks(p):  # the bias holds every rule, causal included
            vis = packed_visible(p, device)[None] if is_varlen(p) else \
                dense_visible(p, device)
            bias = bias_call(vis, dtype, p["heads_q"], 16)
        lse = lse_call(tc.Index(tc.Ref("out"), 1), p) if need_lse else None
        if is_varlen(p):
            cu = cu_data(p, device)
            return tc.Call(aten_op("_efficient_attention_forward"),
                           [tc.Index(tc.Ref(n), None) for n in ("q", "k", "v")] +
                           [bias, cu[0], cu[1], p["seqlen_q"], p["seqlen_k"], 0.0, mask_type,
                            True], {"scale": aw.scale_of(p)},
                           output=tc.Index(tc.Index(tc.Ref("out"), 0), 0), lse=lse)
        return tc.Call(aten_op("_efficient_attention_forward"),
                       [tc.Ref("q"), tc.Ref("k"), tc.Ref("v"), bias, None, None, None, None,
                        0.0, mask_type, True], {"scale": aw.scale_of(p)},
                       output=tc.Index(tc.Ref("out"), 0), lse=lse)


class SdpaCudnnLse(Backend):
    """sdpa-cudnn+lse: PyTorch's cuDNN kernel through aten._cudnn_attention_forward(q, k, v, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k,
    compute_log_sumexp, dropout, is_causal, return_debug_mask, scale): q [B,H,S,D] (SDPA's
    layout) or packed [T,H,D] with cumulative sequence lengths (SDPA's nested-tensor path),
    is_causal (top-left) where it is the whole mask, every other rule through the additive
    attn_bias ([B, 1, Sq, Sk] in the input dtype, -inf where hidden). GQA by fewer kv heads
    and Dv != D as cuDNN's SDPA graph takes them."""

    name = "sdpa-cudnn+lse"

    def caps(self):
        c = self.base_caps(self.dtype)
        c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                  "block_sparse": True, "gqa": True, "varlen": True,
                  "head_dims": list(range(8, 257, 8)), "head_dims_v": list(range(8, 257, 8))})
        return c

    def run(self, p, q, k, v, need_lse):
        call = self.describe_call(p, q.dtype, need_lse)
        self.last_call = call  # what `attest repro --export` renders (torch_export.py)
        bias, causal = call.args[3], call.args[10]
        if is_varlen(p):
            self.route = "aten._cudnn_attention_forward varlen" + (
                " is_causal" if causal else "") + (" + bias" if bias is not None else "")
        else:
            self.route = "aten._cudnn_attention_forward " + sdpa_route(bias, causal)
        return call.run_both({"q": q, "k": k, "v": v})

    def describe_call(self, p, dtype, need_lse=True, device=None):
        """The call run() makes, as data (torch_call.py): _cudnn_attention_forward(q, k, v
        ([B, H, S, D] views; packed [T, H, D]), attn_bias, cum_seq_q, cum_seq_k, max_q, max_k,
        True, 0.0, is_causal, False, scale=); o the first result (an error where it is None),
        lse the second in attest's layout."""
        device = self.device if device is None else device
        scale = aw.scale_of(p)
        lse = lse_call(tc.Index(tc.Ref("out"), 1), p) if need_lse else None
        out0 = tc.Index(tc.Ref("out"), 0)
        if is_varlen(p):
            causal_only = p.get("causal") and not has_window(p) and not extra_masks(p) and (
                not bottom_right(p) or square_everywhere(p))
            bias = None
            if any_mask(p) and not causal_only:
                # Per sequence, padded to [B, 1, max_q, max_k]: the layout the op expands a
                # packed batch's bias to (its error on a [1, 1, total_q, total_k] bias).
                bias = bias_call(padded_visible(p, device), dtype, 1, 16)
            cu = cu_data(p, device)
            # compute_log_sumexp always on: the backward reads the forward's stats.
            return tc.Call(aten_op("_cudnn_attention_forward"),
                           [tc.Ref("q"), tc.Ref("k"), tc.Ref("v"), bias, cu[0], cu[1],
                            p["seqlen_q"], p["seqlen_k"], True, 0.0, bool(causal_only), False],
                           {"scale": scale}, output=out0, lse=lse)
        # Bias rows 16-aligned, as SDPA's own mask preprocessing leaves them for its kernels.
        mask, is_causal = sdpa_mask(p, device, dtype, "additive", allow_is_causal=True,
                                    align=16, describe=True)
        views = [tc.Method(tc.Ref(n), "transpose", 1, 2) for n in ("q", "k", "v")]
        return tc.Call(aten_op("_cudnn_attention_forward"),
                       views + [mask, None, None, p["seqlen_q"], p["seqlen_k"], True, 0.0,
                                is_causal, False], {"scale": scale},
                       output=tc.Invoke(tc.Func(cudnn_output), out0, tc.Global("PROBLEM", p)),
                       lse=lse)
