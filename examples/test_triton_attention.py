"""The Triton example (docs/byok.md): against a float64 reference on small problems, and
attest's gate with its shape limits declared. On a CUDA GPU in bf16 and f16; on the CPU under
TRITON_INTERPRET=1 in f16 only (Triton's interpreter has no bf16 arithmetic); skipped
otherwise. ctest python_examples runs the float64 tests under the interpreter;
tools/device/byok_triton_gate.sh runs them on the GPU, where attest's package may be absent."""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not (INTERPRET or torch.cuda.is_available()):
    pytest.skip("needs a CUDA GPU, or TRITON_INTERPRET=1", allow_module_level=True)
import triton_attention as kernel  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
DTYPES = ["f16"] if INTERPRET else ["bf16", "f16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("s,causal", [(64, False), (64, True), (128, False), (128, True)])
def test_float64(s, causal, dtype):
    torch.manual_seed(s + causal)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    q, k, v, do = (torch.randn(2, s, 3, 64, device=DEVICE, dtype=dtype) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    got = kernel.triton_attention(q, k, v, causal)
    got = (*got, *torch.autograd.grad(got[0], (q, k, v), do))
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = kernel.reference(*x64, causal)
    ref = (*ref, *torch.autograd.grad(ref[0], x64, do.double()))
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, ref):  # 2 ulps of the largest
        err = (a.double() - b).abs().max().item()
        tol = 2 * torch.finfo(dtype).eps * b.abs().max().item()
        assert err <= tol, f"{name}: error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_gate(dtype, tmp_path):
    attest = pytest.importorskip("attest")
    report = attest.check(kernel.attention, api="attest", caps=kernel.CAPS, suite="gate",
                          dtype=dtype, device=DEVICE, failure_dir=tmp_path)
    assert report.passed, report.summary()
