"""tools/workers/torch_worker.py with a seeded stand-in in a CUDA-only kernel's place, on a CPU
(python/tests/export_test.py): `--standin NAME` before torch_worker.py's own arguments.
  cpu-flash-lse   sdpa-flash+lse's CPU op with lse times ln 2
  efficient-lse   sdpa-efficient+lse's CUDA path, the op's stand-in writing lse = 0 on empty rows
  cudnn-none      sdpa-cudnn+lse's CUDA path, the op's stand-in returning no o for Sq = Sk = 0
  flex-lse        flex (eager on the CPU) with lse times ln 2
  fa4-gqa         fa4 as flash_attn.cute (FlashAttention-4's signature), GQA keys past 64
                  without gradient
The adapter runs its CUDA code path (cuda_api) with the stand-in on CPU tensors, and `attest repro
--export` renders that path's call (its file name holds "torch_worker.py", which is how attest
knows a worker that renders its calls)."""

import os
import runpy
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import standins  # noqa: E402  (puts tools/workers on sys.path)

import torch_backends as tb  # noqa: E402


def install(name):
    make = tb.make
    cuda_path = {"efficient-lse": ("_efficient_attention_forward", standins.efficient_lse_zero_bug),
                 "cudnn-none": ("_cudnn_attention_forward", standins.cudnn_none_bug)}
    if name == "cpu-flash-lse":
        tb.ENTRY["_scaled_dot_product_flash_attention_for_cpu"] = standins.cpu_flash_lse_bug
    elif name in cuda_path:
        op, fn = cuda_path[name]
        tb.ENTRY[op] = fn
        table = {"_efficient_attention_forward": tb.SdpaEfficientLse,
                 "_cudnn_attention_forward": tb.SdpaCudnnLse}

        def make(args):  # noqa: F811
            backend = table[op](args)
            backend.cuda_api = True
            return backend
    elif name == "flex-lse":
        import torch.nn.attention.flex_attention as fa_mod
        fa_mod.flex_attention = standins.flex_lse_ln2_bug
    elif name == "fa4-gqa":
        fake = types.ModuleType("flash_attn.cute")
        standins.fa4_gqa_bug.__module__ = "flash_attn.cute"
        standins.fa4_gqa_bug.__qualname__ = "flash_attn_func"
        fake.flash_attn_func = standins.fa4_gqa_bug
        fake.flash_attn_varlen_func = standins.fa4_varlen_func
        sys.modules["flash_attn"] = types.ModuleType("flash_attn")
        sys.modules["flash_attn.cute"] = fake
    else:
        raise SystemExit(f"standin_torch_worker: unknown --standin {name}")
    tb.make = make


if __name__ == "__main__":
    at = sys.argv.index("--standin")
    install(sys.argv[at + 1])
    del sys.argv[at:at + 2]
    sys.argv[0] = os.path.join(standins.WORKERS, "torch_worker.py")
    runpy.run_path(sys.argv[0], run_name="__main__")
