"""FlexAttention adapters of tools/workers/torch_backends.py (flex-triton and flex-flash): the
problem's rules as FlexAttention mask and score functions (flex_mods), and the Flex backend."""

import torch

import attest_worker as aw
import torch_call as tc
from torch_backends_common import (window_of, is_varlen, bottom_right, any_mask, padded_extent,
                                   cu_tensor, Backend)

FLEX = "torch.nn.attention.flex_attention"

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
                                             torch.tensor(cq, device=device).diff()).int()
        seq_k[:tk] = torch.repeat_interleave(torch.arange(n_seq, device=device),
                                             torch.tensor(ck, device=device).diff()).int()
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


# What the exported script defines to run flex_mods (torch_call.Func): it and what it calls.
FLEX_MODS = tc.Func(flex_mods, deps=(window_of, is_varlen, bottom_right, any_mask,
                                     padded_extent, cu_tensor))


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
        self.dynamic = {"auto": False if backend == "FLASH" else None, "true": True,
                        "false": False}[getattr(args, "flex_dynamic", None) or "auto"]
        for x in self.prelude():
            tc.evaluate(x, {})
        wrap = self.wrap()
        self.flex = fa_mod.flex_attention if wrap is None else \
            tc.evaluate(wrap, {"fn": fa_mod.flex_attention})

    def prelude(self):
        """torch.compile as users call it: by default (--flex-dynamic auto) flex-triton gets
        PyTorch's default (the first shape is compiled static and the first recompile makes
        the changing sizes dynamic, so a suite of many shapes compiles a few kernels, not one
        per shape) and flex-flash is compiled static, because its FLASH backend refuses
        dynamic shapes (PyTorch 2.11 raises "NYI: score_mod or mask_mod captures a dynamic
        scalar" once a size becomes symbolic; docs/gpu-results.md). "true"/"false" force
        dynamic=True/False for both. Past dynamo's recompile limit a compiled function
        silently falls back to eager (FlexAttention's reference path, not the kernel under
        test): the limits are raised so that every call stays compiled. As descriptions
        (torch_call.py) of the statements, run once here and written into an exported
        repro.py."""
        if self.eager:
            return []
        import torch._dynamo as dynamo
        config = tc.Attr("torch._dynamo", "config", obj=dynamo.config)
        setattr_ = tc.Attr("builtins", "setattr", obj=setattr)
        out = [tc.Invoke(setattr_, config, knob, 4096)
               for knob in ("cache_size_limit", "recompile_limit",
                            "accumulated_cache_size_limit", "accumulated_recompile_limit")
               if hasattr(dynamo.config, knob)]
        if self.dynamic is False:
            out.append(tc.Invoke(setattr_, config, "automatic_dynamic_shapes", False))
        return out

    def wrap(self):
        """torch.compile(flex_attention, dynamic=...) as a description over Ref("fn"); None
        on CPU (eager)."""
        if self.eager:
            return None
        return tc.Invoke(tc.Attr("torch", "compile", obj=torch.compile), tc.Ref("fn"),
                         dynamic=self.dynamic)

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

    def describe_call(self, p, dtype, need_lse=False, device=None):
        """The call run() makes, as data (torch_call.py): flex_mods(PROBLEM, q.device) (written
        into the script from its source), create_block_mask(mask_mod, B, None, Sq, Sk,
        device=str(q.device)) where there is a mask, then fn(q, k, v as [B, H, S, D]
        contiguous (packed: one sequence [1, H, T, D]), score_mod=, block_mask=, scale=,
        enable_gqa=[, kernel_options={"BACKEND": B}][, return_aux=AuxRequest(lse=True)]), fn
        being flex_attention through wrap()."""
        device = self.device if device is None else device
        mask_mod, score_mod, batch, sq, sk = flex_mods(p, device)
        qdev = tc.Getattr(tc.Ref("q"), "device")
        setup = [("mods", tc.Invoke(FLEX_MODS, tc.Global("PROBLEM", p), qdev))]
        if mask_mod is not None:
            setup.append(("block_mask", tc.Invoke(
                tc.Attr(FLEX, "create_block_mask", obj=self.create_block_mask),
                tc.Index(tc.Ref("mods"), 0), batch, None, sq, sk,
                device=tc.Invoke(tc.Attr("builtins", "str", obj=str), qdev))))
        views = []
        for n in ("q", "k", "v"):
            x = tc.Index(tc.Ref(n), None) if is_varlen(p) else tc.Ref(n)
            views.append(tc.Method(tc.Method(x, "transpose", 1, 2), "contiguous"))
        kw = {"score_mod": tc.Index(tc.Ref("mods"), 1) if score_mod is not None else None,
              "block_mask": tc.Ref("block_mask") if mask_mod is not None else None,
              "scale": float(aw.scale_of(p)), "enable_gqa": p["heads_q"] != p["heads_kv"]}
        if not self.eager:
            kw["kernel_options"] = {"BACKEND": self.flex_backend}
        o, lse = tc.Ref("out"), None
        if need_lse:
            kw["return_aux"] = tc.Invoke(tc.Attr(FLEX, "AuxRequest", obj=type(self.aux)),
                                         lse=True)
            o, lse = tc.Index(tc.Ref("out"), 0), tc.Getattr(tc.Index(tc.Ref("out"), 1), "lse")
        if is_varlen(p):
            o = tc.Method(tc.Index(o, 0), "transpose", 0, 1)
            lse = tc.Index(lse, 0) if lse is not None else None
        else:
            o = tc.Method(o, "transpose", 1, 2)
        return tc.Call(tc.Attr(FLEX, "flex_attention"), views, kw, output=o, lse=lse,
                       setup=setup, wrap=self.wrap(), prelude=self.prelude())

    def run(self, p, q, k, v, need_lse):
        call = self.describe_call(p, q.dtype, need_lse)
        self.last_call = call  # what `attest repro --export` renders (torch_export.py)
        self.route = f"flex_attention {self.flex_backend if not self.eager else 'eager'}" + (
            " + block_mask" if "block_mask" in dict(call.setup) else "") + (
            " + score_mod" if call.kwargs["score_mod"] is not None else "")
        return call.run_both({"q": q, "k": k, "v": v}, fn=self.flex, wrapped=True)
