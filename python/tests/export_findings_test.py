"""Every committed finding of docs/findings/ on a kernel reached from Python renders a standalone
repro.py, checked on a CPU (ctest python_export_findings): for each page and case file, the
page's adapter is built for CUDA (the +lse private ops with their CUDA code path, flex-flash and
flex-triton compiled, FlashAttention-4's signature) and tools/workers/torch_export.py writes the
script for the page's kind of verdict (kernel-error where the page's check is a kernel error,
else accuracy on the tensor it names) into a folder laid out as `attest repro --export` lays it
out, with inputs of the case's shapes. The script must compile (py_compile), and run with PyTorch
alone against a correct CPU stand-in of the kernel (python/tests/standins.py; flex_dense
with --no-wrap) and exit 0: the call it renders is one the stand-in answers, the reference it computes
agrees with it, and a kernel error that is not raised is reported as not reproducing. (Whether
each still reproduces on the GPU is tools/device/findings_export.sh's record.) The public SDPA
routes (P1, P2) render as python_export tests them; P3 has no case file.
Exit 77 (skipped) where torch is not importable."""

import json
import os
import py_compile
import re
import shlex
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
try:
    import torch
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

import standins  # noqa: E402  (puts tools/workers on sys.path)
from repro_runner import run_scripts  # noqa: E402
import attest_worker as aw  # noqa: E402
import torch_backends as tb  # noqa: E402
import torch_export  # noqa: E402

failures = []
# The stand-in each backend's script is pointed at, and extra arguments.
STANDIN = {"sdpa-flash+lse": ["standins:flash_forward"],
           "sdpa-efficient+lse": ["standins:efficient_forward"],
           "sdpa-cudnn+lse": ["standins:cudnn_forward"],
           "flex-flash": ["standins:flex_dense", "--no-wrap"],
           "flex-triton": ["standins:flex_dense", "--no-wrap"],
           "fa4": ["standins:fa4_func"]}


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def page_data(path):
    lines = open(path, encoding="utf-8").read().splitlines()
    start = lines.index("```json")
    end = lines.index("```", start + 1)
    return json.loads("\n".join(lines[start + 1:end]))


def backend_for(name):
    args = types.SimpleNamespace(device="cuda", dtype="bf16", flex_dynamic="auto",
                                 deterministic=False, mask_form="bool", njt=False)
    if name.endswith("+lse"):
        cls = {"sdpa-flash+lse": tb.SdpaFlashLse, "sdpa-efficient+lse": tb.SdpaEfficientLse,
               "sdpa-cudnn+lse": tb.SdpaCudnnLse}[name]
        b = cls(types.SimpleNamespace(**dict(vars(args), device="cpu")))
        b.cuda_api = True
        return b
    if name.startswith("flex"):
        return tb.Flex(args, "FLASH" if name == "flex-flash" else "TRITON")
    fa4 = standins.fa4_func
    fa4.__module__, fa4.__qualname__ = "flash_attn.cute", "flash_attn_func"
    return tb.FlashAttn(args, None, None, fn=fa4, varlen_fn=standins.fa4_varlen_func)


def inputs_of(p):
    g = torch.Generator().manual_seed(1)
    if p.get("cu_seqlens_q") is not None:
        lead_q, lead_k = [p["cu_seqlens_q"][-1]], [p["cu_seqlens_k"][-1]]
    else:
        lead_q, lead_k = [p["batch"], p["seqlen_q"]], [p["batch"], p["seqlen_k"]]
    shapes = {"q": lead_q + [p["heads_q"], p["head_dim"]],
              "k": lead_k + [p["heads_kv"], p["head_dim"]],
              "v": lead_k + [p["heads_kv"], p["head_dim_v"]],
              "do": lead_q + [p["heads_q"], p["head_dim_v"]]}
    out = {}
    for n, s in shapes.items():
        t = torch.randn(s, generator=g).to(torch.bfloat16)
        out[n] = aw.Tensor(t.view(torch.int16).numpy().view("uint16"), "BF16")
    return out


def verdict_for(page):
    check = page["check"]
    if check.startswith("kernel error"):
        what = "backward" if "backward" in check else "forward"
        return {"check": "kernel-error", "tensor": "", "pass": False, "policy": "",
                "message": f"{what}: worker reported an error: RuntimeError: stand-in"}
    m = re.search(r"\(([a-z, ]+)", check)
    tensor = next((t for t in re.split(r"[ ,]+", m.group(1)) if t in
                   ("o", "lse", "dq", "dk", "dv")), "o") if m else "o"
    return {"check": "accuracy", "tensor": tensor, "pass": False, "policy": "a stand-in's",
            "observed": 1.0, "allowed": 0.05, "margin": 20.0, "worst": None,
            "message": "stand-in verdict"}


def one(tmp, page, case):
    words = shlex.split(page["repro"])
    spec = shlex.split(words[words.index("--kernel") + 1][5:])
    name = spec[spec.index("--backend") + 1]
    if name not in STANDIN:
        return
    label = f"{page['id']} {os.path.basename(case)} ({name})"
    folder = os.path.join(tmp, f"{page['id']}-{os.path.basename(case)}")
    os.makedirs(folder)
    with open(os.path.join(ROOT, case)) as f:
        c = json.load(f)
    p = c["problem"]
    with open(os.path.join(folder, "case.json"), "w") as f:
        json.dump(c, f)
    aw.write_safetensors(os.path.join(folder, "inputs.safetensors"), inputs_of(p))
    v = verdict_for(page)
    with open(os.path.join(folder, "report.json"), "w") as f:
        json.dump({"verdicts": [v]}, f)
    with open(os.path.join(folder, "export.json"), "w") as f:
        json.dump({"attest_version": "test", "kernel": name, "case_label": case,
                   "command": page["repro"], "check": v["check"], "tensor": v["tensor"]}, f)
    try:
        torch_export.export(folder, tb.Runner(backend_for(name)), "bf16", "cuda")
    except torch_export.NotExportable as e:
        expect(False, f"{label}: not exportable: {e}")
        return
    py_compile.compile(os.path.join(folder, "repro.py"), doraise=True)
    return (label + f": {v['check']}/{v['tensor'] or '-'}", folder,
            ["--fn", STANDIN[name][0], "--path", HERE, "--device", "cpu"] + STANDIN[name][1:])


def main():
    folder = os.path.join(ROOT, "docs", "findings")
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for name in sorted(os.listdir(folder)):
            if re.match(r"^K[0-9]+[a-z]?-.*\.md$", name):
                page = page_data(os.path.join(folder, name))
                runs += [r for r in (one(tmp, page, case) for case in page["case_files"]) if r]
        expect(len(runs) >= 24, f"{len(runs)} finding cases rendered")
        codes, logs = run_scripts([(f, a) for _, f, a in runs])
        expect(len(codes) == len(runs), "every script ran")
        for (label, _, _), rc, log in zip(runs, codes, logs):
            expect(rc == 0, f"{label} repro.py compiles and exits 0 on a correct stand-in "
                   f"({rc}): " + log.strip()[-300:])
    if failures:
        print(f"export_findings_test: FAIL ({len(failures)})")
        return 1
    print("export_findings_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
