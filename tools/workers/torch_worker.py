#!/usr/bin/env python3
"""PyTorch-callable attention kernels as an attest exec worker (docs/protocol.md):
`exec:python3 tools/workers/torch_worker.py --backend B [--dtype bf16|f16] [--device cuda]`.

Backends (tools/workers/torch_backends.py says what each calls and claims):
  sdpa-math        F.scaled_dot_product_attention, math backend (public API; no lse)
  sdpa-flash       aten._flash_attention_forward (FlashAttention-2; varlen by cu_seqlens);
                   on CPU PyTorch's CPU flash kernel
  sdpa-efficient   aten._efficient_attention_forward (masks as attn_bias / custom_mask_type)
  sdpa-cudnn       aten._cudnn_attention_forward
  flex-triton      flex_attention under torch.compile, BACKEND TRITON (alias: flex)
  flex-flash       flex_attention, BACKEND FLASH (FlashAttention-4 inside FlexAttention)
  fa4              flash_attn.cute.flash_attn_func / flash_attn_varlen_func (flash-attn-4)
  fa:MOD:FUNC      any flash_attn_func (FlashAttention-2/3 or -4 conventions, from the
                   function's signature)
Each request is one call of the kernel with the whole problem; the backward is autograd
through the same call with the given dO (the forward is recomputed, as docs/protocol.md
allows). Inputs stay in the problem's dtype; outputs are returned as the kernel wrote them.
--caps merges a JSON object into the claim (a kernel that lacks a feature its signature
suggests); tools/workers/torch_probe.py measures what each API accepts.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attest_worker as aw  # noqa: E402

try:
    import torch
except ImportError as e:  # describe then fails with this message on stderr
    print(f"torch_worker: cannot import torch: {e}", file=sys.stderr)
    sys.exit(3)

import torch_backends as tb  # noqa: E402

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
    x = x.to(device=device, dtype=_TORCH[dtype])
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



class Worker:
    def __init__(self, args):
        self.backend = tb.make(args)
        self.dtype = args.dtype
        self.device = torch.device(args.device)
        self.caps = self.backend.caps()
        if args.caps:
            self.caps.update(json.loads(args.caps))

    def describe(self):
        return f"torch-{self.backend.name}-{self.dtype}", dict(self.caps)

    def _check(self, problem):
        why = tb.covers(self.caps, problem)
        if why is not None:
            raise aw.Unsupported(why)

    def _load(self, inputs, names, grad=False):
        out = []
        for n in names:
            x = to_torch(inputs[n], self.dtype, self.device)
            out.append(x.requires_grad_(True) if grad else x)
        return out

    def forward(self, problem, inputs):
        self._check(problem)
        self.backend.route = ""
        q, k, v = self._load(inputs, ("q", "k", "v"))
        with self.backend.grad_mode():
            o, lse = self.backend.run(problem, q, k, v, need_lse=self.caps.get("lse", True))
        out = {"o": to_tensor(o)}
        if lse is not None:
            out["lse"] = to_tensor(lse)
        return out

    def backward(self, problem, inputs):
        self._check(problem)
        if not self.caps.get("backward"):
            raise aw.Unsupported(f"backward ({self.backend.name} on {self.device.type})")
        self.backend.route = ""
        q, k, v = self._load(inputs, ("q", "k", "v"), grad=True)
        (do,) = self._load(inputs, ("do",))
        with torch.enable_grad():
            o, _ = self.backend.run(problem, q, k, v, need_lse=False)
            grads = torch.autograd.grad(o, (q, k, v), grad_outputs=do, allow_unused=True)
        for name, g in zip(("dq", "dk", "dv"), grads):
            if g is None:
                raise RuntimeError(f"autograd returned no {name}: the kernel's output does not "
                                   f"depend on {name[1:]}")
        return {n: to_tensor(g) for n, g in zip(("dq", "dk", "dv"), grads)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--backend", required=True,
                        help="sdpa-math | sdpa-flash | sdpa-efficient | sdpa-cudnn | "
                             "flex-triton | flex-flash | fa4 | fa:MODULE:FUNCTION")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--mask-form", default="bool", choices=["bool", "additive"],
                        help="sdpa-math: attn_mask as a boolean or an additive (0/-inf) mask")
    parser.add_argument("--deterministic", action="store_true",
                        help="fa4 / fa:: pass deterministic=True")
    parser.add_argument("--flex-dynamic", default="auto", choices=["auto", "true", "false"],
                        help="flex backends: torch.compile's dynamic= (auto: flex-triton gets "
                        "PyTorch's default, static first and shapes made dynamic on the first "
                        "recompile; flex-flash is static, its FLASH backend refuses dynamic "
                        "shapes)")
    parser.add_argument("--caps", default=None,
                        help="JSON object merged into the claimed capabilities")
    args = parser.parse_args()
    if args.dtype == "f32" and args.backend not in ("sdpa-math", "sdpa-flash") :
        parser.error("--dtype f32 is for sdpa-math and sdpa-flash only")
    worker = Worker(args)
    aw.serve(worker.describe, worker.forward, worker.backward,
             route=lambda: worker.backend.route, fatal=cuda_is_broken)


def cuda_is_broken(e):
    """An error after which this process's CUDA context fails every later call (an illegal
    memory access, a launch failure): torch.AcceleratorError, or a CUDA error message."""
    return type(e).__name__ == "AcceleratorError" or "CUDA error" in str(e)


if __name__ == "__main__":
    main()
