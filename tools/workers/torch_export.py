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
import shutil

import numpy as np
import torch

import attest_worker as aw
import torch_call as tc
from torch_backends_common import to_torch

# Inputs up to this many elements in all are written into repro.py; larger ones go to
# inputs.safetensors beside it.
INLINE_ELEMENTS = 4096

# The checks whose rule the script can state as a comparison it makes itself.
EXPORTABLE = ("accuracy", "gqa-mha", "determinism")


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
    if verdict["tensor"] not in ("o", "lse", "dq", "dk", "dv"):
        return f"the verdict judges {verdict['tensor']!r}, not an output tensor"
    if verdict["tensor"] == "lse":
        return "lse verdicts are not rendered (the script compares what the call returns first)"
    if problem.get("cu_seqlens_q") is not None:
        return "packed (varlen) batches are not rendered"
    if problem.get("softcap"):
        return "softcap is not rendered"
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
    if not why and runner.explicit_backward is not None and \
            verdict["tensor"] in ("dq", "dk", "dv"):
        why = ("the gradients come from an explicit backward function, not from autograd "
               "through the call the script renders")
    if why:
        raise NotExportable(why)
    files = aw.read_safetensors(os.path.join(folder, "inputs.safetensors"))
    inputs = {n: to_torch(files[n], dtype, "cpu") for n in ("q", "k", "v", "do") if n in files}
    calls = [("kernel_call", backend.describe_call(problem, inputs["q"].dtype))]
    if verdict["check"] == "gqa-mha":
        mha = backend.describe_call(dict(problem, heads_kv=problem["heads_q"]),
                                    inputs["q"].dtype)
        for d in mha.data():
            d.name = "mha_" + d.name
        calls.append(("kernel_call_mha", mha))
    for _, call in calls:
        try:
            call.source("f", set())
        except TypeError as e:
            raise NotExportable(f"the call has an argument with no source form ({e})")
    target = calls[0][1].target
    default_fn = fn_path or f"{target.module}:{target.name}"
    if target.module == "__main__" or "<" in target.name:
        default_fn = None  # not importable by name: the script asks for --fn
    context = calls[0][1].context
    meta["kernel_label"] = (f"{target.path}" +
                            (f" under {tc.render(context, set())}" if context else "") +
                            f" ({dtype}, {device})")
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
                torch.bool: "torch.bool"}


def _codes(t):
    """A tensor as a safetensors entry of attest_worker (bool as U8)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bool:
        return aw.Tensor(t.to(torch.uint8).numpy(), "U8")
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
    return verdict.get("message", "")


def _script(problem, verdict, meta, inputs, calls, default_fn, device, path_root, folder):
    imports = {"torch"}
    call_lines = []
    data = []
    for name, call in calls:
        call_lines += call.source(name, imports) + ["", ""]
        data += call.data()
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
    header = f"""#!/usr/bin/env python3
\"\"\"{meta.get('kernel_label') or meta['kernel']}: {verdict['check']} fails on {tensor} \
({meta.get('case_label') or 'attest case'}).

Rule: {rule_in_words(verdict, problem)}.
attest {meta['attest_version']} saw {tensor} = {_num(worst and worst.get('observed'))} where \
{'the reference is' if verdict['check'] == 'accuracy' else 'the relation predicts'} \
{_num(worst and worst.get('reference'))} at {_where(worst)}: |error| \
{_num(verdict.get('observed'))}, allowed {_num(verdict.get('allowed'))}.

Written by `attest repro --export`; needs PyTorch and the kernel's own module only{'' if inline else ' (and safetensors, for inputs.safetensors beside it)'}.
    python3 repro.py                        exit 1 while the finding reproduces, 0 once not
    python3 repro.py --fn MODULE:FUNCTION   the same call on another function with the same
                                            signature (or ATTEST_REPRO_FN=MODULE:FUNCTION)
\"\"\"
"""
    body = [header, "import argparse", "import importlib", "import os", "import platform",
            "import sys", ""]
    body += [f"import {m}" for m in sorted(imports)]
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
             "", ""]
    body += _HELPERS.splitlines() + ["", ""]
    body += load + ["", ""]
    body += ["# The call attest made: rendered from the call description its adapter "
             "executes", "# (tools/workers/torch_backends.py describe_call).", ""]
    body += call_lines
    body += _REFERENCE.splitlines() + ["", ""]
    data_names = [d.name for d in calls[0][1].data()]
    mha_names = [d.name for d in calls[1][1].data()] if len(calls) > 1 else []
    body += _main(verdict, data_names, mha_names).splitlines()
    out["text"] = "\n".join(body).rstrip() + "\n"
    out["call_source"] = "\n".join(call_lines).rstrip() + "\n"
    return out


def _num(x):
    return "-" if x is None else f"{x:.9g}"


def _pyjson(obj):
    """A JSON object as Python source, one key a line."""
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in sorted(obj.items())) + "}"


_HELPERS = '''def _values(values, shape, dtype):
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


def _mask(bits, shape):
    return torch.tensor([c == "1" for c in bits], dtype=torch.bool).reshape(shape)


def resolve(name, path):
    """MODULE:FUNCTION, imported with `path` first on sys.path."""
    module, _, qualname = name.partition(":")
    sys.path[:0] = [p for p in path if p not in sys.path]
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def print_environment():
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    print(f"python {platform.python_version()}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, cuDNN {cudnn}, GPU {gpu}, {platform.platform()}")'''

_REFERENCE = '''def visible(device):
    """Boolean [B, Sq, Sk]: may query i see key j, under the case's mask rules (attest's
    docs/semantics.md; reference/problem/mask.h): the causal and window band around the
    diagonal i + off (off = Sk - Sq aligned bottom-right, 0 top-left), a prefix every query
    sees, then documents and blocks."""
    p = PROBLEM
    b, sq, sk = p["batch"], p["seqlen_q"], p["seqlen_k"]
    off = sk - sq if p.get("causal_align", "bottom_right") == "bottom_right" else 0
    left, right = p.get("window") or [-1, -1]
    if p.get("causal"):
        right = 0 if right < 0 else min(right, 0)
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    band = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        band &= j >= i + off - left
    if right >= 0:
        band &= j <= i + off + right
    vis = (band | (j < (p.get("prefix_lm") or 0)))[None].repeat(b, 1, 1)
    if p.get("document_ids_q") is not None:
        dq = torch.tensor(p["document_ids_q"], device=device)[:, :, None]
        dk = torch.tensor(p["document_ids_k"], device=device)[:, None, :]
        vis &= dq == dk
    sparse = p.get("block_sparse")
    if sparse is not None:
        allowed = torch.zeros(sq // sparse["block_q"] + 2, sk // sparse["block_k"] + 2,
                              dtype=torch.bool, device=device)
        for qb, kb in sparse["blocks"]:
            if qb < allowed.shape[0] and kb < allowed.shape[1]:
                allowed[qb, kb] = True
        vis &= allowed[i // sparse["block_q"], j // sparse["block_k"]][None]
    return vis


def reference(q, k, v, do):
    """float64 attention in attest's layout (q [B, Sq, Hq, D], k, v [B, Sk, Hkv, D]): o, lse
    and, with do, the gradients by autograd. Query head h reads kv head h // (Hq / Hkv);
    ALiBi adds -slope_h * |i + off - j| to the scaled scores; a row that sees no key gives
    o = 0, lse = -inf."""
    p = PROBLEM
    q, k, v = (x.detach().double().requires_grad_(do is not None) for x in (q, k, v))
    r = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(r, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(r, dim=1)
    scale = p["scale"] if p.get("scale") is not None else q.shape[-1] ** -0.5
    s = (qh @ kh.transpose(-1, -2)) * scale
    sq, sk = s.shape[-2:]
    if p.get("alibi_slopes") is not None:
        off = sk - sq if p.get("causal_align", "bottom_right") == "bottom_right" else 0
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        slopes = torch.tensor(p["alibi_slopes"], dtype=torch.float64, device=q.device)
        s = s - slopes[:, None, None] * (i + off - j).abs().double()
    s = s.masked_fill(~visible(q.device)[:, None], float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(-1, keepdim=True)
    prob = e / torch.where(total > 0, total, torch.ones_like(total))
    o = (prob @ vh).transpose(1, 2)
    out = {"o": o.detach(), "lse": (m + torch.log(total)).squeeze(-1).detach()}
    if do is not None:
        out["dq"], out["dk"], out["dv"] = torch.autograd.grad(o, (q, k, v), do.double())
    return out


def run_kernel(call, fn, q, k, v, do, data, grads):
    """The kernel's outputs: o (under no_grad, as attest's forward ran), or with `grads` the
    gradients by autograd through the same call with dO = do, as attest's backward ran."""
    if not grads:
        with torch.no_grad():
            return {"o": call(fn, q, k, v, **data)}
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = call(fn, q, k, v, **data)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), grad_outputs=do)
    return {"o": o.detach(), "dq": dq, "dk": dk, "dv": dv}


def compare(got, expected, allowed):
    """|got - expected| at the element attest reported (VERDICT["worst"]["flat"], the
    row-major index into the tensor in attest's layout), against attest's allowance there;
    the whole tensor's largest |error| is printed for information. True: the finding holds."""
    if tuple(got.shape) != tuple(expected.shape):
        print(f"{TENSOR}: shape {list(got.shape)} where {list(expected.shape)} is expected")
        return True
    g = got.detach().double().cpu().contiguous().reshape(-1)
    e = expected.detach().double().cpu().contiguous().reshape(-1)
    both = torch.isfinite(g) & torch.isfinite(e)
    diff = torch.where(both, (g - e).abs(), torch.zeros_like(g))
    bad = (~both & ~((g == e) | (g.isnan() & e.isnan()))).sum().item()
    at = int(diff.argmax())
    print(f"whole tensor: largest |error| {diff.max().item():.6g} at flat index {at}; "
          f"{bad} element(s) non-finite on one side only")
    worst = VERDICT["worst"]
    if worst is None:
        print(f"attest reported no location; the script compares the largest |error| with "
              f"{allowed:.6g}")
        return bad > 0 or diff.max().item() > allowed
    flat = worst["flat"]
    a, b = g[flat].item(), e[flat].item()
    same = a == b or (a != a and b != b)
    err = abs(a - b) if (both[flat] or same) else float("inf")
    print(f"{TENSOR} at {VERDICT['where']} (flat index {flat}): kernel {a!r}, expected {b!r}, "
          f"|error| {err:.6g}, allowed {allowed:.6g} ({VERDICT['policy']})")
    return not err <= allowed'''


def _main(verdict, data_names, mha_names):
    data = "{" + ", ".join(f"{n!r}: t[{n!r}]" for n in data_names) + "}"
    mha = "{" + ", ".join(f"{n[4:]!r}: t[{n!r}]" for n in mha_names) + "}"
    grads = verdict["tensor"] in ("dq", "dk", "dv")
    check = verdict["check"]
    lines = ['def main():',
             '    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])',
             '    ap.add_argument("--fn", default=os.environ.get("ATTEST_REPRO_FN") or '
             'DEFAULT_FN,',
             '                    help="MODULE:FUNCTION called in the kernel\'s place '
             '(default: %(default)s)")',
             '    ap.add_argument("--path", action="append", default=[],',
             '                    help="a folder to import MODULE from")',
             '    ap.add_argument("--device", default=DEVICE)',
             '    args = ap.parse_args()',
             '    if args.fn is None:',
             '        ap.error(f"the kernel ({KERNEL}) is not importable by name: pass --fn '
             'MODULE:FUNCTION")',
             '    print_environment()',
             '    fn = resolve(args.fn, args.path + (FN_PATH if args.fn == DEFAULT_FN else []))',
             '    print(f"function: {args.fn}")',
             '    t = load_inputs(args.device)',
             '    q, k, v, do = t["q"], t["k"], t["v"], t.get("do")',
             '    print(f"rule: {RULE}")',
             '    print(f"attest: {VERDICT[\'message\']}")',
             f'    got = run_kernel(kernel_call, fn, q, k, v, do, {data}, {grads})[TENSOR]']
    if check == "accuracy":
        lines += ['    expected = reference(q, k, v, do)[TENSOR]',
                  '    failed = compare(got, expected, VERDICT["allowed"])']
    elif check == "gqa-mha":
        lines += [
            '    # MHA: the same call with k and v repeated per group (query head h reads kv '
            'head',
            '    # h // r), then for dk and dv the sum over each group\'s query heads in '
            'float64.',
            '    r = q.shape[2] // k.shape[2]',
            '    k2, v2 = (x.repeat_interleave(r, dim=2) for x in (k, v))',
            f'    other = run_kernel(kernel_call_mha, fn, q, k2, v2, do, {mha}, {grads})'
            '[TENSOR]',
            '    if TENSOR in ("dk", "dv"):',
            '        b, s, h, d = other.shape',
            '        other = other.double().reshape(b, s, h // r, r, d).sum(3)',
            '    ref = reference(q, k, v, do)[TENSOR]',
            '    if VERDICT["worst"] is not None:',
            '        print(f"float64 reference there: '
            '{ref.contiguous().reshape(-1)[VERDICT[\'worst\'][\'flat\']].item()!r}")',
            '    failed = compare(got, other, VERDICT["allowed"])']
    else:  # determinism
        lines += [f'    again = run_kernel(kernel_call, fn, q, k, v, do, {data}, {grads})'
                  '[TENSOR]',
                  '    differ = (got.contiguous().view(-1).view(torch.uint8) != '
                  'again.contiguous().view(-1).view(torch.uint8)).sum().item()',
                  '    print(f"{TENSOR}: {differ} byte(s) differ between two identical calls")',
                  '    failed = differ > 0']
    lines += ['    print("FINDING REPRODUCES" if failed else "finding does not reproduce")',
              '    return 1 if failed else 0',
              '', '',
              'if __name__ == "__main__":',
              '    sys.exit(main())']
    return "\n".join(lines)


def _report(problem, verdict, meta, script, calls, has_data):
    worst = verdict.get("worst") or {}
    env = meta.get("environment") or environment()
    env_lines = "\n".join(f"- {k}: {v}" for k, v in env.items())
    text = script["text"]
    embed = text if len(text) <= 60000 else None
    rel = "the relation's prediction" if verdict["check"] != "accuracy" else \
        "the float64 reference"
    lines = [
        f"# {meta.get('kernel_label') or meta['kernel']}: {verdict['check']} fails on "
        f"{verdict['tensor']}",
        "",
        f"**Case.** {meta.get('case_label') or ''} (`case.json`: "
        f"{_shape(problem)}).",
        "",
        f"**Rule.** {rule_in_words(verdict, problem)}.",
        "",
        f"**Expected vs actual.** At {_where(worst or None)} of {verdict['tensor']}: the kernel "
        f"returned {_num(worst.get('observed'))}, {rel} is {_num(worst.get('reference'))}; "
        f"|error| {_num(verdict.get('observed'))} where attest allows "
        f"{_num(verdict.get('allowed'))} ({verdict.get('policy')}).",
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
