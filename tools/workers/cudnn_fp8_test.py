#!/usr/bin/env python3
"""The cuDNN FP8 adapter (tools/workers/torch_backends_cudnn_fp8.py) on a CPU, without cuDNN:
  1. its bf16 -> E4M3 cast with one fp32 scale per tensor is bit for bit attest's model of
     that cast (`attest quantize --scheme fp8-tensor-e4m3`, reference/formats/fp8_scaling.cc),
     special values included, so the recipe it declares describes what it feeds the kernel;
  2. its static scales are the fp32 arithmetic of fp8_scaling.cc on the calibration amaxes,
     and the calibration is the same on every run;
  3. the recipes it declares (torch_worker.py --describe, bf16 or E4M3 O; the copies in
     docs/gpu-results/cudnn-fp8/ are the same bytes) are accepted by attest, and the CPU model
     built from each (`--kernel recipe:FILE`) gets the verdict its scaling implies:
     non-interference holds for static scales and fails, as a leak through shared scales, for
     current ones (one amax over every position).
Usage: cudnn_fp8_test.py ATTEST_BINARY. Exit 77 (skipped) without torch.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("skip: torch is not importable")
    sys.exit(77)
import numpy as np  # noqa: E402

import attest_worker as aw  # noqa: E402
import torch_backends_cudnn_fp8 as cf  # noqa: E402

FAILURES = []


def expect(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


def bf16_values():
    """bf16 values with the cases a cast can get wrong: ties, saturation, subnormals, Inf,
    NaN, zero signs, and an ordinary spread."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 33, 3, 16, generator=g) * 3
    flat = x.view(-1)
    special = [0.0, -0.0, 1e-30, -1e-30, 1e-3, 447.9, 448.0, 480.0, 1e4, -1e4, 3e38,
               float("inf"), float("-inf"), float("nan")]
    flat[:len(special)] = torch.tensor(special)
    return x.to(torch.bfloat16)


def attest_quantize(binary, x):
    """(codes uint8, descale float32) from `attest quantize --scheme fp8-tensor-e4m3`."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        codes = x.view(torch.int16).numpy().view(np.uint16)
        aw.write_safetensors(src, {"x": aw.Tensor(codes, "BF16")})
        subprocess.run([binary, "quantize", "--scheme", "fp8-tensor-e4m3", "--in", src,
                        "--out", dst, "--quiet"], check=True)
        out = aw.read_safetensors(dst)
        return out["x"].data.astype(np.uint8), aw.to_float(out["x.scale"]).reshape(-1)[0]


def main():
    binary = sys.argv[1]

    # 1. The cast, current scaling, against attest's model of it.
    x = bf16_values()
    codes, descale = cf.quantize(x, cf.tensor_amax(x))
    ref_codes, ref_descale = attest_quantize(binary, x)
    mine = codes.view(torch.uint8).numpy()
    ref_codes = ref_codes.reshape(mine.shape)
    expect(np.array_equal(mine, ref_codes),
           f"E4M3 codes equal attest quantize's ({int((mine != ref_codes).sum())} differ)")
    expect(np.float32(descale.item()) == np.float32(ref_descale),
           f"descale {descale.item()!r} equals attest's {float(ref_descale)!r}")

    # 2. Static scales: fp8_scaling.cc's arithmetic on the calibration amax, and a fixed
    #    calibration.
    cal = cf.calibration()
    expect(cal == cf.calibration(), "the calibration is the same on every call")
    expect(cal["ds_scale"] == 2.0 ** round(np.log2(cal["ds_scale"])), "scale_dP is a power of two")
    for n in ("q", "k", "v", "do"):
        amax = torch.tensor(cal[n], dtype=torch.float32)
        _, d = cf.quantize(torch.ones(2, 2, dtype=torch.bfloat16), amax)
        scale = np.float32(448.0) / np.float32(cal[n])
        expect(np.float32(d.item()) == np.float32(1.0) / scale,
               f"static descale of {n} is fl32(1 / fl32(448 / amax))")

    # 3. The declared recipes, through attest.
    for mode, holds, output, grads in (
            ("static", True, "bf16", "bf16"), ("current", False, "bf16", "bf16"),
            ("static", True, "e4m3", "bf16"), ("current", False, "e4m3", "bf16"),
            ("static", True, "e4m3", "e4m3"), ("current", False, "e4m3", "e4m3")):
        out = subprocess.run([sys.executable, os.path.join(HERE, "torch_worker.py"), "--backend",
                              "cudnn-fp8", "--device", "cpu", "--fp8-scaling", mode,
                              "--fp8-output", output, "--fp8-grads", grads, "--describe"],
                             check=True, capture_output=True, text=True).stdout
        tail = ("" if output == "bf16" else "-e4m3") + ("-grads" if grads == "e4m3" else "")
        committed = os.path.join(ROOT, "docs", "gpu-results", "cudnn-fp8",
                                 f"describe-{mode}{tail}.json")
        with open(committed) as f:
            expect(f.read() == out, f"{committed} is what torch_worker.py --describe prints")
        recipe = json.loads(out)["capabilities"]["recipe"]
        name = f"cudnn-fp8-{mode}" + ("-e4m3-out" if output == "e4m3" else "") + (
            "-e4m3-grads" if grads == "e4m3" else "")
        expect(recipe["name"] == name, f"{mode}: the recipe is named {name}")
        expect(recipe["output"] == ("e4m3fn" if output == "e4m3" else "bf16"),
               f"{name}: the recipe's output is {recipe['output']}")
        expect(recipe["gradients"] == ("e4m3fn" if grads == "e4m3" else "bf16"),
               f"{name}: the recipe's gradients are {recipe['gradients']}")
        if grads == "e4m3":
            # The CPU model of the recipe judged by its own declaration: E4M3 gradients at
            # their scales pass consistency (no false alarm from the scaled roundings).
            r = subprocess.run([binary, "check", "--kernel", "recipe:" + committed, "--suite",
                                "quick", "--check", "consistency"], capture_output=True,
                               text=True)
            expect(r.returncode == 0, f"{name}: the CPU model passes its own consistency: "
                   + (r.stdout + r.stderr)[-600:])
        r = subprocess.run([binary, "check", "--kernel", "recipe:" + committed, "--suite",
                            "quick", "--check", "non-interference"], capture_output=True,
                           text=True)
        text = r.stdout + r.stderr
        if holds:
            expect(r.returncode == 0, f"{mode}: the CPU model of the recipe does not leak")
        else:
            expect(r.returncode == 1 and "leak through shared scales" in text,
                   f"{mode}: the CPU model of the recipe leaks through its shared scales")
    print(f"cudnn_fp8_test: {'FAIL' if FAILURES else 'ok'} ({len(FAILURES)} failures)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
