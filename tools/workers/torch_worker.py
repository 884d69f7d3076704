#!/usr/bin/env python3
"""PyTorch attention backends as an attest exec worker (DESIGN.md "External kernels";
docs/protocol.md): `exec:python3 tools/workers/torch_worker.py --backend B [--device cuda]`.

Backends and what each claims (REFERENCES.md "API facts"; PyTorch 2.11):
  sdpa-math       F.scaled_dot_product_attention, math backend. Every mask family as an
                  explicit boolean mask, ALiBi as a float32 additive bias; no softcap (SDPA
                  has no score hook). lse is not returned by SDPA: it is computed here in
                  float32 from the same scores (logsumexp), and said so in the route.
  sdpa-flash      aten._scaled_dot_product_flash_attention (returns logsumexp). No attn_mask
                  at all, so only causal: SDPA's is_causal is aligned top-left; attest's
                  bottom-right causal is mapped onto it exactly (see _causal_plan). No
                  window / ALiBi / documents / softcap.
  sdpa-efficient  aten._scaled_dot_product_efficient_attention (compute_log_sumexp). Masks
                  as an additive bias (its rows 16-aligned as the kernel requires); GQA by
                  repeating kv heads (the backend rejects enable_gqa); no ALiBi claim (the
                  bias would be rounded to the input dtype), no softcap.
  sdpa-cudnn      aten._scaled_dot_product_cudnn_attention (compute_log_sumexp). Causal only
                  (is_causal, mapped like flash); head dims up to 128; GQA by repeating.
  flex            torch.nn.attention.flex_attention under torch.compile, return_lse=True:
                  masks as a BlockMask from a mask_mod, softcap and ALiBi as a score_mod,
                  GQA with enable_gqa.
  fa:MOD:FUNC     any flash_attn_func-compatible callable (flash-attention 2/3, the RDNA3
                  and Blackwell packages): causal is bottom-right, window_size, softcap,
                  alibi_slopes natively; lse from return_attn_probs=True. --caps overrides the
                  claim for implementations that lack a feature.
Backward is autograd through the same op with the given dO. Packed varlen runs one
sequence at a time. Kernels that need one head dim for q, k, v (flash, cudnn, fa:) get
zero columns when Dv != D (exact: q·k and P·v unchanged, the scale passed explicitly).
On CPU (--device cpu, for testing this worker without a GPU): sdpa-flash runs PyTorch's CPU
flash kernel (aten._scaled_dot_product_flash_attention_for_cpu), flex runs eager (unfused)
and forward-only (FlexAttention has no CPU backward), efficient and cudnn do not exist. Inputs stay in the problem's dtype (bf16 or f16); o and the gradients
are returned in that dtype, lse in float32.
"""

import argparse
import contextlib
import json
import math
import sys

import numpy as np

import attest_worker as aw

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # describe then fails with this message on stderr
    print(f"torch_worker: cannot import torch: {e}", file=sys.stderr)
    sys.exit(3)

# ---- Capabilities per backend ----

_MASKS_ALL = {"causal": True, "window": True, "documents": True, "prefix_lm": True,
              "block_sparse": True}


def capabilities(backend, dtype, device):
    caps = {"dtypes": [dtype], "head_dims": [], "head_dims_v": [], "varlen": True, "gqa": True,
            "backward": True, "deterministic": False, "profile": dtype}
    if backend == "sdpa-math":
        caps.update(_MASKS_ALL)
        caps.update({"alibi": True, "deterministic": True})
        if dtype == "f32":
            caps["profile"] = "f32"
    elif backend == "sdpa-flash":
        # Flash: head dims multiple of 8 up to 256 (PyTorch sdp_utils check_head_dim_size_flash);
        # Dv must equal D.
        caps.update({"causal": True, "head_dims": list(range(8, 257, 8)),
                     "head_dims_v": list(range(8, 257, 8))})
    elif backend == "sdpa-efficient":
        caps.update(_MASKS_ALL)
    elif backend == "sdpa-cudnn":
        caps.update({"causal": True, "head_dims": [32, 64, 96, 128],
                     "head_dims_v": [32, 64, 96, 128]})
    elif backend == "flex":
        caps.update(_MASKS_ALL)
        caps.update({"softcap": True, "alibi": True,
                     "head_dims": [16, 32, 64, 128]})
        # FlexAttention has no backward on CPU, compiled or eager (PyTorch 2.11-2.15).
        caps["backward"] = device != "cpu"
    elif backend.startswith("fa:"):
        caps.update({"causal": True, "window": True, "softcap": True, "alibi": True,
                     "head_dims": list(range(8, 257, 8)), "head_dims_v": list(range(8, 257, 8)),
                     "empty_row_lse": "+inf"})
    return caps


# ---- Tensors between NumPy codes and torch ----

_TORCH = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def to_torch(t, dtype, device):
    """An input Tensor (codes in the problem's dtype) as a torch tensor, exactly."""
    if t.dtype == "BF16":
        x = torch.from_numpy(t.data.view(np.int16).copy()).view(torch.bfloat16)
    elif t.dtype in ("F16", "F32", "F64"):
        x = torch.from_numpy(t.data.copy())
    else:
        raise ValueError(f"input dtype {t.dtype} is not handled")
    return x.to(device=device, dtype=_TORCH[dtype])


def to_tensor(x):
    """A torch tensor back to a protocol Tensor in its own dtype (bf16 as codes)."""
    x = x.detach().to("cpu").contiguous()
    if x.dtype == torch.bfloat16:
        return aw.Tensor(x.view(torch.int16).numpy().view(np.uint16), "BF16")
    if x.dtype == torch.float16:
        return aw.Tensor(x.numpy(), "F16")
    return aw.Tensor(x.float().numpy(), "F32")


# ---- Mask planning ----

def _causal_plan(problem, ql, kl):
    """How a causal problem maps onto top-left `is_causal` (flash, cudnn). Returns
    (rows_empty, pad_q): bottom-right causal with Sq > Sk leaves the first Sq - Sk rows empty
    and runs the last Sk rows square; with Sq < Sk it is top-left causal over Sk - Sq dummy
    queries prepended (zero dO: they contribute exactly nothing to dk, dv)."""
    if problem.get("causal_align", "bottom_right") == "top_left" or ql == kl:
        return 0, 0
    if ql > kl:
        return ql - kl, 0
    return 0, kl - ql


def _only_causal(problem):
    w = problem.get("window", [-1, -1])
    return (w == [-1, -1] and not problem.get("prefix_lm") and
            problem.get("document_ids_q") is None and problem.get("block_sparse") is None)


def _pad_last(x, n):
    """x with its last axis zero-padded to n (a view-preserving cat, so autograd slices the
    gradient back)."""
    if x.shape[-1] == n:
        return x
    return torch.cat([x, x.new_zeros(x.shape[:-1] + (n - x.shape[-1],))], -1)


class Worker:
    def __init__(self, args):
        self.backend = args.backend
        self.dtype = args.dtype
        self.device = torch.device(args.device)
        self.caps = capabilities(args.backend, args.dtype, args.device)
        if args.caps:
            self.caps.update(json.loads(args.caps))
        self.fa = None
        if self.backend.startswith("fa:"):
            _, module, func = self.backend.split(":", 2)
            import importlib
            self.fa = getattr(importlib.import_module(module), func)
        self.flex = None
        if self.backend == "flex":
            from torch.nn.attention.flex_attention import flex_attention, create_block_mask
            # torch.compile is the real (fused) kernel; on CPU it has no backward and no
            # return_lse (PyTorch 2.11-2.15), so CPU runs use the eager, unfused reference
            # implementation: it tests this worker's masks and score_mods, not the kernel.
            self.flex_eager = self.device.type == "cpu"
            # Every new shape is a recompile; keep shapes static (a captured mask tensor does
            # not survive dynamic-shape tracing) and allow as many as a suite has.
            import torch._dynamo as dynamo
            dynamo.config.automatic_dynamic_shapes = False
            for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                         "accumulated_recompile_limit"):
                if hasattr(dynamo.config, knob):
                    setattr(dynamo.config, knob, 4096)
            try:  # return_aux replaces return_lse (deprecated since 2.9)
                from torch.nn.attention.flex_attention import AuxRequest
                self.flex_aux = AuxRequest(lse=True)
            except ImportError:
                self.flex_aux = None
            self.flex = (flex_attention if self.flex_eager else
                         torch.compile(flex_attention, dynamic=False))
            self.create_block_mask = create_block_mask
        self.route = ""

    def describe(self):
        caps = dict(self.caps)
        name = f"torch-{self.backend}-{self.dtype}"
        return name, caps

    def check(self, problem):
        c = self.caps
        if problem["dtype"] not in c["dtypes"]:
            raise aw.Unsupported(f"dtype {problem['dtype']}")
        if c.get("head_dims") and problem["head_dim"] not in c["head_dims"]:
            raise aw.Unsupported(f"head_dim {problem['head_dim']}")
        if c.get("head_dims_v") and problem["head_dim_v"] not in c["head_dims_v"]:
            raise aw.Unsupported(f"head_dim_v {problem['head_dim_v']}")
        if problem.get("softcap", 0) and not c.get("softcap"):
            raise aw.Unsupported("softcap")
        if problem.get("alibi_slopes") is not None and not c.get("alibi"):
            raise aw.Unsupported("alibi")
        if problem.get("causal") and not c.get("causal"):
            raise aw.Unsupported("causal")
        if problem.get("window", [-1, -1]) != [-1, -1] and not c.get("window"):
            raise aw.Unsupported("window")
        if problem.get("document_ids_q") is not None and not c.get("documents"):
            raise aw.Unsupported("documents")
        if problem.get("prefix_lm") and not c.get("prefix_lm"):
            raise aw.Unsupported("prefix_lm")
        if problem.get("block_sparse") is not None and not c.get("block_sparse"):
            raise aw.Unsupported("block_sparse")

    # -- one sequence: q [1, ql, Hq, D], k/v [1, kl, Hkv, *] (attest layout) -> o, lse --
    def attend(self, problem, b, q, k, v):
        hq, hkv = problem["heads_q"], problem["heads_kv"]
        ql, kl = q.shape[1], k.shape[1]
        scale = aw.scale_of(problem)
        vis_np, off = aw.visible(problem, b, ql, kl)
        if self.backend.startswith("fa:"):
            return self._fa(problem, q, k, v, scale)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # [1, H, S, D]
        if self.backend == "flex":
            # Contiguous [1, H, S, D]: compiled flex on the transposed views failed in the
            # inductor lowering on CUDA (PyTorch 2.11, H200, 2026-12-02).
            qt, kt, vt = (x.contiguous() for x in (qt, kt, vt))
            return self._flex(problem, qt, kt, vt, scale, vis_np, off)
        if self.backend in ("sdpa-flash", "sdpa-cudnn") or (
                self.backend == "sdpa-efficient" and _only_causal(problem)):
            # No mask, or causal alone: the kernel's own is_causal path (no bias tensor).
            return self._is_causal_backend(problem, qt, kt, vt, scale)
        vis = torch.from_numpy(vis_np).to(self.device)
        if self.backend == "sdpa-efficient":
            rep = hq // hkv
            kt, vt = kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1)
            kpad = -(-kl // 16) * 16
            bias = torch.full((1, hq, ql, kpad), -math.inf, dtype=qt.dtype, device=self.device)
            bias[..., :kl].masked_fill_(vis, 0.0)
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                qt, kt, vt, bias[..., :kl], True, 0.0, False, scale=scale)
            return out[0].transpose(1, 2), out[1][..., :ql]
        # sdpa-math: public SDPA on the math backend; lse computed from the same scores.
        from torch.nn.attention import sdpa_kernel, SDPBackend
        mask = vis[None, None]
        if problem.get("alibi_slopes") is not None:
            slopes = torch.tensor(problem["alibi_slopes"], dtype=torch.float32,
                                  device=self.device)
            i = torch.arange(ql, device=self.device)[:, None]
            j = torch.arange(kl, device=self.device)[None, :]
            dist = (i + off - j).abs().float()
            mask = torch.where(vis, -slopes[:, None, None] * dist, -math.inf)[None]
        with sdpa_kernel([SDPBackend.MATH]):
            o = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale,
                                               enable_gqa=hq != hkv)
        with torch.no_grad():
            kr = kt.repeat_interleave(hq // hkv, 1).float()
            s = (qt.float() @ kr.transpose(-1, -2)) * scale
            s = s + mask if mask.dtype != torch.bool else s.masked_fill(~mask, -math.inf)
            lse = torch.logsumexp(s, dim=-1)
        self.route = "lse computed by the worker (fp32 logsumexp of the same scores)"
        return o.transpose(1, 2), lse

    def _native_bottom_right(self):
        """PyTorch's CUDA flash kernel is FlashAttention-2 (>= 2.1), whose causal mask is
        aligned bottom-right when Sq != Sk (SDPA's public path refuses that case, see
        sdp_utils check_flash_causal_non_square_seqlens; the aten op called here does not);
        efficient and cudnn align top-left like SDPA's is_causal. Measured on the H200:
        mapping top-left onto the flash op as if it were top-left gave lse off by 4.1."""
        return self.backend == "sdpa-flash" and self.device.type != "cpu"

    def _top_left_on_bottom_right(self, problem, qt, kt, vt, scale):
        """Top-left causal with Sq != Sk on a kernel whose causal mask is bottom-right:
        Sq < Sk: append Sk - Sq dummy queries (a square run, where both alignments agree)
        and drop their rows (their dO is zero: nothing reaches dk, dv). Sq > Sk: the first
        Sk rows are square causal, the rest see every key (a non-causal run)."""
        ql, kl = qt.shape[2], kt.shape[2]
        square = dict(problem, causal_align="bottom_right")
        if ql < kl:
            qpad = torch.cat([qt, qt.new_zeros(qt.shape[:2] + (kl - ql, qt.shape[3]))], 2)
            o, lse = self._is_causal_backend(square, qpad, kt, vt, scale)
            route = self.route
            self.route = (route + "; " if route else "") + (
                f"top-left causal run square with {kl - ql} dummy queries appended")
            return o[:, :ql], lse[:, :, :ql]
        o1, l1 = self._is_causal_backend(square, qt[:, :, :kl], kt, vt, scale)
        o2, l2 = self._is_causal_backend(dict(problem, causal=False), qt[:, :, kl:], kt, vt,
                                         scale)
        self.route = f"top-left causal split: {kl} square causal rows + {ql - kl} full rows"
        return torch.cat([o1, o2], 1), torch.cat([l1, l2], 2)

    def _is_causal_backend(self, problem, qt, kt, vt, scale):
        hq, hkv = problem["heads_q"], problem["heads_kv"]
        ql, kl = qt.shape[2], kt.shape[2]
        causal = bool(problem.get("causal"))
        if (causal and ql != kl and self._native_bottom_right() and
                problem.get("causal_align", "bottom_right") == "top_left"):
            return self._top_left_on_bottom_right(problem, qt, kt, vt, scale)
        empty, pad = _causal_plan(problem, ql, kl) if causal else (0, 0)
        o = torch.zeros(qt.shape[:3] + (vt.shape[-1],), dtype=qt.dtype, device=self.device)
        lse = torch.full(qt.shape[:3], -math.inf, dtype=torch.float32, device=self.device)
        # Kernels that need one head dim for q, k and v get zero columns: q·k and P·v are
        # unchanged (the scale is passed explicitly), o is sliced back to Dv.
        dv = vt.shape[-1]
        # The efficient kernel takes Dv != D as it is (padding v to D broke Dv > D on the
        # H200, 2026-12-02); the others get one padded head dim.
        dmax = max(qt.shape[-1], dv)
        if self.backend != "sdpa-efficient":
            qt, kt, vt = _pad_last(qt, dmax), _pad_last(kt, dmax), _pad_last(vt, dmax)
        if self.backend != "sdpa-efficient" and (dmax != dv or dmax != problem["head_dim"]):
            self.route = f"head dims padded to {dmax} with zero columns"
        qrun = qt[:, :, empty:]
        if pad:
            qrun = torch.cat([qrun.new_zeros(qrun.shape[:2] + (pad, qrun.shape[3])), qrun], 2)
        if hq != hkv:  # GQA by repeating kv heads (autograd sums dk, dv over each group)
            kt, vt = kt.repeat_interleave(hq // hkv, 1), vt.repeat_interleave(hq // hkv, 1)
        if self.backend == "sdpa-flash" and self.device.type == "cpu":
            # PyTorch's CPU flash kernel (what SDPA's flash backend runs on CPU): lets the
            # mapping above be tested without a GPU.
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qrun, kt, vt, 0.0, causal, scale=scale)
        elif self.backend == "sdpa-flash":
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                qrun, kt, vt, 0.0, causal, False, scale=scale)
        elif self.backend == "sdpa-efficient":
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                qrun, kt, vt, None, True, 0.0, causal, scale=scale)
        else:
            out = torch.ops.aten._scaled_dot_product_cudnn_attention(
                qrun, kt, vt, None, True, 0.0, causal, False, scale=scale)
        orun, lrun = out[0], out[1].reshape(out[1].shape[0], out[1].shape[1], -1)[..., :qrun.shape[2]]
        # Stitch: rows [empty:] from the run (minus the pad rows); the empty rows stay 0 / -inf.
        o = torch.cat([o[:, :, :empty], orun[:, :, pad:, :dv]], 2)
        lse = torch.cat([lse[:, :, :empty], lrun[:, :, pad:].float()], 2)
        if empty or pad:
            self.route += f"; bottom-right causal mapped onto is_causal (empty {empty}, pad {pad})"
        return o.transpose(1, 2), lse

    def _flex(self, problem, qt, kt, vt, scale, vis_np, off):
        hq, hkv = problem["heads_q"], problem["heads_kv"]
        ql, kl = qt.shape[2], kt.shape[2]
        vis = torch.from_numpy(vis_np).to(self.device)

        def mask_mod(b, h, q_idx, kv_idx):
            return vis[q_idx, kv_idx]

        cap = float(problem.get("softcap", 0.0) or 0.0)
        slopes = problem.get("alibi_slopes")
        slopes_t = (torch.tensor(slopes, dtype=torch.float32, device=self.device)
                    if slopes is not None else None)

        def score_mod(score, b, h, q_idx, kv_idx):
            s = score
            if cap > 0:
                s = cap * torch.tanh(s / cap)
            if slopes_t is not None:
                s = s - slopes_t[h] * (q_idx + off - kv_idx).abs()
            return s

        block_mask = self.create_block_mask(mask_mod, None, None, ql, kl, device=str(self.device))
        # A Python float, never a NumPy scalar: dynamo turns a NumPy scale into a graph input
        # tensor, and inductor's flex lowering then fails ("FakeTensorMode should not be set
        # when dispatching flex_attention", PyTorch 2.11 on the H200, 2026-12-02).
        kw = dict(score_mod=score_mod, block_mask=block_mask, scale=float(scale),
                  enable_gqa=hq != hkv)
        if self.flex_aux is not None:
            o, aux = self.flex(qt, kt, vt, return_aux=self.flex_aux, **kw)
            lse = aux.lse
        else:
            o, lse = self.flex(qt, kt, vt, return_lse=True, **kw)
        if self.flex_eager:
            self.route = "flex eager (unfused reference; torch.compile on CPU has no backward)"
        return o.transpose(1, 2), lse

    def _fa(self, problem, q, k, v, scale):
        kwargs = {"softmax_scale": scale, "return_attn_probs": True}
        if problem.get("causal"):
            if problem.get("causal_align", "bottom_right") != "bottom_right":
                raise aw.Unsupported("top-left causal (flash_attn_func is bottom-right)")
            kwargs["causal"] = True
        w = problem.get("window", [-1, -1])
        if w != [-1, -1]:
            kwargs["window_size"] = tuple(w)
        if problem.get("softcap"):
            kwargs["softcap"] = float(problem["softcap"])
        if problem.get("alibi_slopes") is not None:
            kwargs["alibi_slopes"] = torch.tensor(problem["alibi_slopes"], dtype=torch.float32,
                                                  device=self.device)
        dv = v.shape[-1]
        dmax = max(q.shape[-1], dv)
        out = self.fa(_pad_last(q, dmax), _pad_last(k, dmax), _pad_last(v, dmax), **kwargs)
        o, lse = out[0][..., :dv], out[1]
        return o, lse.float()

    # -- protocol handlers --
    def _load(self, problem, inputs, names):
        return [to_torch(inputs[n], self.dtype, self.device) for n in names]

    def forward(self, problem, inputs):
        self.check(problem)
        self.route = ""
        q, k, v = self._load(problem, inputs, ("q", "k", "v"))
        hq, dv = problem["heads_q"], problem["head_dim_v"]
        varlen = problem.get("cu_seqlens_q") is not None
        o = torch.zeros(q.shape[:-1] + (dv,), dtype=q.dtype, device=self.device)
        lse = torch.full((hq, problem["batch"] * problem["seqlen_q"]) if not varlen else
                         (hq, q.shape[0]), -math.inf, dtype=torch.float32, device=self.device)
        # Flex compiled under no_grad fails in PyTorch 2.11 on CUDA ("FakeTensorMode should
        # not be set when dispatching flex_attention", seen on the H200 2026-12-02) while the
        # same call with grad mode on runs; the inputs need no grad, so no graph is built.
        grad_mode = contextlib.nullcontext() if self.backend == "flex" else torch.no_grad()
        with grad_mode:
            for b, (q0, ql, k0, kl) in enumerate(aw.sequences(problem)):
                if ql == 0 or kl == 0:
                    continue  # nothing visible: o = 0, lse = -inf
                qs, ks, vs = self._slices(problem, b, q, k, v, q0, ql, k0, kl)
                os_, ls = self.attend(problem, b, qs, ks, vs)
                self._put(problem, o, b, q0, ql, os_[0])
                lse[:, q0:q0 + ql] = ls[0].float()
        out_o = to_tensor(o)
        if varlen:
            return {"o": out_o, "lse": to_tensor(lse)}
        bsz, sq = problem["batch"], problem["seqlen_q"]
        return {"o": out_o, "lse": to_tensor(lse.reshape(hq, bsz, sq).transpose(0, 1))}

    def backward(self, problem, inputs):
        self.check(problem)
        self.route = ""
        if not self.caps.get("backward"):
            raise aw.Unsupported(f"backward ({self.backend} on {self.device.type})")
        q, k, v, do = self._load(problem, inputs, ("q", "k", "v", "do"))
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for b, (q0, ql, k0, kl) in enumerate(aw.sequences(problem)):
            if ql == 0 or kl == 0:
                continue
            qs, ks, vs = (x.detach().clone().requires_grad_(True)
                          for x in self._slices(problem, b, q, k, v, q0, ql, k0, kl))
            dos = self._slices(problem, b, do, None, None, q0, ql, k0, kl)[0]
            os_, _ = self.attend(problem, b, qs, ks, vs)
            gq, gk, gv = torch.autograd.grad(os_, (qs, ks, vs), grad_outputs=dos,
                                             allow_unused=True)
            for dst, g, start, n in ((dq, gq, q0, ql), (dk, gk, k0, kl), (dv, gv, k0, kl)):
                if g is not None:
                    self._put(problem, dst, b, start, n, g[0])
        return {"dq": to_tensor(dq), "dk": to_tensor(dk), "dv": to_tensor(dv)}

    def _slices(self, problem, b, q, k, v, q0, ql, k0, kl):
        """Sequence b as [1, S, H, D] views (packed rows or a batch entry)."""
        varlen = problem.get("cu_seqlens_q") is not None
        out = []
        for x, start, n in ((q, q0, ql), (k, k0, kl), (v, k0, kl)):
            if x is None:
                out.append(None)
            elif varlen:
                out.append(x[start:start + n].unsqueeze(0))
            else:
                out.append(x[b:b + 1])
        return out

    def _put(self, problem, dst, b, start, n, value):
        if problem.get("cu_seqlens_q") is not None:
            dst[start:start + n] = value.to(dst.dtype)
        else:
            dst[b] = value.to(dst.dtype)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", required=True,
                        help="sdpa-math | sdpa-flash | sdpa-efficient | sdpa-cudnn | flex | "
                             "fa:MODULE:FUNCTION")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--caps", default=None,
                        help="JSON object merged into the claimed capabilities")
    args = parser.parse_args()
    if args.dtype == "f32" and args.backend != "sdpa-math":
        parser.error("--dtype f32 is for sdpa-math only")
    worker = Worker(args)
    aw.serve(worker.describe, worker.forward, worker.backward, route=lambda: worker.route)


if __name__ == "__main__":
    main()
