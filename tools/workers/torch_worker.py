#!/usr/bin/env python3
"""PyTorch-callable attention kernels as an attest exec worker (docs/protocol.md):
`exec:python3 tools/workers/torch_worker.py --backend B [--dtype bf16|f16] [--device cuda]`.

Backends (tools/workers/torch_backends.py says what each calls and claims):
  sdpa-math        F.scaled_dot_product_attention under sdpa_kernel([MATH]) (public; no lse)
  sdpa-flash       F.scaled_dot_product_attention under sdpa_kernel([FLASH_ATTENTION]), the
                   masks models pass (public; no lse, no varlen; claims measured at start);
                   on CPU PyTorch's CPU flash kernel through the same call
  sdpa-efficient   the same under sdpa_kernel([EFFICIENT_ATTENTION])
  sdpa-cudnn       the same under sdpa_kernel([CUDNN_ATTENTION])
  sdpa-flash+lse   extra: aten._flash_attention_forward, the op behind SDPA's flash backend
                   (lse judged; varlen by cu_seqlens); on CPU
                   aten._scaled_dot_product_flash_attention_for_cpu
  sdpa-efficient+lse  extra: aten._efficient_attention_forward (masks as attn_bias /
                   custom_mask_type)
  sdpa-cudnn+lse   extra: aten._cudnn_attention_forward
  flex-triton      flex_attention under torch.compile, BACKEND TRITON (alias: flex)
  flex-flash       flex_attention, BACKEND FLASH (FlashAttention-4 inside FlexAttention)
  fa4              flash_attn.cute.flash_attn_func / flash_attn_varlen_func (flash-attn-4)
  cudnn-fp8        cuDNN's per-tensor FP8 SDPA (graph.sdpa_fp8 / sdpa_fp8_backward from
                   nvidia-cudnn-frontend) behind a bf16 -> E4M3 cast with --fp8-scaling
                   static (calibrated) or current scales, O as bf16 or --fp8-output e4m3;
                   its recipe declared as data
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attest_worker as aw  # noqa: E402

try:
    import torch
except ImportError as e:  # describe then fails with this message on stderr
    print(f"torch_worker: cannot import torch: {e}", file=sys.stderr)
    sys.exit(3)

import torch_backends as tb  # noqa: E402

class Worker:
    """The exec protocol's handlers over a torch_backends.Runner: protocol Tensors in, the
    kernel's outputs back as it wrote them."""

    def __init__(self, args):
        self.backend = tb.make(args)
        self.dtype = args.dtype
        self.device = torch.device(args.device)
        self.runner = tb.Runner(self.backend, json.loads(args.caps) if args.caps else None)
        self.caps = self.runner.caps
        # The input layouts it takes: the backend's input_strides (torch_backends_common.py
        # Backend), declared by the Runner as for the Python package's in-process route.

    def describe(self):
        return f"torch-{self.backend.name}-{self.dtype}", dict(self.caps)

    def _load(self, inputs, names):
        return [self._tensor(inputs[n]) for n in names]

    def _tensor(self, t):
        """An input on the worker's device; one sent as a view (docs/protocol.md "Views")
        becomes the same view of its storage moved there, so that the kernel is handed the
        strides a model would hand it (a copy to the device would make it contiguous)."""
        if t.view is None:
            return tb.to_torch(t, self.dtype, self.device)
        storage = tb.to_torch(aw.Tensor(t.storage, t.dtype), self.dtype, self.device)
        return torch.as_strided(storage, t.view["shape"], t.view["strides"],
                                int(t.view.get("offset", 0)))

    def forward(self, problem, inputs):
        o, lse = self.runner.forward(problem, *self._load(inputs, ("q", "k", "v")))
        out = {"o": tb.to_tensor(o)}
        if lse is not None:
            out["lse"] = tb.to_tensor(lse)
        return out

    def backward(self, problem, inputs):
        grads = self.runner.backward(problem, *self._load(inputs, ("q", "k", "v", "do")))
        return {n: tb.to_tensor(g) for n, g in zip(("dq", "dk", "dv"), grads)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--backend", required=True,
                        help="sdpa-math | sdpa-flash | sdpa-efficient | sdpa-cudnn | "
                             "sdpa-flash+lse | sdpa-efficient+lse | sdpa-cudnn+lse | "
                             "flex-triton | flex-flash | fa4 | cudnn-fp8 | fa:MODULE:FUNCTION")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--mask-form", default="bool", choices=["bool", "additive"],
                        help="sdpa-math, sdpa-flash, sdpa-efficient, sdpa-cudnn: attn_mask as "
                        "a boolean or an additive (0/-inf, input dtype) mask")
    parser.add_argument("--njt", action="store_true",
                        help="sdpa-math, sdpa-flash, sdpa-efficient, sdpa-cudnn: every problem "
                        "as nested jagged tensors (a packed batch as models pass one; a dense "
                        "batch as B equal sequences), is_causal its only mask")
    parser.add_argument("--deterministic", action="store_true",
                        help="fa4 / fa:: pass deterministic=True")
    parser.add_argument("--flex-dynamic", default="auto", choices=["auto", "true", "false"],
                        help="flex backends: torch.compile's dynamic= (auto: flex-triton gets "
                        "PyTorch's default, static first and shapes made dynamic on the first "
                        "recompile; flex-flash is static, its FLASH backend refuses dynamic "
                        "shapes)")
    parser.add_argument("--fp8-scaling", default="static", choices=["static", "current"],
                        help="cudnn-fp8: Q, K, V, dO scales from a calibration batch (static) "
                        "or from each call's own amax (current)")
    parser.add_argument("--fp8-output", default="bf16", choices=["bf16", "e4m3"],
                        help="cudnn-fp8: O as bf16 or as E4M3 (scale_o 1; what Hopper builds)")
    parser.add_argument("--fp8-grads", default="bf16", choices=["bf16", "e4m3"],
                        help="cudnn-fp8: dQ, dK, dV as bf16 or as E4M3 at static power-of-two "
                        "scales (Hopper's FP8 backward, head dim 128)")
    parser.add_argument("--caps", default=None,
                        help="JSON object merged into the claimed capabilities")
    parser.add_argument("--describe", action="store_true",
                        help="print the describe reply ({name, capabilities}) as JSON and exit: "
                        "a declared recipe in it runs on the CPU as `attest ... --kernel "
                        "recipe:FILE`")
    parser.add_argument("--export", default=None, metavar="FOLDER",
                        help="write repro.py and REPORT.md into FOLDER, which `attest repro "
                        "--export` has filled (tools/workers/torch_export.py), and exit: 0 "
                        "written, 3 not exportable (the reason on stdout)")
    args = parser.parse_args()
    if args.dtype == "f32" and args.backend not in ("sdpa-math", "sdpa-flash", "sdpa-flash+lse"):
        parser.error("--dtype f32 is for sdpa-math, sdpa-flash and sdpa-flash+lse only")
    worker = Worker(args)
    if args.export:
        import torch_export
        sys.exit(torch_export.main_export(args.export, worker.runner, args.dtype, args.device))
    if args.describe:
        name, caps = worker.describe()
        print(json.dumps({"name": name, "capabilities": caps}, indent=1, sort_keys=True))
        return
    aw.serve(worker.describe, worker.forward, worker.backward,
             route=lambda: worker.backend.route, fatal=cuda_is_broken)


def cuda_is_broken(e):
    """An error after which this process's CUDA context fails every later call (an illegal
    memory access, a launch failure): torch.AcceleratorError, or a CUDA error message."""
    return type(e).__name__ == "AcceleratorError" or "CUDA error" in str(e)


if __name__ == "__main__":
    main()
