#!/usr/bin/env python3
"""The wheel's proof on a GPU (tools/device/wheel_gpu_proof.sh runs it; docs/python.md "Proof
on the GPU"): the same kernels judged through the installed wheel in process (attest.check, the
pytest plugin) and through the exec route (the wheel's `attest check --kernel exec:...
tools/workers/torch_worker.py ...`), their verdicts compared.

Kernels (KERNELS):
  sdpa-math, sdpa-flash, sdpa-efficient, sdpa-cudnn
          F.scaled_dot_product_attention under sdpa_kernel(SDPBackend.X) (api="sdpa"), the
          public function; exec route torch_worker.py --backend sdpa-X
  fa4     flash_attn.cute.flash_attn_func (api="flash_attn"); exec route --backend fa4
  flex    flex_attention under torch.compile (Triton), as a function of attest's convention
          (api="attest") calling the workers' FlexAttention adapter; exec route --backend
          flex-triton
The in-process kernels claim what the exec worker claims for the same backend, measured the
same way in this process (torch_backends.Runner(...).caps: SDPA's public routes measure what
they accept), so that both routes run the same cases.

Subcommands:
  inproc --kernel K --out DIR [--dtype --device --suite --seed --threads]
          attest.check in process: DIR/inproc-K.json (the report) and DIR/inproc-K.meta.json
          (seconds, verdicts, oracle_device, the CUDA oracle's library, warnings)
  exec-spec --kernel K [--dtype --device --python --workers DIR]
          prints the exec: spec of K's worker (tools/device/torch_campaign.sh's kernel_of)
  pytest-file --kernels K1,K2 --out FILE [--dtype --device --suite --seed]
          a pytest module with one attest.pytest_suite per kernel (the plugin's items; the
          shell script writes one module per kernel, so that they run in parallel)
  compare A.json B.json
          the differences between two reports' verdicts (exit 1 if any)
  summarize --work DIR --out DIR --kernels K1,K2
          summary.json and summary.txt from DIR's reports and timings
"""

import argparse
import json
import os
import sys
import time
import types
import warnings

KERNELS = ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "fa4", "flex")
WORKER_BACKEND = {"fa4": "fa4", "flex": "flex-triton"}


def worker_backend(kernel):
    if kernel not in KERNELS:
        raise SystemExit(f"wheel_gpu_proof: unknown kernel {kernel!r} ({', '.join(KERNELS)})")
    return WORKER_BACKEND.get(kernel, kernel)


def worker_claim(backend, dtype, device):
    """What torch_worker.py --backend BACKEND claims (its describe reply), made in this
    process by the same code (the wheel's copy of tools/workers/torch_backends.py)."""
    import attest._kernel  # noqa: F401  (puts the wheel's _workers/ on sys.path)
    import torch_backends as tb
    args = types.SimpleNamespace(backend=backend, device=device, dtype=dtype, mask_form="bool",
                                 deterministic=False, flex_dynamic="auto", caps=None, njt=False,
                                 fp8_scaling="static", fp8_output="bf16", fp8_grads="bf16")
    made = tb.make(args)
    return made, dict(tb.Runner(made).caps)


def sdpa_under(kernel):
    """F.scaled_dot_product_attention inside sdpa_kernel(the backend `kernel` names)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    which = {"sdpa-math": SDPBackend.MATH, "sdpa-flash": SDPBackend.FLASH_ATTENTION,
             "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
             "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}[kernel]

    def sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                                  is_causal=is_causal, scale=scale,
                                                  enable_gqa=enable_gqa)
    sdpa.__qualname__ = sdpa.__name__ = kernel.replace("-", "_")
    return sdpa


def kernel_call(kernel, dtype, device):
    """(fn, keyword arguments of attest.check) for `kernel`."""
    if kernel.startswith("sdpa-"):
        _, caps = worker_claim(kernel, dtype, device)
        return sdpa_under(kernel), dict(api="sdpa", caps=caps)
    if kernel == "fa4":
        from flash_attn.cute import flash_attn_func
        return flash_attn_func, dict(api="flash_attn")
    flex, caps = worker_claim("flex-triton", dtype, device)

    def flex_attention(problem, q, k, v):
        return flex.run(problem, q, k, v, need_lse=True)
    return flex_attention, dict(api="attest", caps=caps)


def exec_spec(kernel, dtype, device, python, workers):
    """torch_campaign.sh's kernel_of: the worker with this environment's library path and
    PYTHONPATH (the wheel's folder, FlashAttention-4's)."""
    env = [f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}",
           f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}"]
    return (f"exec:{' '.join(env)} {python} {os.path.join(workers, 'torch_worker.py')} "
            f"--backend {worker_backend(kernel)} --dtype {dtype} --device {device}")


def cmd_inproc(a):
    import attest
    fn, kw = kernel_call(a.kernel, a.dtype, a.device)
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = attest.check(fn, suite=a.suite, dtype=a.dtype, device=a.device, seed=a.seed,
                              threads=a.threads, **kw)
    seconds = time.monotonic() - t0
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"inproc-{a.kernel}.json"), "w") as f:
        f.write(report.to_json())
    meta = {"kernel": a.kernel, "seconds": round(seconds, 3),
            "verdicts": len(report.verdicts), "passed": report.passed,
            "oracle_device": report.data.get("oracle_device"),
            "cuda_oracle": attest._core.cuda_oracle(),
            "ATTEST_ORACLE_CUDA": os.environ.get("ATTEST_ORACLE_CUDA"),
            "attest": attest.__file__,
            "warnings": [str(w.message) for w in caught]}
    with open(os.path.join(a.out, f"inproc-{a.kernel}.meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"inproc {a.kernel}: {meta['verdicts']} verdicts, passed {report.passed}, "
          f"oracle {meta['oracle_device']}, {seconds:.1f} s")
    return 0


PYTEST_TEMPLATE = '''"""attest's pytest plugin on the wheel's GPU proof kernels (written by
tools/device/wheel_gpu_proof.py pytest-file)."""
import sys
sys.path.insert(0, {here!r})
import attest
import wheel_gpu_proof as proof

'''


def cmd_pytest_file(a):
    here = os.path.dirname(os.path.abspath(__file__))
    lines = [PYTEST_TEMPLATE.format(here=here)]
    for k in a.kernels.split(","):
        worker_backend(k)
        name = "test_" + k.replace("-", "_")
        lines.append(f"_fn, _kw = proof.kernel_call({k!r}, {a.dtype!r}, {a.device!r})\n"
                     f"{name} = attest.pytest_suite(_fn, suite={a.suite!r}, seed={a.seed}, "
                     f"dtype={a.dtype!r}, device={a.device!r}, **_kw)\n")
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    return 0


def verdict_keys(report):
    """[(check, tensor, case label, n)] in order, n counting repeats of the same triple, with
    the verdict's pass."""
    seen, out = {}, []
    for v in report.get("verdicts", []):
        key = (v["check"], v.get("tensor", ""), (v.get("case") or {}).get("label", ""))
        n = seen[key] = seen.get(key, -1) + 1
        out.append((key + (n,), bool(v["pass"])))
    return out


def skipped_rows(report):
    return sorted(json.dumps(s, sort_keys=True) for s in report.get("skipped", []))


def compare(a, b, names=("in-process", "exec")):
    """Differences between reports a and b: cases run (verdicts present in one only),
    pass/fail per verdict, rows skipped, the report's verdict and error. [] when they agree."""
    va, vb = dict(verdict_keys(a)), dict(verdict_keys(b))
    diffs = []
    for key in sorted(set(va) | set(vb), key=str):
        label = f"{key[0]}/{key[1]} on '{key[2]}'" + (f" #{key[3] + 1}" if key[3] else "")
        if key not in vb:
            diffs.append(f"{label}: only {names[0]} ({'pass' if va[key] else 'FAIL'})")
        elif key not in va:
            diffs.append(f"{label}: only {names[1]} ({'pass' if vb[key] else 'FAIL'})")
        elif va[key] != vb[key]:
            diffs.append(f"{label}: {names[0]} {'pass' if va[key] else 'FAIL'}, "
                         f"{names[1]} {'pass' if vb[key] else 'FAIL'}")
    sa, sb = skipped_rows(a), skipped_rows(b)
    if sa != sb:
        diffs.append(f"skipped rows differ: {len(sa)} {names[0]}, {len(sb)} {names[1]}; only "
                     f"{names[0]}: {sorted(set(sa) - set(sb))[:3]}, only {names[1]}: "
                     f"{sorted(set(sb) - set(sa))[:3]}")
    for field in ("passed", "error"):
        if a.get(field) != b.get(field):
            diffs.append(f"{field}: {names[0]} {a.get(field)!r}, {names[1]} {b.get(field)!r}")
    return diffs


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cmd_compare(a):
    ra, rb = load(a.a), load(a.b)
    if ra is None or rb is None:
        print(f"compare: cannot read {a.a if ra is None else a.b}", file=sys.stderr)
        return 2
    diffs = compare(ra, rb)
    for d in diffs:
        print(d)
    return 1 if diffs else 0


def route_summary(report, seconds):
    if report is None:
        return None
    n = len(report.get("verdicts", []))
    return {"verdicts": n, "failed_verdicts": sum(not v["pass"] for v in report["verdicts"]),
            "passed": report.get("passed"), "oracle_device": report.get("oracle_device"),
            "seconds": seconds,
            "seconds_per_verdict": round(seconds / n, 4) if n and seconds else None}


def read_rc(path):
    """A .rc file of wheel_gpu_proof.sh: 'EXIT SECONDS'."""
    try:
        code, seconds = open(path).read().split()[:2]
        return int(code), float(seconds)
    except (OSError, ValueError):
        return None, None


def kernel_summary(work, k, expect_oracle=None):
    inproc, exec_ = load(f"{work}/inproc-{k}.json"), load(f"{work}/exec-{k}.json")
    meta = load(f"{work}/inproc-{k}.meta.json") or {}
    rc_in, s_in = read_rc(f"{work}/inproc-{k}.rc")
    rc_ex, s_ex = read_rc(f"{work}/exec-{k}.rc")
    rc_py, s_py = read_rc(f"{work}/pytest-{k}.rc")
    tail = ""
    if os.path.exists(f"{work}/pytest-{k}.log"):
        lines = open(f"{work}/pytest-{k}.log").read().strip().splitlines()
        tail = lines[-1] if lines else ""
    row = {"kernel": k, "exit": {"inproc": rc_in, "exec": rc_ex},
           "pytest": {"exit": rc_py, "seconds": s_py, "tail": tail},
           "inproc": route_summary(inproc, meta.get("seconds") or s_in),
           "exec": route_summary(exec_, s_ex),
           "cuda_oracle": meta.get("cuda_oracle"), "warnings": meta.get("warnings", [])}
    if inproc is not None and exec_ is not None:
        row["differences"] = compare(inproc, exec_)
        row["agree"] = not row["differences"]
    else:
        row["agree"] = None
        row["differences"] = ["a route wrote no report (see its log)"]
    # With --expect-oracle cuda: both reports say oracle_device cuda, and the in-process
    # loader loaded the wheel's own library (the one beside the attest package it imported).
    if expect_oracle:
        lib = (meta.get("cuda_oracle") or {}).get("library") or ""
        own = os.path.join(os.path.dirname(meta.get("attest") or "-"), "libattest_oracle_cuda.so")
        row["oracle_ok"] = bool(
            inproc and exec_ and inproc.get("oracle_device") == expect_oracle and
            exec_.get("oracle_device") == expect_oracle and
            (expect_oracle != "cuda" or lib == own))
    return row


def cmd_summarize(a):
    rows = [kernel_summary(a.work, k, a.expect_oracle) for k in a.kernels.split(",") if k]
    summary = {"kernels": rows, "info": load(f"{a.work}/info.json"),
               "agree": bool(rows) and all(r["agree"] for r in rows)}
    if a.expect_oracle:
        summary["oracle_ok"] = bool(rows) and all(r["oracle_ok"] for r in rows)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    text = []
    for r in rows:
        def fmt(x):
            if x is None:
                return "no report"
            return (f"{x['verdicts']} verdicts ({x['failed_verdicts']} failing), oracle "
                    f"{x['oracle_device']}, {x['seconds']} s = {x['seconds_per_verdict']} "
                    f"s/verdict")
        oracle = f", oracle as expected {r['oracle_ok']}" if "oracle_ok" in r else ""
        text.append(f"{r['kernel']}: agree {r['agree']}{oracle}; in-process "
                    f"{fmt(r['inproc'])}; exec {fmt(r['exec'])}")
        py = r["pytest"]
        if py["exit"] is not None:
            text.append(f"    pytest plugin: exit {py['exit']} in {py['seconds']} s: "
                        f"{py['tail']}")
        text += [f"    {d}" for d in r["differences"][:20]]
        if len(r["differences"]) > 20:
            text.append(f"    ... {len(r['differences']) - 20} more (summary.json)")
    text.append(f"all kernels agree: {summary['agree']}" + (
        f"; oracle_device {a.expect_oracle} everywhere: {summary['oracle_ok']}"
        if a.expect_oracle else ""))
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, kernel=True):
        if kernel:
            p.add_argument("--kernel", required=True, choices=KERNELS)
        p.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
        p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
        p.add_argument("--suite", default="gate")
        p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("inproc")
    common(p)
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int, default=2)
    p = sub.add_parser("exec-spec")
    common(p)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--workers", default="tools/workers")
    p = sub.add_parser("pytest-file")
    common(p, kernel=False)
    p.add_argument("--kernels", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p = sub.add_parser("summarize")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kernels", required=True)
    p.add_argument("--expect-oracle", choices=["cuda", "cpu"],
                   help="the oracle_device both routes' reports must name")
    a = ap.parse_args(argv)
    if a.cmd == "exec-spec":
        print(exec_spec(a.kernel, a.dtype, a.device, a.python, a.workers))
        return 0
    return {"inproc": cmd_inproc, "pytest-file": cmd_pytest_file, "compare": cmd_compare,
            "summarize": cmd_summarize}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
