"""The standalone repro of `attest repro --export DIR` for a kernel reached from Python (the
adapters of torch_backends.py, through torch_worker.py or `python -m attest.worker`, or in
process through the Python package): repro.py and REPORT.md, written into a folder that
`attest repro --export` has filled with the case (case.json), its inputs (inputs.safetensors,
attest's layout), attest's float64 oracle and the run's report (report.json, export.json).

repro.py imports torch (and the kernel's own module); safetensors only where the inputs are too
large to write into the script. It makes the call the adapter makes, rendered from the call
description the adapter executes (torch_call.py; the adapter's describe_call), computes a
float64 reference with plain PyTorch under the case's mask rules, compares what attest compared
at the worst location it reported, against attest's allowance there, and exits 1 while the
finding reproduces, 0 once it does not. `--fn MODULE:FUNCTION` (or ATTEST_REPRO_FN) calls
another function with the same signature in the kernel's place.
"""

import json
import os
import platform
import re
import shutil

import numpy as np
import torch

import attest_worker as aw
import torch_call as tc
import torch_export_script as tes
from torch_backends_common import to_torch

# Inputs up to this many elements in all are written into repro.py; larger ones go to
# inputs.safetensors beside it.
INLINE_ELEMENTS = 4096

# The checks whose rule the script can state as a comparison it makes itself, and the kernel
# error (the call raises; the script raises it again).
EXPORTABLE = ("accuracy", "gqa-mha", "determinism", "kernel-error")


class NotExportable(Exception):
    """The finding cannot be written as a standalone script; the message says why."""


def environment():
    """The versions a maintainer asks for: Python, torch, CUDA, cuDNN, the GPU."""
    env = {"python": platform.python_version(), "platform": platform.platform(),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
           else None,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    return env


def pick_verdict(report, check=None, tensor=None):
    """The failing verdict to export: the one named by check and tensor, else the report's
    first failing one (diagnosis order: the first names the bug class)."""
    failing = [v for v in report["verdicts"] if not v["pass"]]
    for v in failing:
        if (check is None or v["check"] == check) and (tensor is None or v["tensor"] == tensor):
            return v
    if check is not None or tensor is not None:
        raise NotExportable(f"no failing verdict {check or ''}/{tensor or ''} in the report")
    if not failing:
        raise NotExportable("every verdict passed: nothing to export")
    return failing[0]


def _why_not(backend, verdict, problem):
    if verdict["check"] not in EXPORTABLE:
        return (f"the {verdict['check']} check compares runs attest builds itself (its "
                f"rule is not one comparison a short script can make); run the attest "
                f"command below")
    if not hasattr(backend, "describe_call"):
        return (f"the adapter {backend.name} does not describe its call as data "
                f"(tools/workers/torch_call.py), so the script cannot render it")
    if verdict["check"] != "kernel-error" and \
            verdict["tensor"] not in ("o", "lse", "dq", "dk", "dv"):
        return f"the verdict judges {verdict['tensor']!r}, not an output tensor"
    if verdict["check"] == "gqa-mha" and problem["heads_q"] == problem["heads_kv"]:
        return "gqa-mha on a problem without GQA"
    return None


def export(folder, runner, dtype, device, fn_path=None, check=None, tensor=None):
    """Writes repro.py and REPORT.md into `folder` (filled by `attest repro --export`) for the
    kernel `runner` (a torch_backends.Runner) and the failing verdict chosen by pick_verdict.
    Raises NotExportable with the reason where the finding has no standalone form."""
    with open(os.path.join(folder, "report.json")) as f:
        report = json.load(f)
    with open(os.path.join(folder, "export.json")) as f:
        meta = json.load(f)
    with open(os.path.join(folder, "case.json")) as f:
        problem = json.load(f)["problem"]
    verdict = pick_verdict(report, check or meta.get("check"), tensor or meta.get("tensor"))
    backend = runner.backend
    why = _why_not(backend, verdict, problem)
    if not why and runner.explicit_backward is not None and _backward(verdict):
        why = ("the gradients come from an explicit backward function, not from autograd "
               "through the call the script renders")
    if why:
        raise NotExportable(why)
    files = aw.read_safetensors(os.path.join(folder, "inputs.safetensors"))
    inputs = {n: to_torch(files[n], dtype, "cpu") for n in ("q", "k", "v", "do") if n in files}
    # The call as attest made it: with lse where its forward asked for one (the claim), without
    # in a backward (autograd through the call, Runner.backward); its tensors on the CPU (the
    # script moves them to its device).
    need_lse = bool(runner.caps.get("lse", True)) and not _backward(verdict)
    cpu = torch.device("cpu")
    dt = inputs["q"].dtype
    calls = [("kernel_call", backend.describe_call(problem, dt, need_lse=need_lse,
                                                   device=cpu))]
    if verdict["check"] == "gqa-mha":
        mha = backend.describe_call(dict(problem, heads_kv=problem["heads_q"]), dt,
                                    need_lse=need_lse, device=cpu)
        for d in mha.data():
            d.name = "mha_" + d.name
        calls.append(("kernel_call_mha", mha))
    for _, call in calls:
        try:
            call.source("f", tc.Sources())
            call.wrap_source(tc.Sources())
            call.prelude_source(tc.Sources())
        except (TypeError, OSError) as e:
            raise NotExportable(f"the call has an argument with no source form ({e})")
    target = calls[0][1].target
    default_fn = fn_path or f"{target.module}:{target.name}"
    if target.module == "__main__" or "<" in target.name:
        default_fn = None  # not importable by name: the script asks for --fn
    context = calls[0][1].context
    meta["kernel_label"] = (f"{target.path}" +
                            (f" under {tc.render(context, set())}" if context else "") +
                            f" ({dtype}, {device})")
    meta["forward_mode"] = type(backend.grad_mode()).__name__  # no_grad, enable_grad
    script = _script(problem, verdict, meta, inputs, calls, default_fn, device,
                     _import_root(target), folder)
    stage = os.path.join(folder, ".repro.tmp")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    data_file = script.pop("safetensors", None)
    if data_file is not None:
        aw.write_safetensors(os.path.join(stage, "inputs.safetensors"), data_file)
    with open(os.path.join(stage, "repro.py"), "w") as f:
        f.write(script["text"])
    os.chmod(os.path.join(stage, "repro.py"), 0o755)
    with open(os.path.join(stage, "REPORT.md"), "w") as f:
        f.write(_report(problem, verdict, meta, script, calls, data_file is not None))
    # attest's own inputs (what `attest repro` and the oracle read) keep their file as
    # attest-inputs.safetensors: inputs.safetensors is the script's, where it has one.
    os.replace(os.path.join(folder, "inputs.safetensors"),
               os.path.join(folder, "attest-inputs.safetensors"))
    for name in os.listdir(stage):
        os.replace(os.path.join(stage, name), os.path.join(folder, name))
    os.rmdir(stage)
    return verdict


def error_type(verdict):
    """(class, message) of the exception a kernel-error verdict names ("... RuntimeError:
    text"): the last such name in its message; (None, "") for other verdicts or where none is
    named."""
    if verdict["check"] != "kernel-error":
        return None, ""
    message = verdict.get("message") or ""
    names = list(re.finditer(r"\b([A-Z]\w*(?:Error|Exception)): ", message))
    if not names:
        return None, ""
    return names[-1].group(1), message[names[-1].end():].split("; last stderr line")[0]


def _backward(verdict):
    """Whether the verdict judges a backward: a gradient, or a kernel error in the backward."""
    if verdict["check"] == "kernel-error":
        return (verdict.get("message") or "").startswith("backward")
    return verdict["tensor"] in ("dq", "dk", "dv")


def _import_root(target):
    """The folder the target's top-level module is imported from, where it is not installed
    (site-packages) nor torch's: what the script puts on sys.path for its default function."""
    import sys
    module = sys.modules.get(target.module)
    path = getattr(module, "__file__", None)
    if not path or target.module.split(".")[0] in ("torch",) or "site-packages" in path:
        return None
    root = os.path.dirname(os.path.abspath(path))
    for _ in range(target.module.count(".")):
        root = os.path.dirname(root)
    return root


# ---- The script ----

_DTYPE_NAMES = {torch.bfloat16: "torch.bfloat16", torch.float16: "torch.float16",
                torch.float32: "torch.float32", torch.float64: "torch.float64",
                torch.bool: "torch.bool", torch.int32: "torch.int32", torch.int64: "torch.int64"}


def _codes(t):
    """A tensor as a safetensors entry of attest_worker (bool as U8)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bool:
        return aw.Tensor(t.to(torch.uint8).numpy(), "U8")
    if t.dtype in (torch.int32, torch.int64):
        return aw.Tensor(t.numpy(), "I32" if t.dtype == torch.int32 else "I64")
    if t.dtype == torch.bfloat16:
        return aw.Tensor(t.view(torch.int16).numpy().view(np.uint16), "BF16")
    name = {torch.float16: "F16", torch.float32: "F32", torch.float64: "F64"}[t.dtype]
    return aw.Tensor(t.numpy(), name)


def _literal(t):
    """Source for tensor `t`, exact: its values as decimal floats (each the shortest text that
    reads back as the same float64, and every bf16, f16 and f32 value is one)."""
    t = t.detach().to("cpu").contiguous()
    shape = list(t.shape)
    if t.dtype == torch.bool:
        bits = "".join("1" if x else "0" for x in t.reshape(-1).tolist())
        chunks = [bits[i:i + 80] for i in range(0, len(bits), 80)] or [""]
        body = "\n".join(f"        {c!r}" for c in chunks)
        return f"_mask(\n{body},\n        {shape})"
    if t.dtype in (torch.int32, torch.int64):
        return f"torch.tensor({t.tolist()!r}, dtype={_DTYPE_NAMES[t.dtype]})"
    words = [tc.render(float(x), set()) for x in t.double().reshape(-1).tolist()]
    lines, line = [], ""
    for w in words:
        if len(line) + len(w) + 2 > 92:
            lines.append(line)
            line = ""
        line += w + ", "
    if line:
        lines.append(line)
    body = "\n".join("        " + ln.rstrip() for ln in lines)
    return f"_values([\n{body}\n    ], {shape}, {_DTYPE_NAMES[t.dtype]})"


def _where(worst):
    if not worst:
        return "the whole tensor"
    axis = worst.get("seq_axis") or "i"
    parts = [f"{name}={worst[key]}" for key, name in (("b", "b"), ("h", "h"), ("i", axis),
                                                         ("d", "d")) if worst.get(key) is not None]
    return "(" + ", ".join(parts) + ")"


def rule_in_words(verdict, problem):
    t = verdict["tensor"]
    c = verdict["check"]
    if c == "accuracy":
        return (f"{t} must match the float64 reference of the same inputs within attest's "
                f"tolerance ({verdict['policy']})")
    if c == "gqa-mha":
        r = problem["heads_q"] // problem["heads_kv"]
        what = (f"the sum of the MHA call's {t} over each group's {r} query heads"
                if t in ("dk", "dv") else f"the MHA call's {t}")
        return (f"GQA ({problem['heads_q']} query heads, {problem['heads_kv']} kv heads) must "
                f"equal MHA with k and v repeated per group: {t} of the GQA call must equal "
                f"{what}, within {verdict['policy']}")
    if c == "determinism":
        return f"two identical calls must return bitwise-equal {t}"
    if c == "kernel-error":
        return ("a call on a problem the kernel accepts must answer without raising an "
                "error; it raised one in the " +
                ("backward" if (verdict.get("message") or "").startswith("backward")
                 else "forward"))
    return verdict.get("message", "")


def _script(problem, verdict, meta, inputs, calls, default_fn, device, path_root, folder):
    imports = tc.Sources({"torch"})
    call_lines = []
    data = []
    for name, call in calls:
        call_lines += call.source(name, imports) + ["", ""]
        data += call.data()
    wrap = calls[0][1].wrap_source(imports)
    prelude = calls[0][1].prelude_source(imports)
    tensors = dict(inputs)
    for d in data:
        tensors[d.name] = d.tensor
    elements = sum(t.numel() for t in tensors.values())
    inline = elements <= INLINE_ELEMENTS
    out = {}
    load = ["def load_inputs(device):",
            '    """q, k, v, do in attest\'s layout ([B, S, H, D]) and the tensors the adapter '
            'built."""']
    if inline:
        for n, t in tensors.items():
            load.append(f"    {n} = {_literal(t)}")
        load.append("    t = dict(" + ", ".join(f"{n}={n}" for n in tensors) + ")")
    else:
        out["safetensors"] = {n: _codes(t) for n, t in tensors.items()}
        load += ["    # Too large to write here: inputs.safetensors beside this script.",
                 "    from safetensors.torch import load_file",
                 "    t = load_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "
                 "\"inputs.safetensors\"))",
                 ]
        masks = [n for n, x in tensors.items() if x.dtype == torch.bool]
        if masks:
            load += [f"    for n in {masks!r}:  # stored as uint8",
                     "        t[n] = t[n].bool()"]
    load.append("    return {n: x.to(device) for n, x in t.items()}")
    tensor = verdict["tensor"]
    worst = verdict.get("worst") or None
    v_short = {k: verdict.get(k) for k in ("check", "tensor", "policy", "observed", "allowed",
                                           "margin", "message")}
    v_short["worst"] = worst
    v_short["where"] = _where(worst)
    if verdict["check"] == "kernel-error":
        title = f"the call raises an error ({meta.get('case_label') or 'attest case'})"
        saw = f"attest {meta['attest_version']} saw: {verdict.get('message')}"
    else:
        title = f"{verdict['check']} fails on {tensor} ({meta.get('case_label') or 'attest case'})"
        saw = (f"attest {meta['attest_version']} saw {tensor} = "
               f"{_num(worst and worst.get('observed'))} where "
               f"{'the reference is' if verdict['check'] == 'accuracy' else 'the relation predicts'} "
               f"{_num(worst and worst.get('reference'))} at {_where(worst)}: |error| "
               f"{_num(verdict.get('observed'))}, allowed {_num(verdict.get('allowed'))}.")
    no_wrap = "" if wrap is None else (
        f"\n    python3 repro.py --fn M:F --no-wrap  M:F called as it is, not through {wrap}")
    header = f"""#!/usr/bin/env python3
\"\"\"{meta.get('kernel_label') or meta['kernel']}: {title}.

Rule: {rule_in_words(verdict, problem)}.
{saw}

Written by `attest repro --export`; needs PyTorch and the kernel's own module only{'' if inline else ' (and safetensors, for inputs.safetensors beside it)'}.
    python3 repro.py                        exit 1 while the finding reproduces, 0 once not
                                            (2: the call raised where a value was judged)
    python3 repro.py --fn MODULE:FUNCTION   the same call on another function with the same
                                            signature (or ATTEST_REPRO_FN=MODULE:FUNCTION){no_wrap}
\"\"\"
"""
    body = [header, "import argparse", "import importlib", "import os", "import platform",
            "import sys", ""]
    body += [f"import {m}" for m in sorted(imports) if m != "builtins"]
    body += ["", "",
             "# The case: attest's problem object (its case file's \"problem\"), and attest's "
             "verdict.",
             "PROBLEM = " + _pyjson(problem),
             "VERDICT = " + _pyjson(v_short),
             f"RULE = {rule_in_words(verdict, problem)!r}",
             f"CHECK = {verdict['check']!r}",
             f"TENSOR = {tensor!r}",
             f"KERNEL = {meta.get('kernel_label') or meta['kernel']!r}",
             f"DEFAULT_FN = {default_fn!r}",
             f"FN_PATH = {[path_root] if path_root else []!r}  # where DEFAULT_FN is "
             "imported from",
             f"DEVICE = {str(device)!r}",
             f"HAS_LSE = {calls[0][1].lse is not None!r}  # the call returns (o, lse)",
             f"FORWARD_MODE = {meta.get('forward_mode', 'no_grad')!r}  # the adapter's forward "
             "grad mode",
             f"ERROR_TYPE = {error_type(verdict)[0]!r}  # the exception attest saw (kernel-error)",
             f"ERROR_TEXT = {error_type(verdict)[1]!r}  # its message",
             "", ""]
    body += tes.HELPERS.splitlines() + ["", ""]
    if imports.defs:
        body += ["# The functions of attest's adapters that the call runs, as their source "
                 "(tools/workers/", "# torch_backends_*.py; torch_call.Func).", ""]
        for src in imports.defs.values():
            body += src.rstrip().splitlines() + ["", ""]
    body += load + ["", ""]
    body += ["# The call attest made: rendered from the call description its adapter "
             "executes", "# (tools/workers/torch_backends.py describe_call).", ""]
    body += call_lines
    body += tes.REFERENCE.splitlines() + ["", ""]
    data_names = [d.name for d in calls[0][1].data()]
    mha_names = [d.name for d in calls[1][1].data()] if len(calls) > 1 else []
    body += tes.main_source(verdict, data_names, mha_names, wrap, prelude).splitlines()
    out["text"] = "\n".join(body).rstrip() + "\n"
    out["call_source"] = "\n".join(call_lines).rstrip() + "\n"
    return out


def _num(x):
    return "-" if x is None else f"{x:.9g}"


def _pyjson(obj):
    """A JSON object as Python source, one key a line."""
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in sorted(obj.items())) + "}"


def _report(problem, verdict, meta, script, calls, has_data):
    worst = verdict.get("worst") or {}
    env = meta.get("environment") or environment()
    env_lines = "\n".join(f"- {k}: {v}" for k, v in env.items())
    text = script["text"]
    embed = text if len(text) <= 60000 else None
    rel = "the relation's prediction" if verdict["check"] != "accuracy" else \
        "the float64 reference"
    what = ("the call raises an error" if verdict["check"] == "kernel-error" else
            f"{verdict['check']} fails on {verdict['tensor']}")
    lines = [
        f"# {meta.get('kernel_label') or meta['kernel']}: {what}",
        "",
        f"**Case.** {meta.get('case_label') or ''} (`case.json`: "
        f"{_shape(problem)}).",
        "",
        f"**Rule.** {rule_in_words(verdict, problem)}.",
        "",
        (f"**Expected vs actual.** An answer is expected; the call raised: "
         f"{verdict.get('message')}" if verdict["check"] == "kernel-error" else
         f"**Expected vs actual.** At {_where(worst or None)} of {verdict['tensor']}: the "
         f"kernel returned {_num(worst.get('observed'))}, {rel} is "
         f"{_num(worst.get('reference'))}; |error| {_num(verdict.get('observed'))} where "
         f"attest allows {_num(verdict.get('allowed'))} ({verdict.get('policy')})."),
        "",
        f"**What the script compares.** {_compares(verdict)}",
        "",
        f"attest's verdict: {verdict.get('message')}",
        "",
        "**Reproduce** with PyTorch alone" +
        (" (and safetensors, for `inputs.safetensors`)" if has_data else "") +
        ": `python3 repro.py` prints the environment, the values at that location and exits 1 "
        "while the finding reproduces, 0 once it does not. `python3 repro.py --fn "
        "MODULE:FUNCTION` makes the same call on another function with the same signature.",
        "",
        "## Environment of the export",
        "",
        env_lines,
        f"- attest: {meta['attest_version']}",
        "",
        "The script prints the environment it runs in first.",
        "",
        "## The call",
        "",
        "```python",
        script["call_source"].rstrip(),
        "```",
        "",
        "## repro.py",
        "",
    ]
    if embed is not None:
        lines += ["```python", embed.rstrip(), "```", ""]
    else:
        lines += ["(too long to paste here: see repro.py)", ""]
    lines += ["## With attest", "", "```bash", meta["command"], "```", "",
              "Files: `repro.py` (the script)" +
              (", `inputs.safetensors` (its inputs)" if has_data else "") +
              ", `case.json` (attest's case), `attest-inputs.safetensors` (q, k, v, do as "
              "attest made them), `oracle.safetensors` (attest's float64 oracle: o, lse and "
              "the gradients), `outputs.safetensors` (what the kernel returned to attest), "
              "`report.json` (the verdicts), `repro.sh` (the attest command).", ""]
    return "\n".join(lines)


def _compares(verdict):
    t = verdict["tensor"]
    worst = verdict.get("worst")
    if verdict["check"] == "kernel-error":
        return ("nothing: it makes the call (" +
                ("forward, then the backward by autograd"
                 if (verdict.get("message") or "").startswith("backward") else "forward") +
                ") and fails while the call raises; it prints the exception.")
    if verdict["check"] == "determinism":
        return f"{t} of two identical calls, byte for byte; any difference fails."
    expected = ("the float64 reference computed in the script" if verdict["check"] == "accuracy"
                else "the relation's prediction computed in the script")
    if not worst:
        return (f"the largest |{t} - expected| over the tensor, expected being {expected}, "
                f"with attest's allowance {_num(verdict.get('allowed'))}.")
    return (f"|{t} - expected| at flat index {worst['flat']} (row-major, {t} in attest's "
            f"layout: [B, S, H, D], lse [B, H, Sq]), expected being {expected}, with attest's "
            f"allowance there, {verdict.get('allowed')!r}; it fails above it, or where one "
            f"side is not finite. The largest error over the tensor is printed too.")


def _shape(p):
    mask = []
    if p.get("causal"):
        mask.append(f"causal {p.get('causal_align', 'bottom_right')}")
    if list(p.get("window") or [-1, -1]) != [-1, -1]:
        mask.append(f"window {p['window']}")
    if p.get("alibi_slopes") is not None:
        mask.append("ALiBi")
    return (f"B{p['batch']} Hq{p['heads_q']} Hkv{p['heads_kv']} Sq{p['seqlen_q']} "
            f"Sk{p['seqlen_k']} D{p['head_dim']} Dv{p['head_dim_v']} {p['dtype']}" +
            ("".join(", " + m for m in mask)))


def main_export(folder, runner, dtype, device, fn_path=None):
    """The worker side of `attest repro --export` (torch_worker.py and attest.worker with
    --export FOLDER): exit status 0 with repro.py written, 3 with the reason on stdout where
    the finding has no standalone form."""
    try:
        v = export(folder, runner, dtype, device, fn_path)
    except NotExportable as e:
        print(f"not exportable: {e}")
        return 3
    print(f"repro.py: {v['check']}/{v['tensor']}")
    return 0
