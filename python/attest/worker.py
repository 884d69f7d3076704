"""A Python kernel in a child process: `python -m attest.worker MODULE:FUNCTION --api API
--dtype DTYPE --device DEVICE [--caps JSON]` serves attest's exec protocol (docs/protocol.md)
with the same adapters as the in-process API. attest.check(..., isolate=True) runs it as an
`exec:` kernel, and the repro line of a failure names it, so that `attest repro` reproduces a
finding of a Python kernel from a shell.
"""

import argparse
import importlib
import json
import sys

from . import _kernel


def _resolve(target):
    module, _, qualname = target.partition(":")
    if not module or not qualname:
        raise SystemExit(f"attest.worker: {target!r} is not MODULE:FUNCTION")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attest.worker",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("target", help="MODULE:FUNCTION")
    parser.add_argument("--api", default="sdpa", choices=_kernel.APIS)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--caps", default=None, help="JSON object merged into the claim")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument("--mask-form", default="bool", choices=["bool", "additive"])
    parser.add_argument("--path", action="append", default=[],
                        help="a folder to import MODULE from (put first on sys.path)")
    parser.add_argument("--backward", default=None, help="MODULE:FUNCTION of an explicit "
                        "backward(problem, q, k, v, o, lse, do) -> (dq, dk, dv)")
    parser.add_argument("--export", default=None, metavar="FOLDER",
                        help="write repro.py and REPORT.md into FOLDER, filled by `attest "
                        "repro --export`, and exit (0 written, 3 not exportable)")
    args = parser.parse_args(argv)

    import attest_worker as aw
    sys.path[:0] = args.path
    fn = _resolve(args.target)
    backward = _resolve(args.backward) if args.backward else None
    device = args.device or _kernel.default_device()
    caps = json.loads(args.caps) if args.caps else None
    runner = _kernel.make_runner(fn, args.api, args.dtype, device, caps, backward,
                                 args.deterministic, args.mask_form)
    import torch_backends as tb
    if args.export:
        import torch_export
        sys.exit(torch_export.main_export(args.export, runner, args.dtype, device,
                                          fn_path=args.target))

    def load(inputs, names):
        # The inputs in the problem's dtype; o and lse (a backward's) in their own.
        return [tb.to_torch(inputs[n], None if n in ("o", "lse") else args.dtype, device)
                if n in inputs else None for n in names]

    def forward(problem, inputs):
        o, lse = runner.forward(problem, *load(inputs, ("q", "k", "v")))
        return {"o": tb.to_tensor(o), **({"lse": tb.to_tensor(lse)} if lse is not None else {})}

    def backward_handler(problem, inputs):
        q, k, v, do, o, lse = load(inputs, ("q", "k", "v", "do", "o", "lse"))
        grads = runner.backward(problem, q, k, v, do, o=o, lse=lse)
        return {n: tb.to_tensor(g) for n, g in zip(("dq", "dk", "dv"), grads)}

    name = f"{_kernel.kernel_name(fn)}-{args.dtype}"
    aw.serve(lambda: (name, dict(runner.caps)), forward, backward_handler,
             route=lambda: getattr(runner.backend, "route", "") or "")


if __name__ == "__main__":
    main()
