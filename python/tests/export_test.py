"""`attest repro --export` and Verdict.export (ctest python_export; PYTHONPATH holds the built
package, ATTEST_CLI the attest executable): the exported repro.py runs with PyTorch alone (a
child interpreter in isolated mode, `attest` made unimportable), exits 1 while the finding is
there and 0 when pointed at a correct function, for
  1. seeded bugs through api="sdpa" and api="flash_attn" in process (python/tests/
     kernels_for_tests.py sdpa_scale_bug, flash_attn_scale_bug; small cases, inputs written
     into the script), the same export twice byte-identical, Verdict.export of a suite case;
  2. PyTorch's CPU flash backward on GQA (golden/findings/sdpa-cpu-flash-bf16-gqa-dv-
     accumulated-in-bf16.case.json, check gqa-mha) through the exec: worker `python -m
     attest.worker` (inputs in inputs.safetensors), pointed at the math backend on float64;
  3. a built-in kernel (a mutant): the attest-only folder, with the reason;
  4. bad input: exit 2 and no folder.
Exit 77 (skipped) where torch is not importable."""

import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
try:
    import torch  # noqa: F401
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

import attest  # noqa: E402
import kernels_for_tests as kt  # noqa: E402

CLI = os.environ["ATTEST_CLI"]
GQA_CASE = os.path.join(ROOT, "golden", "findings",
                        "sdpa-cpu-flash-bf16-gqa-dv-accumulated-in-bf16.case.json")
failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def run_script(folder, *args, env=None):
    """repro.py in a clean interpreter: isolated mode (no PYTHONPATH, no user site, not its
    own folder on sys.path), `attest` unimportable, a fresh environment."""
    boot = ("import runpy, sys; sys.modules['attest'] = None; "
            f"sys.argv = ['repro.py'] + {list(args)!r}; "
            "runpy.run_path('repro.py', run_name='__main__')")
    clean = {"PATH": "/usr/bin:/bin", "HOME": folder, **(env or {})}
    r = subprocess.run([sys.executable, "-I", "-c", boot], cwd=folder, env=clean,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def small_case(tmp, causal=False):
    """B1 Hq2 Hkv1 8 x 8 D16 f32, window (3, 0): an attn_mask, so that sdpa_scale_bug's bug
    (the scale dropped on the masked path) shows; with `causal`, causal and no window."""
    path = os.path.join(tmp, "causal.case.json" if causal else "small.case.json")
    with open(path, "w") as f:
        json.dump({"problem": {"batch": 1, "heads_q": 2, "heads_kv": 1, "seqlen_q": 8,
                               "seqlen_k": 8, "head_dim": 16, "head_dim_v": 16, "dtype": "f32",
                               "scale": None, "causal": causal,
                               "causal_align": "bottom_right",
                               "window": [-1, -1] if causal else [3, 0], "softcap": 0.0, "alibi_slopes": None,
                               "cu_seqlens_q": None, "cu_seqlens_k": None},
                   "generator": {"name": "gaussian", "seed": 7, "params": {}}}, f)
    return path


def test_in_process(tmp):
    case = small_case(tmp)
    kw = dict(api="sdpa", dtype="f32", device="cpu")
    out = os.path.join(tmp, "mutant")
    rc = attest.repro(kt.sdpa_scale_bug, case, check="accuracy", export=out, **kw)
    expect(rc == 1 and os.path.isfile(os.path.join(out, "repro.py")),
           "api=sdpa mutant: repro.py exported")
    expect(not os.path.exists(os.path.join(out, "inputs.safetensors")),
           "small case: inputs written into the script")
    text = open(os.path.join(out, "repro.py")).read()
    expect("attn_mask=attn_mask" in text and "scale=0.25" in text and
           "DEFAULT_FN = 'kernels_for_tests:sdpa_scale_bug'" in text,
           "the rendered call names the function and its keyword arguments")
    rc, log = run_script(out)
    expect(rc == 1 and "FINDING REPRODUCES" in log, f"mutant: repro.py exits 1 ({rc}): "
           + log[-400:])
    rc, log = run_script(out, "--fn", "kernels_for_tests:eager_sdpa", "--path", HERE)
    expect(rc == 0, f"mutant: repro.py --fn eager_sdpa exits 0 ({rc}): " + log[-400:])
    rc, log = run_script(out, "--path", HERE,
                         env={"ATTEST_REPRO_FN": "kernels_for_tests:eager_sdpa"})
    expect(rc == 0, f"mutant: ATTEST_REPRO_FN=eager_sdpa exits 0 ({rc}): " + log[-400:])
    # The same seed and case: the same export, byte for byte.
    again = os.path.join(tmp, "mutant2")
    attest.repro(kt.sdpa_scale_bug, case, check="accuracy", export=again, **kw)
    same = all(open(os.path.join(out, n), "rb").read() ==
               open(os.path.join(again, n), "rb").read()
               for n in ("repro.py", "attest-inputs.safetensors"))
    expect(same, "the same case exports the same repro.py and inputs")
    # A flash_attn_func (FlashAttention-2's convention) with a seeded bug.
    fa = os.path.join(tmp, "flash_attn")
    causal = small_case(tmp, causal=True)
    rc = attest.repro(kt.flash_attn_scale_bug, causal, check="accuracy", export=fa,
                      api="flash_attn", dtype="f32", device="cpu")
    expect(rc == 1 and "softmax_scale=0.25, causal=True" in
           open(os.path.join(fa, "repro.py")).read(), "api=flash_attn mutant: call rendered")
    rc, log = run_script(fa)
    expect(rc == 1, f"flash_attn mutant: repro.py exits 1 ({rc}): " + log[-400:])
    rc, log = run_script(fa, "--fn", "kernels_for_tests:fake_flash_attn_func", "--path", HERE)
    expect(rc == 0, f"flash_attn mutant: --fn fake_flash_attn_func exits 0 ({rc}): "
           + log[-400:])
    # Verdict.export from a check's report.
    report = attest.check(kt.sdpa_scale_bug, suite="quick", only_check="accuracy",
                          failure_dir=os.path.join(tmp, "failures"), **kw)
    v = report.failures[0]
    folder = v.export(os.path.join(tmp, "verdict"))
    expect(os.path.isfile(os.path.join(folder, "repro.py")) and
           os.path.isfile(os.path.join(folder, "inputs.safetensors")),
           "Verdict.export: repro.py and inputs.safetensors (a suite case is large)")
    rc, log = run_script(folder)
    expect(rc == 1, f"Verdict.export: repro.py exits 1 ({rc}): " + log[-400:])


def test_gqa_finding(tmp):
    spec = (f"exec:{shlex.quote(sys.executable)} -m attest.worker "
            "torch.nn.functional:scaled_dot_product_attention --api sdpa --dtype bf16 "
            "--device cpu")
    out = os.path.join(tmp, "gqa")
    r = subprocess.run([CLI, "repro", "--kernel", spec, "--case", GQA_CASE, "--check",
                        "gqa-mha", "--export", out], capture_output=True, text=True)
    expect(r.returncode == 1 and os.path.isfile(os.path.join(out, "repro.py")),
           f"gqa-dv finding: attest repro --export writes repro.py ({r.returncode}): "
           + (r.stdout + r.stderr)[-400:])
    report = open(os.path.join(out, "REPORT.md")).read()
    expect("torch" in report and "```python" in report and "dv" in report,
           "REPORT.md: environment, the script, the tensor")
    rc, log = run_script(out)
    expect(rc == 1 and "FINDING REPRODUCES" in log,
           f"gqa-dv: repro.py exits 1 with PyTorch alone ({rc}): " + log[-400:])
    rc, log = run_script(out, "--fn", "kernels_for_tests:sdpa_float64", "--path", HERE)
    expect(rc == 0, f"gqa-dv: repro.py on the math backend in float64 exits 0 ({rc}): "
           + log[-400:])


def test_attest_only(tmp):
    case = os.path.join(tmp, "causal.case.json")
    with open(case, "w") as f:
        json.dump({"problem": {"batch": 1, "heads_q": 1, "heads_kv": 1, "seqlen_q": 4,
                               "seqlen_k": 8, "head_dim": 16, "head_dim_v": 16,
                               "dtype": "bf16", "scale": None, "causal": True,
                               "causal_align": "bottom_right", "window": [-1, -1],
                               "softcap": 0.0, "alibi_slopes": None, "cu_seqlens_q": None,
                               "cu_seqlens_k": None},
                   "generator": {"name": "gaussian", "seed": 3, "params": {}}}, f)
    out = os.path.join(tmp, "builtin")
    r = subprocess.run([CLI, "repro", "--kernel", "mutant/causal-top-left", "--case", case,
                        "--check", "accuracy", "--export", out], capture_output=True, text=True)
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    expect(r.returncode == 1 and "repro.py" not in names and
           {"REPORT.md", "case.json", "inputs.safetensors", "oracle.safetensors",
            "repro.sh"} <= set(names), f"built-in kernel: the attest-only folder {names}")
    text = open(os.path.join(out, "REPORT.md")).read() if names else ""
    expect("No standalone script: the kernel is not reached from Python" in text and
           "attest repro --kernel mutant/causal-top-left --case case.json" in text,
           "attest-only REPORT.md: why, and the one attest command")


def test_bad_input(tmp):
    busy = os.path.join(tmp, "busy")
    os.makedirs(busy)
    open(os.path.join(busy, "keep"), "w").close()
    r = subprocess.run([CLI, "repro", "--kernel", "mutant/causal-top-left", "--case", GQA_CASE,
                        "--export", busy], capture_output=True, text=True)
    expect(r.returncode == 2 and "--export" in r.stderr and os.listdir(busy) == ["keep"],
           f"--export into a non-empty folder: exit 2, untouched ({r.returncode}): "
           + r.stderr[-200:])
    missing = os.path.join(tmp, "never")
    r = subprocess.run([CLI, "repro", "--kernel", "mutant/causal-top-left", "--case",
                        os.path.join(tmp, "no-such.case.json"), "--export", missing],
                       capture_output=True, text=True)
    expect(r.returncode == 2 and "no-such.case.json" in r.stderr and
           not os.path.exists(missing), "a missing case file: exit 2 naming it, no folder")
    leftovers = [n for n in os.listdir(tmp) if n.startswith(".")]
    expect(not leftovers, f"no temporary folders left behind: {leftovers}")


def main():
    with tempfile.TemporaryDirectory(prefix="attest-export-test-") as tmp:
        for test in (test_in_process, test_gqa_finding, test_attest_only, test_bad_input):
            test(tmp)
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
