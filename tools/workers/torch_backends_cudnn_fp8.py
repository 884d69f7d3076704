"""cuDNN's per-tensor FP8 SDPA, forward and backward, through the cuDNN frontend's Python graph
API (`nvidia-cudnn-frontend`, `graph.sdpa_fp8` / `graph.sdpa_fp8_backward`; Hopper and newer,
cuDNN >= 9.14), as a training framework runs it: its bf16 activations cast to FP8 E4M3 with one
fp32 scale per tensor, the kernel called once with the whole problem, bf16 O and gradients.

The kernel under test is that cast plus the cuDNN call, and its recipe is declared as data
(docs/protocol.md "Recipes"), so attest models exactly what the user's pipeline does:
  - Q, K, V and dO: E4M3 with one fp32 scale per tensor, scale = fl32(448 / amax) and descale =
    fl32(1 / scale), the saturating RNE cast of TransformerEngine's `compute_scale_from_amax`
    (reference/formats/fp8_scaling.h computes the same bits). Two scaling modes:
      static   the amaxes come from a calibration batch (N(0, 1) data, `calibration()`), as
               delayed scaling uses an amax recorded before the call: nothing the call's data
               does moves a scale, so nothing can leak;
      current  the amaxes are the call's own tensors' (Float8CurrentScaling): one amax spans
               every position of every sequence, so a future key or another document's token
               moves how visible ones are rounded. The recipe says so; non-interference then
               reports that leak, from the kernel's outputs.
  - S (the softmax P) before P·V and Pᵀ·dO: scale_s = 2^8 (a power of two, below the 448 bound
    cuDNN documents for Amax S); the forward's online softmax divides it by 2^4 again (cuDNN's
    FP8 reference, cudnn-frontend test/python/sdpa/fp8_ref.py, `rescale_threshold` 4: P relative
    to a running max that may lag by up to 2^4), so the forward's P is rounded as e4m3(P · 2^4);
  - dS before dS·K and dSᵀ·Q (cuDNN's `scale_dP`): a static power of two from the calibration
    batch's largest |dS| with a margin of 2^2, in both modes;
  - D = rowsum(dO∘O) from the O handed to the backward and the FP8 dO.
O comes out as bf16 (the default; cuDNN 9.19 builds that graph on Blackwell only) or, with
--fp8-output e4m3, as E4M3 with scale_o 1 (the graph Hopper builds): the worker hands those
codes back as bf16, which holds every E4M3 value exactly, and the backward reads the same E4M3
O (descale_o 1). The recipe's `output` says which.
The adapter passes GQA (fewer kv heads), causal masks in both alignments (`diagonal_alignment`
and `right_bound` 0) and packed variable-length batches (ragged offsets and `seq_len_q/kv`,
cuDNN's THD layout) to the kernel; it writes no output itself. A graph cuDNN declines
(`cudnnGraphNotSupportedError`) is the API not accepting the problem: Unsupported, with
cuDNN's reason. What it claims is measured where it runs: on a GPU, `caps()` builds the
forward and backward graphs of one small problem per feature and claims the features whose
graphs build (cuDNN's support differs by architecture and version: on an H100 with cuDNN 9.19
it declines every bf16-output FP8 forward, docs/gpu-results.md); none building is a start-up
error naming cuDNN's reason. tools/device/cudnn_fp8_probe.py runs each feature on a GPU.
"""

import math
import sys

import numpy as np
import torch

import attest_worker as aw
from torch_backends_common import Backend, bottom_right, is_varlen, lse_to_attest

E4M3_MAX = 448.0
S_SCALE = 256.0          # scale_s: P (<= 1 after normalisation) times 2^8 before the E4M3 cast
RESCALE_THRESHOLD = 4    # the forward's lazy online-softmax rescale, log2 units (fp8_ref.py)
DS_MARGIN = 2            # scale_dP = 2^floor(log2(448 / (amax_dS * 2^DS_MARGIN)))


def calibration():
    """The static mode's amaxes, as a user calibrates them: one N(0, 1) batch (B 1, S 512,
    H 4, D 128; NumPy's PCG64, seed 2026, so every machine gets the same bits) for Q, K, V and
    dO, and the largest |dS| of its float64 attention backward (scale 1/sqrt(128), head 0)
    for the dS scale, and of its dq, dk, dv for E4M3 gradients' scales (cudnn_fp8_probe.py
    --grads e4m3). Returns {"q", "k", "v", "do": float32 amax, "ds_scale", "dq_scale",
    "dk_scale", "dv_scale": powers of two}."""
    rng = np.random.Generator(np.random.PCG64(2026))
    s, h, d = 512, 4, 128
    x = {n: rng.standard_normal((s, h, d)).astype(np.float32) for n in ("q", "k", "v", "do")}
    out = {n: float(np.float32(np.abs(t).max())) for n, t in x.items()}
    q, k, v, do = (x[n][:, 0, :].astype(np.float64) for n in ("q", "k", "v", "do"))
    sc = 1.0 / math.sqrt(d)
    scores = q @ k.T * sc
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    o = p @ v
    dp = do @ v.T
    ds = p * (dp - (do * o).sum(axis=1, keepdims=True))
    grads = {"ds": ds, "dq": ds @ k * sc, "dk": ds.T @ q * sc, "dv": p.T @ do}
    for n, t in grads.items():
        amax = float(np.abs(t).max())
        out[n + "_scale"] = 2.0 ** math.floor(math.log2(E4M3_MAX / (amax * 2 ** DS_MARGIN)))
    return out


def fp8_scale(amax):
    """fl32(448 / amax) with TransformerEngine's guards (amax 0, Inf or NaN: 1; an Inf
    quotient: FLT_MAX), as reference/formats/fp8_scaling.cc Fp8ScaleFromAmax; `amax` a
    float32 scalar tensor."""
    amax = amax.to(torch.float32)
    if not bool(torch.isfinite(amax)) or float(amax) == 0.0:
        return torch.ones((), dtype=torch.float32, device=amax.device)
    scale = torch.tensor(E4M3_MAX, dtype=torch.float32, device=amax.device) / amax
    if bool(torch.isinf(scale)):
        scale = torch.tensor(torch.finfo(torch.float32).max, dtype=torch.float32,
                             device=amax.device)
    return scale


def tensor_amax(x):
    """max |x| over the whole tensor in fp32, NaN skipped (fmaxf, as fp8_scaling.cc)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    a = x.float().abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax()


def quantize(x, amax):
    """(E4M3 codes, descale [1,1,1,1] fp32): satfinite RNE of fl32(x * scale), NaN 0x7F."""
    scale = fp8_scale(amax)
    xs = x.float() * scale
    codes = xs.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    # NaN as the CUDA conversion writes it (0x7F, cuda_fp8.hpp), whatever its sign bit.
    bits = codes.view(torch.uint8)
    bits[torch.isnan(xs)] = 0x7F
    descale = (torch.ones((), dtype=torch.float32, device=x.device) / scale).reshape(1, 1, 1, 1)
    return codes, descale.contiguous()


def scalar(value, device):
    return torch.full((1, 1, 1, 1), float(value), dtype=torch.float32, device=device)


class _Geometry:
    """The problem as cuDNN's graph describes it: dims (b, h, s, d) over a BSHD buffer, or a
    THD (packed) buffer with ragged offsets for a variable-length batch."""

    def __init__(self, p):
        self.b = p["batch"]
        self.hq, self.hk = p["heads_q"], p["heads_kv"]
        self.sq, self.sk = p["seqlen_q"], p["seqlen_k"]
        self.d, self.dv = p["head_dim"], p["head_dim_v"]
        self.varlen = is_varlen(p)
        self.causal = bool(p.get("causal"))
        self.bottom_right = bottom_right(p)
        self.scale = aw.scale_of(p)
        if self.varlen:
            self.cu_q, self.cu_k = list(p["cu_seqlens_q"]), list(p["cu_seqlens_k"])
            # Packed buffers hold whole 64-row blocks past the last token (cudnn-frontend
            # test/python/sdpa/fp8.py allocates max(64, ceil(total / 64) * 64) rows).
            self.tq = max(64, -(-self.cu_q[-1] // 64) * 64)
            self.tk = max(64, -(-self.cu_k[-1] // 64) * 64)

    def key(self):
        return (self.b, self.hq, self.hk, self.sq, self.sk, self.d, self.dv, self.varlen,
                self.causal, self.bottom_right, self.scale)

    def stride(self, h, s, w):
        return (s * h * w, w, h * w, 1)


class CudnnFp8(Backend):
    """cuDNN FP8 SDPA (module docstring). `args.fp8_scaling` is "static" or "current"."""

    name = "cudnn-fp8"
    # Its inputs are cast to E4M3 first: no caller's layout reaches the kernel.
    input_strides = "contiguous"

    def __init__(self, args):
        super().__init__(args)
        if self.dtype != "bf16":
            raise ValueError("cudnn-fp8 takes bf16 activations (--dtype bf16)")
        self.mode = getattr(args, "fp8_scaling", "static") or "static"
        if self.mode not in ("static", "current"):
            raise ValueError(f"--fp8-scaling {self.mode!r}: static or current")
        output = getattr(args, "fp8_output", "bf16") or "bf16"
        if output not in ("bf16", "e4m3"):
            raise ValueError(f"--fp8-output {output!r}: bf16 or e4m3")
        self.out8 = output == "e4m3"
        # --fp8-grads e4m3: dq, dk, dv come out as E4M3 at the calibration's power-of-two
        # scales (static in both modes: a gradient's amax is unknown before the call, so a
        # user takes it from calibration or an earlier step), handed back divided by them
        # (exact). What Hopper's FP8 backward builds (bf16 gradients are Blackwell's).
        grads = getattr(args, "fp8_grads", "bf16") or "bf16"
        if grads not in ("bf16", "e4m3"):
            raise ValueError(f"--fp8-grads {grads!r}: bf16 or e4m3")
        self.grad8 = grads == "e4m3"
        self.name = (f"cudnn-fp8-{self.mode}" + ("-e4m3-out" if self.out8 else "")
                     + ("-e4m3-grads" if self.grad8 else ""))
        # False: claim the fixed set below without building graphs (cudnn_fp8_probe.py, which
        # calls every problem itself).
        self.measure_claims = getattr(args, "measure_claims", True)
        self.cal = calibration()
        self.graphs = {}
        self.handle = None

    # ---- the claim ----

    def recipe(self):
        static = self.mode == "static"

        def tensor(name):
            op = {"kind": "block", "scheme": "fp8-tensor-e4m3", "axis": "sequence",
                  "pow2_scale": False}
            if static:
                op["tensor_amax"] = self.cal[name]
            return op

        def element(pre_scale):
            return {"kind": "element", "format": "e4m3fn", "pre_scale": pre_scale,
                    "overflow": "saturate"}

        ds = element(self.cal["ds_scale"])
        how = ("static scales from a calibration batch" if static else
               "current scales (each tensor's own amax, which spans every position: leaks)")
        out = ("E4M3 O (scale_o 1), bf16 gradients" if self.out8 else
               "bf16 O and gradients")
        if self.grad8:
            out = out.replace("bf16 gradients", "E4M3 dQ, dK, dV at static power-of-two scales")
        return {
            "name": self.name,
            "description": (
                "cuDNN per-tensor FP8 SDPA (graph.sdpa_fp8 / sdpa_fp8_backward) behind a "
                f"bf16 -> E4M3 cast of Q, K, V, dO with {how}; P x2^4 -> E4M3 for P.V, "
                f"P x2^8 for dV, dS x scale_dP -> E4M3 for dQ, dK; {out}"),
            "input_dtypes": ["bf16"],
            "gemms": {
                "qk": {"a": tensor("q"), "b": tensor("k")},
                "pv": {"a": element(S_SCALE / 2 ** RESCALE_THRESHOLD), "b": tensor("v")},
                "dov": {"a": tensor("do"), "b": tensor("v")},
                "pdo": {"a": element(S_SCALE), "b": tensor("do")},
                "dsk": {"a": ds, "b": tensor("k")},
                "dsq": {"a": ds, "b": tensor("q")},
            },
            "delta": "rounded_o", "delta_do": "dov_operand",
            "accumulate": "f32", "lse": "f32", "output": "e4m3fn" if self.out8 else "bf16",
            "gradients": "e4m3fn" if self.grad8 else "bf16",
            "dp": None,
        } | ({"gradient_scales": [self.cal["dq_scale"], self.cal["dk_scale"],
                                   self.cal["dv_scale"]]} if self.grad8 else {})

    # One small problem per feature the adapter can pass: (feature, problem). caps() claims a
    # head dim or feature where its forward graph builds, and the backward where the plain
    # problem's backward graph builds (then a feature needs its backward graph too).
    PROBES = (
        ("d64", dict(head_dim=64)), ("d128", dict(head_dim=128)),
        ("gqa", dict(heads_q=4, heads_kv=2)),
        ("causal", dict(causal=True, causal_align="top_left", seqlen_q=64, seqlen_k=128)),
        ("causal", dict(causal=True, seqlen_q=64, seqlen_k=128)),
        ("varlen", dict(batch=2, seqlen_q=64, seqlen_k=64, cu_seqlens_q=[0, 64, 128],
                        cu_seqlens_k=[0, 64, 128])),
    )

    def _declined(self, backward, **kw):
        """None if cuDNN builds this problem's forward graph (and its backward graph, if
        `backward`), else cuDNN's reason."""
        p = {"batch": 1, "heads_q": 2, "heads_kv": 2, "seqlen_q": 128, "seqlen_k": 128,
             "head_dim": 128, "head_dim_v": kw.get("head_dim", 128), "causal": False,
             "causal_align": "bottom_right"}
        p.update(kw)
        cudnn = self._cudnn()
        try:
            g = _Geometry(p)
            self._fwd_graph(cudnn, g)
            if backward:
                self._bwd_graph(cudnn, g)
        except aw.Unsupported as e:
            return str(e)
        return None

    def caps(self):
        c = self.base_caps("bf16")
        recipe = self.recipe()
        claim = {"causal": True, "gqa": True, "varlen": True, "head_dims": [64, 128],
                 "backward": True}
        if self.device.type == "cuda" and self.measure_claims:
            no_bwd = self._declined(True)
            declined = {"backward": no_bwd} if no_bwd else {}
            for feature, kw in self.PROBES:
                why = self._declined(no_bwd is None, **kw)
                if why is not None:
                    declined.setdefault(feature, why)
            claim = {f: f not in declined for f in ("causal", "gqa", "varlen", "backward")}
            claim["head_dims"] = [d for d in (64, 128) if f"d{d}" not in declined]
            if not claim["head_dims"]:
                raise RuntimeError(
                    f"{self.name}: cuDNN builds no FP8 SDPA forward graph on this GPU "
                    f"({torch.cuda.get_device_name(self.device)}): {declined['d128']}")
            for f, why in declined.items():
                print(f"{self.name}: not claimed, {f}: {why}", file=sys.stderr)
        # deterministic: the backward is built with use_deterministic_algorithm; --caps
        # narrows or widens the claim.
        c.update(claim)
        c.update({"deterministic": True, "head_dims_v": list(claim["head_dims"]),
                  "same_head_dim_v": True, "profile": recipe["name"], "recipe": recipe})
        return c

    # ---- cuDNN ----

    def _cudnn(self):
        import cudnn  # noqa: PLC0415  (only where the GPU path runs)
        if self.handle is None:
            self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        return cudnn

    def _mask_kw(self, cudnn, g):
        kw = {}
        if g.causal:
            kw["diagonal_alignment"] = (cudnn.diagonal_alignment.BOTTOM_RIGHT if g.bottom_right
                                        else cudnn.diagonal_alignment.TOP_LEFT)
            kw["right_bound"] = 0
        return kw

    def _ragged(self, cudnn, graph, g, uid0, names):
        """Ragged-offset tensors (int64 [b + 1, 1, 1, 1]) for the named THD tensors."""
        return {n: graph.tensor(uid=uid0 + i, dim=(g.b + 1, 1, 1, 1), stride=(1, 1, 1, 1),
                                data_type=cudnn.data_type.INT64)
                for i, n in enumerate(names)}

    def _build(self, cudnn, graph, what):
        try:
            graph.validate()
            graph.build_operation_graph()
            graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            graph.check_support()
            graph.build_plans()
        except cudnn.cudnnGraphNotSupportedError as e:
            raise aw.Unsupported(f"cuDNN declines the FP8 {what} graph: {e}") from e

    def _fwd_graph(self, cudnn, g):
        key = ("fwd",) + g.key()
        if key in self.graphs:
            return self.graphs[key]
        f32, fp8 = cudnn.data_type.FLOAT, cudnn.data_type.FP8_E4M3
        graph = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=f32,
                              compute_data_type=f32)
        sq_ = g.sq
        q = graph.tensor(uid=1, dim=(g.b, g.hq, sq_, g.d), stride=g.stride(g.hq, sq_, g.d),
                         data_type=fp8)
        k = graph.tensor(uid=2, dim=(g.b, g.hk, g.sk, g.d), stride=g.stride(g.hk, g.sk, g.d),
                         data_type=fp8)
        v = graph.tensor(uid=3, dim=(g.b, g.hk, g.sk, g.dv), stride=g.stride(g.hk, g.sk, g.dv),
                         data_type=fp8)
        sc = {n: graph.tensor(uid=10 + i, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)
              for i, n in enumerate(("dq", "dk", "dv", "ds", "ss", "so"))}
        kw = self._mask_kw(cudnn, g)
        if g.varlen:
            kw["use_padding_mask"] = True
            kw["seq_len_q"] = graph.tensor(uid=20, dim=(g.b, 1, 1, 1), stride=(1, 1, 1, 1),
                                           data_type=cudnn.data_type.INT32)
            kw["seq_len_kv"] = graph.tensor(uid=21, dim=(g.b, 1, 1, 1), stride=(1, 1, 1, 1),
                                            data_type=cudnn.data_type.INT32)
            rag = self._ragged(cudnn, graph, g, 30, ("q", "k", "v", "o", "stats"))
            q.set_ragged_offset(rag["q"])
            k.set_ragged_offset(rag["k"])
            v.set_ragged_offset(rag["v"])
        o, stats, _amax_s, amax_o = graph.sdpa_fp8(
            q=q, k=k, v=v, descale_q=sc["dq"], descale_k=sc["dk"], descale_v=sc["dv"],
            descale_s=sc["ds"], scale_s=sc["ss"], scale_o=sc["so"], attn_scale=g.scale,
            generate_stats=True, **kw)
        o.set_uid(4).set_output(True).set_dim((g.b, g.hq, sq_, g.dv)).set_stride(
            g.stride(g.hq, sq_, g.dv)).set_data_type(fp8 if self.out8 else
                                                     cudnn.data_type.BFLOAT16)
        stats_stride = (sq_ * g.hq, 1, g.hq, 1) if g.varlen else (g.hq * sq_, sq_, 1, 1)
        stats.set_uid(5).set_output(True).set_dim((g.b, g.hq, sq_, 1)).set_stride(
            stats_stride).set_data_type(f32)
        if g.varlen:
            o.set_ragged_offset(rag["o"])
            stats.set_ragged_offset(rag["stats"])
        amax_o.set_uid(6).set_output(True).set_dim((1, 1, 1, 1)).set_stride(
            (1, 1, 1, 1)).set_data_type(f32)
        self._build(cudnn, graph, "forward")
        self.graphs[key] = graph
        return graph

    def _bwd_graph(self, cudnn, g):
        key = ("bwd", self.grad8) + g.key()
        if key in self.graphs:
            return self.graphs[key]
        f32, fp8, bf16 = cudnn.data_type.FLOAT, cudnn.data_type.FP8_E4M3, \
            cudnn.data_type.BFLOAT16
        graph = cudnn.pygraph(io_data_type=fp8, intermediate_data_type=f32,
                              compute_data_type=f32)
        sq_ = g.sq
        t = {}
        t["q"] = graph.tensor(uid=101, dim=(g.b, g.hq, sq_, g.d),
                              stride=g.stride(g.hq, sq_, g.d), data_type=fp8)
        t["k"] = graph.tensor(uid=102, dim=(g.b, g.hk, g.sk, g.d),
                              stride=g.stride(g.hk, g.sk, g.d), data_type=fp8)
        t["v"] = graph.tensor(uid=103, dim=(g.b, g.hk, g.sk, g.dv),
                              stride=g.stride(g.hk, g.sk, g.dv), data_type=fp8)
        t["o"] = graph.tensor(uid=104, dim=(g.b, g.hq, sq_, g.dv),
                              stride=g.stride(g.hq, sq_, g.dv),
                              data_type=fp8 if self.out8 else bf16)
        t["do"] = graph.tensor(uid=105, dim=(g.b, g.hq, sq_, g.dv),
                               stride=g.stride(g.hq, sq_, g.dv), data_type=fp8)
        stats_stride = (sq_ * g.hq, 1, g.hq, 1) if g.varlen else (g.hq * sq_, sq_, 1, 1)
        t["stats"] = graph.tensor(uid=106, dim=(g.b, g.hq, sq_, 1), stride=stats_stride,
                                  data_type=f32)
        names = ("descale_q", "descale_k", "descale_v", "descale_o", "descale_dO",
                 "descale_s", "descale_dP", "scale_s", "scale_dQ", "scale_dK", "scale_dV",
                 "scale_dP")
        # uids 110-121: the twelve scales; the outputs start at 150.
        sc = {n: graph.tensor(uid=110 + i, dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)
              for i, n in enumerate(names)}
        kw = self._mask_kw(cudnn, g)
        if "diagonal_alignment" not in kw:
            kw["diagonal_alignment"] = cudnn.diagonal_alignment.TOP_LEFT
        if g.varlen:
            kw["use_padding_mask"] = True
            kw["seq_len_q"] = graph.tensor(uid=130, dim=(g.b, 1, 1, 1), stride=(1, 1, 1, 1),
                                           data_type=cudnn.data_type.INT32)
            kw["seq_len_kv"] = graph.tensor(uid=131, dim=(g.b, 1, 1, 1), stride=(1, 1, 1, 1),
                                            data_type=cudnn.data_type.INT32)
            rag = self._ragged(cudnn, graph, g, 140, ("q", "k", "v", "o", "stats", "do"))
            for n in ("q", "k", "v", "o", "stats", "do"):
                t[n].set_ragged_offset(rag[n])
        else:
            kw["use_padding_mask"] = False
        outs = graph.sdpa_fp8_backward(
            q=t["q"], k=t["k"], v=t["v"], o=t["o"], dO=t["do"], stats=t["stats"],
            **{n: sc[n] for n in names}, attn_scale=g.scale, use_deterministic_algorithm=True,
            **kw)
        dq, dk, dv = outs[0], outs[1], outs[2]
        gt = fp8 if self.grad8 else bf16
        dq.set_uid(150).set_output(True).set_dim((g.b, g.hq, sq_, g.d)).set_stride(
            g.stride(g.hq, sq_, g.d)).set_data_type(gt)
        dk.set_uid(151).set_output(True).set_dim((g.b, g.hk, g.sk, g.d)).set_stride(
            g.stride(g.hk, g.sk, g.d)).set_data_type(gt)
        dv.set_uid(152).set_output(True).set_dim((g.b, g.hk, g.sk, g.dv)).set_stride(
            g.stride(g.hk, g.sk, g.dv)).set_data_type(gt)
        if g.varlen:
            dq.set_ragged_offset(rag["q"])
            dk.set_ragged_offset(rag["k"])
            dv.set_ragged_offset(rag["v"])
        for i, a in enumerate(outs[3:7]):
            a.set_uid(153 + i).set_output(True).set_dim((1, 1, 1, 1)).set_stride(
                (1, 1, 1, 1)).set_data_type(f32)
        self._build(cudnn, graph, "backward")
        self.graphs[key] = graph
        return graph

    # ---- data ----

    def _amaxes(self, tensors):
        if self.mode == "static":
            return {n: torch.tensor(self.cal[n], dtype=torch.float32, device=self.device)
                    for n in tensors}
        return {n: tensor_amax(x) for n, x in tensors.items()}

    def _pad(self, x, rows):
        """A packed [T, H, W] tensor in a buffer of `rows` >= T rows (zeros past T)."""
        buf = torch.zeros((rows,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        buf[:x.shape[0]] = x
        return buf

    def _varlen_pack(self, cudnn, g, pack, uid_q, uid_k, uid_rag, names):
        d = self.device
        cu_q = torch.tensor(g.cu_q, dtype=torch.int64, device=d)
        cu_k = torch.tensor(g.cu_k, dtype=torch.int64, device=d)
        pack[uid_q] = (cu_q[1:] - cu_q[:-1]).to(torch.int32).reshape(g.b, 1, 1, 1)
        pack[uid_k] = (cu_k[1:] - cu_k[:-1]).to(torch.int32).reshape(g.b, 1, 1, 1)
        per_token = {"q": (cu_q, g.hq * g.d), "k": (cu_k, g.hk * g.d), "v": (cu_k, g.hk * g.dv),
                     "o": (cu_q, g.hq * g.dv), "stats": (cu_q, g.hq), "do": (cu_q, g.hq * g.dv)}
        for i, n in enumerate(names):
            cu, width = per_token[n]
            pack[uid_rag + i] = (cu * width).reshape(g.b + 1, 1, 1, 1).contiguous()

    def _forward(self, p, q8, k8, v8, scales):
        cudnn = self._cudnn()
        g = _Geometry(p)
        graph = self._fwd_graph(cudnn, g)
        d = self.device
        o_type = torch.float8_e4m3fn if self.out8 else torch.bfloat16
        if g.varlen:
            q8, k8, v8 = self._pad(q8, g.tq), self._pad(k8, g.tk), self._pad(v8, g.tk)
            o = torch.zeros((g.tq, g.hq, g.dv), dtype=o_type, device=d)
            stats = torch.full((g.tq, g.hq, 1), float("nan"), dtype=torch.float32, device=d)
        else:
            o = torch.empty((g.b, g.sq, g.hq, g.dv), dtype=o_type, device=d)
            stats = torch.empty((g.b, g.hq, g.sq, 1), dtype=torch.float32, device=d)
        amax_o = torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=d)
        pack = {1: q8, 2: k8, 3: v8, 4: o, 5: stats, 6: amax_o,
                10: scales["q"], 11: scales["k"], 12: scales["v"],
                13: scalar(1.0 / S_SCALE, d), 14: scalar(S_SCALE, d), 15: scalar(1.0, d)}
        if g.varlen:
            self._varlen_pack(cudnn, g, pack, 20, 21, 30, ("q", "k", "v", "o", "stats"))
        ws = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=d)
        graph.execute(pack, ws, handle=self.handle)
        torch.cuda.synchronize(d)
        if g.varlen:
            total = g.cu_q[-1]
            return o[:total], stats[:total], g
        return o, stats, g

    def run(self, p, q, k, v, need_lse):
        am = self._amaxes({"q": q, "k": k, "v": v})
        (q8, sq), (k8, sk), (v8, sv) = (quantize(x, am[n]) for n, x in
                                        (("q", q), ("k", k), ("v", v)))
        o, stats, g = self._forward(p, q8, k8, v8, {"q": sq, "k": sk, "v": sv})
        self.route = f"cudnn sdpa_fp8 ({self.mode} scales)" + (" THD" if g.varlen else "")
        lse = None
        if need_lse:
            lse = stats[..., 0].t() if g.varlen else lse_to_attest(stats, p)
        # E4M3 O as bf16: every E4M3 value (NaN included) is a bf16 value, so nothing rounds.
        return o.to(torch.bfloat16), lse

    def backward(self, p, q, k, v, o_unused, lse_unused, do):
        """The forward recomputed (its O and stats feed the backward, as docs/protocol.md
        allows), then sdpa_fp8_backward with the same FP8 Q, K, V."""
        am = self._amaxes({"q": q, "k": k, "v": v, "do": do})
        quant = {n: quantize(x, am[n]) for n, x in (("q", q), ("k", k), ("v", v), ("do", do))}
        scales = {n: quant[n][1] for n in quant}
        o, stats, g = self._forward(p, quant["q"][0], quant["k"][0], quant["v"][0], scales)
        cudnn = self._cudnn()
        graph = self._bwd_graph(cudnn, g)
        d = self.device
        q8, k8, v8, do8 = (quant[n][0] for n in ("q", "k", "v", "do"))
        gt = torch.float8_e4m3fn if self.grad8 else torch.bfloat16
        gs = {n: self.cal[n + "_scale"] if self.grad8 else 1.0 for n in ("dq", "dk", "dv")}
        if g.varlen:
            q8, do8, o_in = self._pad(q8, g.tq), self._pad(do8, g.tq), self._pad(o, g.tq)
            k8, v8 = self._pad(k8, g.tk), self._pad(v8, g.tk)
            st = self._pad(stats, g.tq)
            dq = torch.zeros((g.tq, g.hq, g.d), dtype=gt, device=d)
            dk = torch.zeros((g.tk, g.hk, g.d), dtype=gt, device=d)
            dv = torch.zeros((g.tk, g.hk, g.dv), dtype=gt, device=d)
        else:
            o_in, st = o, stats
            dq = torch.empty((g.b, g.sq, g.hq, g.d), dtype=gt, device=d)
            dk = torch.empty((g.b, g.sk, g.hk, g.d), dtype=gt, device=d)
            dv = torch.empty((g.b, g.sk, g.hk, g.dv), dtype=gt, device=d)
        ds_scale = self.cal["ds_scale"]
        vals = [scales["q"], scales["k"], scales["v"], scalar(1.0, d), scales["do"],
                scalar(1.0 / S_SCALE, d), scalar(1.0 / ds_scale, d), scalar(S_SCALE, d),
                scalar(gs["dq"], d), scalar(gs["dk"], d), scalar(gs["dv"], d),
                scalar(ds_scale, d)]
        pack = {101: q8, 102: k8, 103: v8, 104: o_in, 105: do8, 106: st,
                150: dq, 151: dk, 152: dv}
        pack.update({110 + i: x for i, x in enumerate(vals)})
        for i in range(4):
            pack[153 + i] = torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=d)
        if g.varlen:
            self._varlen_pack(cudnn, g, pack, 130, 131, 140,
                              ("q", "k", "v", "o", "stats", "do"))
        ws = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=d)
        graph.execute(pack, ws, handle=self.handle)
        torch.cuda.synchronize(d)
        self.route = f"cudnn sdpa_fp8_backward ({self.mode} scales)" + (
            " THD" if g.varlen else "")
        if self.grad8:  # E4M3 codes over a power-of-two scale: exact in float32
            dq, dk, dv = (x.float() / gs[n] for n, x in (("dq", dq), ("dk", dk), ("dv", dv)))
        if g.varlen:
            return dq[:g.cu_q[-1]], dk[:g.cu_k[-1]], dv[:g.cu_k[-1]]
        return dq, dk, dv
