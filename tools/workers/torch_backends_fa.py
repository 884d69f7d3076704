"""The FlashAttention adapter of tools/workers/torch_backends.py: any `flash_attn_func`
(FlashAttention-2/3 or -4 conventions, told apart by its signature) and its varlen sibling."""

import inspect

import torch

import attest_worker as aw
import torch_call as tc
from torch_backends_common import (window_of, has_window, is_varlen, bottom_right,
                                   diagonal_rules, square_everywhere, extra_masks, cu_tensor,
                                   lse_to_attest, Backend)

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
            kw["alibi_slopes"] = tc.Data("alibi_slopes", torch.tensor(
                p["alibi_slopes"], dtype=torch.float32, device=self.device))
        if "deterministic" in self.params:
            kw["deterministic"] = self.deterministic
        if self.fa4:
            kw["return_lse"] = need_lse
        elif need_lse:
            kw["return_attn_probs"] = True
        return kw

    def describe_call(self, p, dtype, need_lse=False, device=None):
        """The call run() makes, as data (torch_call.py): fn(q, k, v, **kwargs) on attest's
        own [B, S, H, D] layout, or for a packed batch the varlen function with
        cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k= as well; o the result's
        first element, lse (with need_lse) its second in attest's layout. (A FlashAttention-4
        mask_mod is a CuTe function: rendering such a call fails, and the export says so.)"""
        device = self.device if device is None else device
        kw = self._kwargs(p, need_lse)
        if isinstance(kw.get("alibi_slopes"), tc.Data):
            kw["alibi_slopes"].tensor = kw["alibi_slopes"].tensor.to(device)
        fn = self.fn
        if is_varlen(p):
            fn = self.varlen_fn
            kw = dict({"cu_seqlens_q": tc.Data("cu_seqlens_q", cu_tensor(p["cu_seqlens_q"],
                                                                         device)),
                       "cu_seqlens_k": tc.Data("cu_seqlens_k", cu_tensor(p["cu_seqlens_k"],
                                                                         device)),
                       "max_seqlen_q": p["seqlen_q"], "max_seqlen_k": p["seqlen_k"]}, **kw)
        target = tc.Attr(getattr(fn, "__module__", None) or "__main__",
                         getattr(fn, "__qualname__", None) or repr(fn), obj=fn)
        if need_lse:
            return tc.Call(target, [tc.Ref("q"), tc.Ref("k"), tc.Ref("v")], kw,
                           output=tc.Invoke(tc.Func(fa_first), tc.Ref("out")),
                           lse=tc.Invoke(FA_LSE, tc.Ref("out"), tc.Global("PROBLEM", p)))
        return tc.Call(target, [tc.Ref("q"), tc.Ref("k"), tc.Ref("v")], kw,
                       first_of_tuple=True)

    def run(self, p, q, k, v, need_lse):
        call = self.describe_call(p, q.dtype, need_lse)
        self.last_call = call  # what `attest repro --export` renders (torch_export.py)
        if is_varlen(p):
            self.route += ", varlen"
        return call.run_both({"q": q, "k": k, "v": v})


def fa_first(out):
    """o: the result's first element where it is a tuple."""
    return out[0] if isinstance(out, (tuple, list)) else out


def fa_lse(out, p):
    """lse, the result's second element, in attest's layout; an error where there is none."""
    if not isinstance(out, (tuple, list)) or len(out) < 2 or out[1] is None:
        raise ValueError("the function returned no lse")
    return lse_to_attest(out[1], p)


FA_LSE = tc.Func(fa_lse, deps=(is_varlen, lse_to_attest))
