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

PyTorch's SDPA backends are reached two ways. sdpa-math, sdpa-flash, sdpa-efficient and
sdpa-cudnn call the public F.scaled_dot_product_attention under sdpa_kernel([backend]) with the
masks models pass (SdpaMath, SdpaPublic): that is what models run, and what is judged as
"PyTorch's flash / memory-efficient / cuDNN attention". sdpa-flash+lse, sdpa-efficient+lse and
sdpa-cudnn+lse are extras that call the private aten ops behind those backends with masks this
module builds, to judge the kernels' lse and their cu_seqlens entries, which the public
function does not expose.

Capabilities follow what each API accepts on PyTorch 2.11 (its op schemas in
torch/include/ATen/ops/*_ops.h, the kernels' argument checks; the public routes measure theirs
when they start) and are re-measured on the GPU by tools/workers/torch_probe.py, which calls
every entry point with every feature (docs/gpu-results.md "What each API accepts").

The adapters live in five modules, all re-exported here (callers import only this one): the
PyTorch SDPA backends (public and +lse), AttestCallable, Runner and make here; what they share in
torch_backends_common.py; FlexAttention in torch_backends_flex.py; FlashAttention's
`flash_attn_func` conventions in torch_backends_fa.py; cuDNN's FP8 SDPA in
torch_backends_cudnn_fp8.py.
"""

import inspect
import sys

import torch

import attest_worker as aw
import torch_call as tc
from torch_backends_common import (  # noqa: F401  (re-exported: callers use tb.NAME)
    ENTRY, entry, TORCH_DTYPES, to_torch, to_tensor, window_of, has_window, is_varlen,
    bottom_right, diagonal_rules, square_everywhere, extra_masks, any_mask, covers, dense_visible,
    packed_visible, padded_visible, additive, alibi_bias, padded_extent, cu_tensor, lse_to_attest,
    sdpa_mask, sdpa_route, Backend,
)
from torch_backends_fa import FlashAttn
from torch_backends_cudnn_fp8 import CudnnFp8
from torch_backends_flex import Flex, flex_mods  # noqa: F401
from torch_backends_lse import SdpaFlashLse, SdpaEfficientLse, SdpaCudnnLse  # noqa: F401


# ---- PyTorch SDPA: the math backend through the public function ----

class SdpaMath(Backend):
    """F.scaled_dot_product_attention under sdpa_kernel(MATH): the public API users call.
    Masks through `attn_mask` (boolean, or additive with --mask-form additive; ALiBi always as a
    float32 additive mask, which SDPA accepts beside bf16/f16 inputs) or `is_causal` where it
    says the same (top-left, or every sequence square); GQA through `enable_gqa`. SDPA returns
    no lse ("lse": false) and has no varlen entry and no score hook (no softcap)."""

    name = "sdpa-math"
    input_strides = "any"
    sdp = "MATH"  # the SDPBackend `call` selects

    def caps(self):
        if getattr(self.args, "njt", False):
            return self.njt_caps()
        c = self.base_caps(self.dtype)
        c.update({"causal": True, "window": True, "documents": True, "prefix_lm": True,
                  "block_sparse": True, "alibi": True, "gqa": True, "deterministic": True,
                  "lse": False, "mask_forms": list(MASK_FORMS)})
        # The math backend upcasts bf16/f16 to fp32 and rounds o and the gradients once,
        # unless reduced-precision reductions are allowed (then it computes in the input dtype
        # and follows no recipe attest knows: the profile alone judges it). torch_probe.py
        # checks the upcast bit for bit against an fp32 call rounded once.
        if self.dtype in ("bf16", "f16") and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
            c["recipe"] = self.dtype + "-upcast"
        return c

    def run(self, p, q, k, v, need_lse):
        env = {"q": q, "k": k, "v": v}
        if getattr(self.args, "njt", False):
            call = self.describe_njt_call(p)
            self.route = "nested jagged" + (", is_causal" if call.kwargs["is_causal"] else "")
        else:
            call = self.describe_call(p, q.dtype)
            self.route = sdpa_route(tc.evaluate(call.kwargs["attn_mask"], env),
                                    call.kwargs["is_causal"])
        self.last_call = call  # what `attest repro --export` renders (torch_export.py)
        return call.run(env), None

    def describe_call(self, p, dtype, need_lse=False, device=None):
        """The call run() makes, as data (torch_call.py): fn(q, k, v [B, H, S, D] views of
        attest's [B, S, H, D] inputs, attn_mask=, is_causal=, scale=[, enable_gqa=True]) inside
        context(), o transposed back; the result's first element where it is a tuple (a
        function that also returns its weights)."""
        mask, is_causal = self.mask(p, dtype)
        if mask is not None and not isinstance(mask, tc.Invoke):
            mask = tc.Data("attn_mask", mask)
        kw = {"attn_mask": mask, "is_causal": is_causal, "scale": aw.scale_of(p)}
        if p["heads_q"] != p["heads_kv"]:
            kw["enable_gqa"] = True
        views = [tc.Method(tc.Ref(n), "transpose", 1, 2) for n in ("q", "k", "v")]
        return tc.Call(self.target(), views, kw, context=self.context(),
                       output=tc.Method(tc.Ref("out"), "transpose", 1, 2), first_of_tuple=True)

    def target(self):
        """The function called: the public F.scaled_dot_product_attention."""
        return tc.Attr("torch.nn.functional", "scaled_dot_product_attention",
                       obj=entry("scaled_dot_product_attention"))

    def context(self):
        """sdpa_kernel([SDPBackend.<sdp>]): the backend the call selects."""
        return tc.Invoke(tc.Attr("torch.nn.attention", "sdpa_kernel"),
                         [tc.Attr("torch.nn.attention", f"SDPBackend.{self.sdp}")])

    def describe_njt_call(self, p):
        """--njt: the call as data (torch_call.py), the problem as nested jagged tensors
        [B, H, j, D], the form in which models hand SDPA a packed batch:
        torch.nested.nested_tensor_from_jagged over the packed tokens and the cumulative
        lengths (a dense batch as B sequences of one length, its [B, S, H, D] tokens
        reshaped to [B*S, H, D]). The only mask a nested call takes is `is_causal`
        (torch/nested/_internal/sdpa.py); GQA through `enable_gqa`. o comes back as the
        nested result's packed values (reshaped to [B, Sq, Hq, Dv] for a dense batch)."""
        if is_varlen(p):
            cq, ck = p["cu_seqlens_q"], p["cu_seqlens_k"]
            packed = [tc.Ref(n) for n in ("q", "k", "v")]  # already packed [total, H, D]
        else:
            b, sq, sk = p["batch"], p["seqlen_q"], p["seqlen_k"]
            cq, ck = [i * sq for i in range(b + 1)], [i * sk for i in range(b + 1)]
            packed = [tc.Method(tc.Ref(n), "flatten", 0, 1) for n in ("q", "k", "v")]
        off_q = tc.Data("offsets_q", torch.tensor(cq, dtype=torch.int64, device=self.device))
        # k and v from one offsets tensor: SDPA requires them to share their ragged dimension.
        off_k = tc.Data("offsets_k", torch.tensor(ck, dtype=torch.int64, device=self.device))
        nest = tc.Attr("torch.nested", "nested_tensor_from_jagged",
                       obj=torch.nested.nested_tensor_from_jagged)
        views = [tc.Method(tc.Invoke(nest, x, off), "transpose", 1, 2)
                 for x, off in zip(packed, (off_q, off_k, off_k))]
        kw = {"is_causal": bool(p.get("causal")), "scale": aw.scale_of(p)}
        if p["heads_q"] != p["heads_kv"]:
            kw["enable_gqa"] = True
        out = tc.Method(tc.Method(tc.Ref("out"), "transpose", 1, 2), "values")
        if not is_varlen(p):
            out = tc.Method(out, "unflatten", 0, (p["batch"], p["seqlen_q"]))
        return tc.Call(self.target(), views, kw, context=self.context(), output=out,
                       first_of_tuple=True)

    def njt_caps(self):
        """--njt: what the public function takes as nested jagged tensors on this backend,
        measured as SdpaPublic.caps measures (a small packed problem per feature, forward and
        backward). Packed batches and `is_causal`, which SDPA documents as top-left and which
        is the only causal form a nested call can state: causal_top_left_only. No attn_mask
        (windows, documents, prefix-LM, block-sparse, ALiBi), no lse, no recipe."""
        refused = {}

        def ok(feature, lens_q=(5, 7), lens_k=(7, 9), **kw):
            why = njt_refusal(self, lens_q, lens_k, **kw)
            if why is not None:
                refused[feature] = why
            return why is None

        if not ok("a packed batch (5, 7) x (7, 9)"):
            raise RuntimeError(f"{self.name} --njt: F.scaled_dot_product_attention refuses "
                               f"nested jagged tensors: {refused}")
        c = self.base_caps(self.dtype)
        square = ok("is_causal, q_len = k_len", lens_q=(5, 7), lens_k=(5, 7), causal=True)
        top_left = ok("is_causal, q_len != k_len", causal=True, causal_align="top_left")
        c.update({"varlen": True, "causal": square and top_left, "lse": False,
                  "gqa": ok("enable_gqa (4:2)", heads_q=4),
                  "deterministic": self.sdp == "MATH"})
        if c["causal"]:
            c["causal_top_left_only"] = True
        if not ok("Dv != D (16, 8)", head_dim=16, head_dim_v=8):
            c["same_head_dim_v"] = True
        step = 1 if ok("head dim 12", head_dim=12) else 8
        top = 64
        for d in (128, 192, 256, 320):
            if not ok(f"head dim {d}", head_dim=d):
                break
            top = d
        c["head_dims"] = c["head_dims_v"] = list(range(step, top + 1, step))
        shapes = {}
        if not ok("a sequence with q_len 0", lens_q=(5, 0, 7), lens_k=(7, 3, 9)):
            shapes["min_seqlen_q"] = 1
        if not ok("a sequence with k_len 0", lens_q=(5, 3, 7), lens_k=(7, 0, 9)):
            shapes["min_seqlen_k"] = 1
        if shapes:
            c["shapes"] = shapes
        for feature, r in refused.items():
            print(f"{self.name} --njt: refused, {feature}: {r}", file=sys.stderr)
        self.refused = refused
        return c

    def mask(self, p, dtype):
        """(attn_mask, is_causal) as a model passes them (sdpa_mask): in the form the problem
        names (a suite's mask-form rows), else --mask-form's, is_causal where it says the same
        unless the problem names a form."""
        form = p.get("mask_form") or self.args.mask_form
        return sdpa_mask(p, self.device, dtype, form, allow_is_causal=not p.get("mask_form"))



class SdpaCallable(SdpaMath):
    """A user's function in SDPA's calling convention, fn(q, k, v, attn_mask=None,
    is_causal=False, scale=None[, enable_gqa=False]) on [B, H, S, D], returning o (the Python
    package's api="sdpa", python/attest/_kernel.py): called the way SdpaMath calls
    F.scaled_dot_product_attention. It claims what that convention can say (masks as
    `attn_mask`, ALiBi as a float mask, GQA where the function takes `enable_gqa`), no lse,
    no recipe."""

    name = "sdpa-callable"
    sdp = None  # the user's function selects its own
    input_strides = "inner"  # not the math backend's "any": a user's kernel, as models call it

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

    def target(self):
        """The user's function, named by its module and qualified name."""
        return tc.Attr(getattr(self.fn, "__module__", None) or "__main__",
                       getattr(self.fn, "__qualname__", None) or repr(self.fn), obj=self.fn)

    def context(self):
        return None


# The forms of an attn_mask (attest's problem "mask_form", reference/problem/problem.h).
MASK_FORMS = ("bool", "additive", "additive_f32")


def njt_refusal(backend, lens_q, lens_k, causal=False, causal_align="bottom_right", heads_q=2,
                head_dim=16, head_dim_v=None):
    """None if `backend.run` (its --njt route) takes the packed problem of these lengths,
    forward and backward through autograd, else its error's last line."""
    cq, ck = [0], [0]
    for a, b in zip(lens_q, lens_k):
        cq.append(cq[-1] + a)
        ck.append(ck[-1] + b)
    dv = head_dim if head_dim_v is None else head_dim_v
    p = _measure_problem(backend.dtype, batch=len(lens_q), seqlen_q=max(lens_q),
                         seqlen_k=max(lens_k), causal=causal, causal_align=causal_align,
                         heads_q=heads_q, head_dim=head_dim, head_dim_v=dv)
    p["cu_seqlens_q"], p["cu_seqlens_k"] = cq, ck
    return call_refusal(backend, p, ((cq[-1], heads_q, head_dim), (ck[-1], 2, head_dim),
                                      (ck[-1], 2, dv)))


def call_refusal(backend, p, shapes):
    """None if `backend.run` takes the problem `p` on random q, k, v of these shapes, forward
    and backward through autograd, else its error's last line."""
    import warnings
    dt = TORCH_DTYPES[backend.dtype]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g).to(dt).to(backend.device).requires_grad_(True)
               for s in shapes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA warns why it declines; we keep the error
            with torch.no_grad():
                backend.run(p, q, k, v, need_lse=False)
            with torch.enable_grad():
                o, _ = backend.run(p, q, k, v, need_lse=False)
                torch.autograd.grad(o, (q, k, v), grad_outputs=torch.ones_like(o))
            if backend.device.type == "cuda":
                torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a refusal is what is measured
        lines = f"{type(e).__name__}: {e}".strip().splitlines()
        return lines[-1][:200] if lines else type(e).__name__
    return None


# ---- PyTorch SDPA's fused backends through the public function ----

# The backend names of the public routes and the SDPBackend each selects.
SDPA_PUBLIC = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
               "sdpa-cudnn": "CUDNN_ATTENTION"}


def _measure_problem(dtype, **kw):
    """A small problem (B 1, H 2, 8 x 8, D 16) for SdpaPublic's measurement of its claim."""
    p = {"batch": 1, "heads_q": 2, "heads_kv": 2, "seqlen_q": 8, "seqlen_k": 8,
         "head_dim": 16, "head_dim_v": 16, "dtype": dtype, "scale": None, "causal": False,
         "causal_align": "bottom_right", "window": [-1, -1], "softcap": 0.0,
         "alibi_slopes": None, "cu_seqlens_q": None, "cu_seqlens_k": None}
    p.update(kw)
    if "head_dim" in kw and "head_dim_v" not in kw:
        p["head_dim_v"] = kw["head_dim"]
    return p


class SdpaPublic(SdpaMath):
    """F.scaled_dot_product_attention under sdpa_kernel([SDPBackend.X]), X = FLASH_ATTENTION,
    EFFICIENT_ATTENTION or CUDNN_ATTENTION: the entry point models call, with the masks models
    pass, so that what PyTorch does between that call and the kernel (its backend choice, mask
    conversion and padding, GQA handling, head-dim padding, its own backward) is judged with
    the kernel. Masks as SdpaMath builds them (`attn_mask` boolean or additive in the input
    dtype with --mask-form, ALiBi as a float32 mask, `is_causal` where it says the same, GQA by
    `enable_gqa`); a backend that takes no `attn_mask` (flash) gets bottom-right causal with
    Sq != Sk as torch.nn.attention.bias.causal_lower_right, the public mask object that
    PyTorch's own refusal of is_causal with Sq != Sk points to, which SDPA dispatches to the
    flash kernel's causal flag (torch/nn/attention/bias.py, CausalBias._dispatch).

    The claim is measured, not assumed: caps() runs this adapter's own run() on one small
    problem per feature, forward and backward, and claims what the public function accepts
    on this backend, this GPU and this PyTorch (as the cuDNN FP8 adapter measures its graphs);
    what it refuses is printed on stderr. No lse (the public function returns o alone:
    "lse": false; the +lse backends judge the kernels' lse through the private ops). No
    varlen here: packed batches reach the public function as nested jagged tensors, which take
    no attn_mask (torch/nested/_internal/sdpa.py); --njt (describe_njt_call) is that route, every
    problem as nested tensors with `is_causal` claimed top-left as SDPA documents it
    (causal_top_left_only), so that a backend whose nested causal is FlashAttention's
    bottom-right fails the gate's "varlen causal top-left" row (docs/gpu-results.md P3)."""

    input_strides = "inner"  # the fused backends: last dimension contiguous

    def __init__(self, args, name):
        super().__init__(args)
        self.name = name
        self.sdp = SDPA_PUBLIC[name]
        self.causal_bias = False  # bottom-right causal through CausalBias (set by caps)
        self._caps = None

    def mask(self, p, dtype):
        causal_only = (p.get("causal") and not has_window(p) and not extra_masks(p) and
                       p.get("alibi_slopes") is None)
        if (self.causal_bias and causal_only and bottom_right(p) and
                p["seqlen_q"] != p["seqlen_k"]):
            return tc.Invoke(tc.Attr("torch.nn.attention.bias", "causal_lower_right"),
                             p["seqlen_q"], p["seqlen_k"]), False
        return super().mask(p, dtype)

    def refusal(self, **kw):
        """None if the public function takes the problem `kw` describes (forward, and backward
        through autograd), else its error's last line."""
        p = _measure_problem(self.dtype, **kw)
        return call_refusal(self, p, ((p["batch"], p["seqlen_q"], p["heads_q"], p["head_dim"]),
                                      (p["batch"], p["seqlen_k"], p["heads_kv"], p["head_dim"]),
                                      (p["batch"], p["seqlen_k"], p["heads_kv"],
                                       p["head_dim_v"])))

    def caps(self):
        if self._caps is not None:
            return dict(self._caps)
        if getattr(self.args, "njt", False):
            self._caps = self.njt_caps()
            return dict(self._caps)
        t = self.refusal
        why = t()
        if why is not None:
            raise RuntimeError(f"{self.name}: F.scaled_dot_product_attention under "
                               f"sdpa_kernel([{self.sdp}]) refuses a plain 8 x 8 problem: {why}")
        refused = {}

        def ok(feature, **kw):
            r = t(**kw)
            if r is not None:
                refused[feature] = r
            return r is None

        masks = ok("attn_mask (window, documents, prefix-LM, block-sparse)",
                   window=[2, 1], seqlen_q=5, seqlen_k=7)
        # Where no attn_mask is taken, bottom-right causal with Sq != Sk is a CausalBias.
        self.causal_bias = not masks
        square = ok("is_causal", causal=True)
        top_left = ok("is_causal with Sq != Sk (top-left)", causal=True,
                      causal_align="top_left", seqlen_q=5, seqlen_k=7)
        bottom_right = ok("causal bottom-right with Sq > Sk (" +
                          ("CausalBias" if self.causal_bias else "attn_mask") + ")",
                          causal=True, seqlen_q=7, seqlen_k=5)
        c = self.base_caps(self.dtype)
        c.update({"causal": square and bottom_right, "window": masks, "documents": masks,
                  "prefix_lm": masks, "block_sparse": masks,
                  "alibi": ok("ALiBi (a float32 attn_mask)", alibi_slopes=[0.5, 0.25],
                              seqlen_q=5, seqlen_k=7),
                  "gqa": ok("enable_gqa (4:2)", heads_q=4), "lse": False})
        # The attn_mask forms this backend takes, each measured on a windowed problem.
        c["mask_forms"] = [f for f in MASK_FORMS
                           if masks and ok(f"attn_mask as {f}", window=[2, 1], seqlen_q=5,
                                           seqlen_k=7, mask_form=f)]
        if not c["mask_forms"]:
            del c["mask_forms"]
        if c["causal"] and not top_left:
            c["causal_bottom_right_only"] = True
        if not ok("Dv != D (16, 8)", head_dim=16, head_dim_v=8):
            c["same_head_dim_v"] = True
        # Head dims: any, or multiples of 8 (D = 12 decides), up to the largest of 128, 192,
        # 256, 320 that the backend takes with every smaller one.
        step = 1 if ok("head dim 12", head_dim=12) else 8
        top = 64
        for d in (128, 192, 256, 320):
            if not ok(f"head dim {d}", head_dim=d):
                break
            top = d
        c["head_dims"] = c["head_dims_v"] = list(range(step, top + 1, step))
        shapes = {}
        if not ok("Sq = 0", seqlen_q=0):
            shapes["min_seqlen_q"] = 1
            if not ok("Sq = 1", seqlen_q=1):
                shapes["min_seqlen_q"] = 2
        if not ok("Sk = 0", seqlen_k=0):
            shapes["min_seqlen_k"] = 1
        if not ok("Sk = 1", seqlen_k=1):
            shapes["min_seqlen_k"] = 2
        if shapes:
            c["shapes"] = shapes
        for feature, r in refused.items():
            print(f"{self.name}: refused, {feature}: {r}", file=sys.stderr)
        self.refused = refused
        self._caps = c
        return dict(c)


# ---- Any function in attest's own layout ----

class AttestCallable(Backend):
    """A user's function in attest's own convention (the Python package's api="attest",
    docs/python.md): fn(problem, q, k, v) with the case file's problem object (a dict) and
    tensors in attest's layout ([B, S, H, D], packed [total, H, D]), returning o or (o, lse)
    with lse [B, Hq, Sq] (packed [Hq, total]). Every mask, score rule and varlen layout is the
    function's to read from `problem`; it claims exactly the capabilities it is given."""

    name = "attest-callable"
    input_strides = "contiguous"  # what `caps` says, else attest's contiguous layout

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
        # Where the tensors live (docs/protocol.md "device"): with --oracle-device auto, attest
        # runs the float64 oracle on the GPU for a CUDA kernel.
        if str(getattr(backend, "device", "cpu")).startswith("cuda"):
            self.caps["device"] = "cuda"
        if backend.input_strides != "contiguous":  # the default, not written
            self.caps.setdefault("strides", backend.input_strides)
        self.caps.update(caps or {})
        # A backend whose API has its own backward entry (cuDNN's FP8 SDPA) calls it itself.
        self.explicit_backward = backward or getattr(backend, "backward", None)

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
    if b in ("sdpa-efficient", "sdpa-cudnn", "sdpa-efficient+lse", "sdpa-cudnn+lse") and \
            args.device == "cpu":
        raise ValueError(f"{b} exists on CUDA only")
    if getattr(args, "njt", False):
        if b != "sdpa-math" and b not in SDPA_PUBLIC:
            raise ValueError(f"--njt is for sdpa-math and the public SDPA routes, not {b}")
        s = SdpaMath(args) if b == "sdpa-math" else SdpaPublic(args, b)
        s.name = b + "-njt"
        s.input_strides = "contiguous"  # the packed values are made from the inputs' tokens
        return s
    if b == "sdpa-math":
        return SdpaMath(args)
    if b in SDPA_PUBLIC:
        return SdpaPublic(args, b)
    table = {"sdpa-flash+lse": SdpaFlashLse, "sdpa-efficient+lse": SdpaEfficientLse,
             "sdpa-cudnn+lse": SdpaCudnnLse}
    if b in table:
        return table[b](args)
    if b in ("flex", "flex-triton"):
        return Flex(args, "TRITON")
    if b == "flex-flash":
        return Flex(args, "FLASH")
    if b == "cudnn-fp8":
        return CudnnFp8(args)
    if b == "fa4":
        return FlashAttn(args, "flash_attn.cute", "flash_attn_func")
    if b.startswith("fa:"):
        _, module, func = b.split(":", 2)
        return FlashAttn(args, module, func)
    raise ValueError(f"unknown backend {b!r}")
