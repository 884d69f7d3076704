"""The exported repro.py of the kernels and findings that run on CUDA only, tested on a CPU (ctest
python_export_kinds; ATTEST_CLI the attest executable): `attest repro --export` through
python/tests/standin_torch_worker.py, where a seeded stand-in (python/tests/standins.py) takes
the CUDA entry point's place and the adapter runs its CUDA code path, so that attest finds the
finding and the worker renders the call the adapter made. Each script then runs with PyTorch
alone (one isolated interpreter runs them all, attest unimportable) and its exit status must follow the function
it calls: 1 on the seeded stand-in, 0 on the correct one, 2 (cannot judge) where the call fails
otherwise (the real CUDA op on a CPU). Kinds:
  1. sdpa-efficient+lse, packed batch, lse (K3's case): aten._efficient_attention_forward with
     cu_seqlens, lse judged, the lse layout function written into the script;
  2. sdpa-cudnn+lse, kernel error (K12's case): the script raises the same exception;
  3. sdpa-flash+lse on PyTorch's CPU op, a window as the adapter's additive bias (built in the
     script by the adapter's own `additive`), lse: the real op exits 0;
  4. flex (eager on a CPU), lse (K9's case): the real flex_attention exits 0;
  5. fa4 (FlashAttention-4's signature), gqa-mha (K8's case);
  6. compiled flex_attention as flex-flash and flex-triton call it on CUDA (torch.compile,
     kernel_options, create_block_mask, the score_mod of softcap and ALiBi, a packed batch),
     rendered from a CUDA adapter on the CPU: py_compile, and the script pointed at eager flex
     with --no-wrap exits 0 (at the seeded stand-in, 1).
Exit 77 (skipped) where torch is not importable."""

import json
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKERS = os.path.join(ROOT, "tools", "workers")
FINDINGS = os.path.join(ROOT, "golden", "findings")
try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, HERE)
from repro_runner import run_scripts  # noqa: E402

CLI = os.environ["ATTEST_CLI"]
failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def export(tmp, standin, backend, case, *extra):
    out = os.path.join(tmp, standin)
    spec = (f"exec:{sys.executable} {os.path.join(HERE, 'standin_torch_worker.py')} "
            f"--standin {standin} --backend {backend} --dtype bf16 --device cpu")
    r = subprocess.run([CLI, "repro", "--kernel", spec, "--case", case, "--export", out,
                        *extra], capture_output=True, text=True, timeout=600)
    ok = r.returncode == 1 and os.path.isfile(os.path.join(out, "repro.py"))
    expect(ok, f"{standin}: attest repro --export writes repro.py ({r.returncode}): "
           + (r.stdout + r.stderr)[-300:])
    if ok:
        py_compile.compile(os.path.join(out, "repro.py"), doraise=True)
    return out


RUNS = []  # (label, folder, expected exit status, arguments), run at the end


def expect_exits(folder, label, cases):
    """cases: [(expected exit status, arguments)], run by run_all."""
    if not os.path.isfile(os.path.join(folder, "repro.py")):
        return
    for want, args in cases:
        RUNS.append((label, folder, want, list(args)))


def run_all():
    """Every script of RUNS in one clean interpreter (python/tests/repro_runner.py)."""
    codes, logs = run_scripts([(f, a) for _, f, _, a in RUNS])
    expect(len(codes) == len(RUNS), f"every script ran ({len(codes)} of {len(RUNS)})")
    for (label, _, want, args), rc, log in zip(RUNS, codes, logs):
        expect(rc == want, f"{label}: repro.py {' '.join(args) or '(default)'} exits {want} "
               f"({rc}): " + log.strip()[-300:])


def fn(name, *more):
    return ["--fn", f"standins:{name}", "--path", HERE, *more]


def small_window_case(tmp):
    """B1 H2 8 x 8 D16, window (3, 0): every row sees a key; an attn_mask on the CPU op."""
    path = os.path.join(tmp, "window.case.json")
    with open(path, "w") as f:
        json.dump({"problem": {"batch": 1, "heads_q": 2, "heads_kv": 2, "seqlen_q": 8,
                               "seqlen_k": 8, "head_dim": 16, "head_dim_v": 16, "dtype": "bf16",
                               "scale": None, "causal": False, "causal_align": "bottom_right",
                               "window": [3, 0], "softcap": 0.0, "alibi_slopes": None,
                               "cu_seqlens_q": None, "cu_seqlens_k": None},
                   "generator": {"name": "gaussian", "seed": 7, "params": {}}}, f)
    return path


def test_attest_exports(tmp):
    k3 = os.path.join(FINDINGS, "sdpa-efficient-empty-varlen-sequence-lse.case.json")
    out = export(tmp, "efficient-lse", "sdpa-efficient+lse", k3, "--check", "accuracy")
    text = open(os.path.join(out, "repro.py")).read() if os.path.isdir(out) else ""
    expect("torch.ops.aten._efficient_attention_forward" in text and "q[None]" in text and
           "def lse_to_attest(" in text and "cu_seqlens_q" in text,
           "efficient varlen: the op, q[None], cu_seqlens and lse_to_attest's source rendered")
    expect_exits(out, "efficient lse", [(1, fn("efficient_lse_zero_bug")),
                                        (0, fn("efficient_forward"))])

    k12 = os.path.join(FINDINGS, "sdpa-cudnn-sq0-sk0-no-output.case.json")
    out = export(tmp, "cudnn-none", "sdpa-cudnn+lse", k12, "--check", "accuracy")
    expect_exits(out, "cudnn kernel error", [(1, fn("cudnn_none_bug")),
                                             (0, fn("cudnn_forward")), (2, [])])

    out = export(tmp, "cpu-flash-lse", "sdpa-flash+lse", small_window_case(tmp), "--check",
                 "accuracy", "--export-tensor", "lse")
    text = open(os.path.join(out, "repro.py")).read() if os.path.isdir(out) else ""
    expect("def additive(" in text and "align=1" in text,
           "CPU flash: the bias built by the adapter's own additive()")
    expect_exits(out, "CPU flash lse", [(1, fn("cpu_flash_lse_bug")), (0, [])])

    k9 = os.path.join(FINDINGS, "flex-flash-lse-times-ln2.case.json")
    out = export(tmp, "flex-lse", "flex", k9, "--check", "accuracy", "--export-tensor", "lse")
    expect_exits(out, "flex lse", [(1, fn("flex_lse_ln2_bug")), (0, [])])

    k8 = os.path.join(FINDINGS, "fa4-gqa-vs-mha-dk.case.json")
    out = export(tmp, "fa4-gqa", "fa4", k8, "--check", "gqa-mha")
    expect_exits(out, "fa4 gqa-mha", [(1, fn("fa4_gqa_bug")), (0, fn("fa4_func"))])
    return os.path.join(tmp, "flex-lse")


def test_compiled_flex(tmp, flex_folder):
    """Render flex-flash / flex-triton's CUDA call from an adapter built for CUDA (nothing
    runs on a GPU: describe_call only), into copies of the flex folder of test 4."""
    sys.path.insert(0, WORKERS)
    import torch_backends as tb
    import torch_export
    if not os.path.isfile(os.path.join(flex_folder, "repro.py")):
        return
    problems = {
        "flash": ("FLASH", {}),
        "triton-mask-mods": ("TRITON", {"causal": True, "window": [40, -1], "softcap": 30.0,
                                        "alibi_slopes": [0.5, 0.25, 0.125, 0.0625],
                                        "heads_kv": 2}),
    }
    for label, (flex_backend, change) in problems.items():
        folder = os.path.join(tmp, "compiled-" + label)
        os.makedirs(folder)
        for name in ("case.json", "report.json", "export.json"):
            shutil.copy(os.path.join(flex_folder, name), folder)
        shutil.copy(os.path.join(flex_folder, "attest-inputs.safetensors"),
                    os.path.join(folder, "inputs.safetensors"))
        with open(os.path.join(folder, "case.json")) as f:
            case = json.load(f)
        case["problem"].update(change)
        with open(os.path.join(folder, "case.json"), "w") as f:
            json.dump(case, f)
        if "heads_kv" in change:  # GQA: k and v keep half the heads
            import attest_worker as aw
            t = aw.read_safetensors(os.path.join(folder, "inputs.safetensors"))
            for n in ("k", "v"):
                t[n] = aw.Tensor(t[n].data[:, :, :change["heads_kv"]].copy(), t[n].dtype)
            aw.write_safetensors(os.path.join(folder, "inputs.safetensors"), t)
        args = types.SimpleNamespace(device="cuda", dtype="bf16", flex_dynamic="auto")
        runner = tb.Runner(tb.Flex(args, flex_backend))
        torch_export.export(folder, runner, "bf16", "cpu")
        path = os.path.join(folder, "repro.py")
        py_compile.compile(path, doraise=True)
        text = open(path).read()
        dynamic = "False" if flex_backend == "FLASH" else "None"
        expect(f"fn = torch.compile(fn, dynamic={dynamic})" in text and
               f"kernel_options={{'BACKEND': '{flex_backend}'}}" in text and
               "return_aux=torch.nn.attention.flex_attention.AuxRequest(lse=True)" in text and
               "def flex_mods(" in text and "torch._dynamo.config" in text,
               f"compiled flex {label}: torch.compile, BACKEND, AuxRequest, flex_mods' source "
               "and dynamo's limits rendered")
        if change:
            expect("create_block_mask(" in text and "score_mod=mods[1]" in text,
                   f"compiled flex {label}: block mask and score_mod rendered")
        cases = [(0, fn("flex_eager", "--no-wrap"))]
        if not change:  # the case's own inputs and verdict: the seeded stand-in fails it
            cases.append((1, fn("flex_lse_ln2_bug", "--no-wrap")))
        expect_exits(folder, f"compiled flex {label}", cases)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        flex_folder = test_attest_exports(tmp)
        test_compiled_flex(tmp, flex_folder)
        run_all()
    if failures:
        print(f"export_kinds_test: FAIL ({len(failures)})")
        return 1
    print("export_kinds_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
