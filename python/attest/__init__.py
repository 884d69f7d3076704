"""attest: numerical verification of attention kernels, from Python (docs/python.md).

    import attest, torch.nn.functional as F
    report = attest.check(F.scaled_dot_product_attention, api="sdpa", dtype="f32",
                          device="cpu", suite="gate")
    assert report.passed, report.summary()

`check` runs a suite in this process on a Python function in one of the calling conventions
(`api`: "sdpa", "flash_attn" for FlashAttention-2/3/4's flash_attn_func, "attest" for a
function of the problem and tensors) or on any kernel spec the command line takes
("cpu/flash2-bf16", "plugin:...", "exec:..."); the verdicts are those of `attest check` on the
same kernel and seed (the same C++ runner, python/src/core.cc). `isolate=True` runs the function
in a child process (the exec protocol), so that a crash is a finding, not a dead interpreter.
`fuzz`, `repro`, `oracle`, `compare` and `cli` run the command line in-process, with Python
kernels available to it; `python -m attest` is the command line itself.
"""

import os
import tempfile
import warnings


def _point_at_cuda_oracle():
    """A wheel built where nvcc was (docs/python.md "The CUDA oracle in the wheel") carries the
    CUDA oracle beside this file: the loader (reference/oracle/cuda/oracle_cuda_host.h) is
    pointed at it through ATTEST_ORACLE_CUDA, unless that names a library already. The
    `attest` command of the wheel imports this package, so it finds the same copy."""
    lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libattest_oracle_cuda.so")
    if not os.environ.get("ATTEST_ORACLE_CUDA") and os.path.isfile(lib):
        os.environ["ATTEST_ORACLE_CUDA"] = lib


_point_at_cuda_oracle()

from . import _core  # noqa: E402  (after the environment the loader reads)
from . import _kernel
from .report import Report, Verdict

__version__ = _core.version
Unsupported = _kernel.Unsupported
APIS = _kernel.APIS

__all__ = ["check", "fuzz", "repro", "oracle", "compare", "cli", "kernel", "suite_rows",
           "pytest_suite", "Report", "Verdict", "Unsupported", "APIS", "Kernel", "SuiteTests"]


class Kernel:
    """A kernel attest can run: a spec the command line takes, or a Python function in a
    calling convention (registered in this process as `py:N`, or, with isolate=True, run by a
    child process as `exec:python -m attest.worker ...`). `spec` names it to attest; `display`
    is how reports and repro lines name it (the exec: spec where the function is importable
    by name, so that the repro line runs from a shell)."""

    def __init__(self, fn, api="sdpa", dtype="bf16", device=None, caps=None, backward=None,
                 name=None, isolate=False, deterministic=False, mask_form="bool"):
        self.fn = fn
        if isinstance(fn, str):
            self.spec = self.display = fn
            self.bridge = None
            self.capabilities_json = None
            return
        device = device or _kernel.default_device()
        exec_spec = _kernel.worker_spec(fn, api, dtype, device, caps, deterministic, mask_form)
        if isolate:
            if backward is not None:
                raise ValueError("isolate=True with an explicit backward: give the worker "
                                 "`python -m attest.worker --backward MODULE:FUNCTION`")
            if exec_spec is None:
                raise ValueError(f"isolate=True needs a function importable by name "
                                 f"(module:qualname); {_kernel.kernel_name(fn)} is not")
            self.bridge = None
            self.spec = self.display = exec_spec
            self.capabilities_json = None
            return
        self.bridge = _kernel.make_kernel(fn, api, dtype, device, caps, backward, name,
                                          deterministic, mask_form)
        self.spec = self.bridge.spec
        self.capabilities_json = self.bridge.capabilities_json
        self.display = exec_spec if exec_spec and backward is None else (
            f"python:{_kernel.kernel_name(fn)}")

    def capabilities(self):
        """The claim as JSON text (docs/protocol.md `capabilities`)."""
        if self.capabilities_json is None:
            self.capabilities_json = _core.kernel_capabilities(self.spec)
        return self.capabilities_json


def kernel(fn, **kw):
    """A Kernel (see Kernel); `fn` may be a Kernel already."""
    return fn if isinstance(fn, Kernel) else Kernel(fn, **kw)


def check(fn, api="sdpa", suite="gate", dtype="bf16", device=None, seed=0, caps=None,
          backward=None, only_check=None, failure_dir=None, isolate=False, threads=0,
          time_budget=None, max_skipped=0.8, allow_skips=False, name=None,
          deterministic=False, mask_form="bool", verbose=False, oracle_device="auto"):
    """Runs `suite` ("quick", "gate", "full", "long") against `fn` and returns a Report.

    fn        a callable in calling convention `api`, a kernel spec string, or a Kernel
    api       "sdpa": fn(q, k, v, attn_mask=None, is_causal=False, scale=None
                          [, enable_gqa=False]) on [B, H, S, D], returns o;
              "flash_attn": a flash_attn_func of FlashAttention-2/3 or -4 (told apart by its
                          signature; its *_varlen_func sibling, or fn.varlen, for packed
                          batches);
              "attest":   fn(problem, q, k, v) -> o or (o, lse) in attest's layout
                          ([B, S, H, D]; lse [B, Hq, Sq]); caps= required
    dtype     the inputs' dtype: "bf16", "f16" or "f32"
    device    where the function runs ("cpu", "cuda"; default cuda when available)
    caps      a dict merged into the convention's claim (docs/protocol.md `capabilities`)
    backward  fn(problem, q, k, v, o, lse, do) -> (dq, dk, dv) instead of autograd
    failure_dir  where failing cases are saved (default: a new temporary folder)
    isolate   run fn in a child process (python -m attest.worker)
    oracle_device  where the float64 oracle runs: "auto" (the GPU for a function on CUDA when
              the CUDA oracle finds one; else the CPU, with a warning saying why), "cpu", "cuda"
    The other arguments are `attest check`'s options. A bad argument raises ValueError;
    whatever the kernel does is a verdict.
    """
    k = kernel(fn, api=api, dtype=dtype, device=device, caps=caps, backward=backward,
               name=name, isolate=isolate, deterministic=deterministic, mask_form=mask_form)
    if failure_dir is None:
        failure_dir = tempfile.mkdtemp(prefix="attest-failures-")
    run = _core.check(k.spec, k.display, suite, int(seed), only_check or "",
                      os.fspath(failure_dir), int(threads),
                      None if time_budget is None else float(time_budget), float(max_skipped),
                      bool(allow_skips), bool(verbose), str(oracle_device))
    if run.exit_code == 2:
        raise ValueError(f"attest check: {run.error}")
    if run.note:
        warnings.warn(f"attest check: {run.note}", RuntimeWarning, stacklevel=2)
    return Report(run, k.display, k)


def suite_rows(fn, suite="gate", seed=0, **kw):
    """The rows `suite` runs for the kernel: [{"check", "label", "skipped"}] (an empty
    "skipped" when the row applies)."""
    k = kernel(fn, **kw)
    return _core.suite_rows(suite, k.capabilities(), int(seed))


def cli(*args):
    """Runs the attest command line in this process with these arguments (strings); returns
    its exit code. A Kernel among them stands for its spec."""
    words = [a.spec if isinstance(a, Kernel) else os.fspath(a) if hasattr(a, "__fspath__")
             else str(a) for a in args]
    return _core.cli(words)


def _options(**kw):
    words = []
    for key, value in kw.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                words += [flag, str(v)]
        else:
            words += [flag, os.fspath(value) if hasattr(value, "__fspath__") else str(value)]
    return words


def fuzz(fn, seed=0, cases=None, time=None, out=None, check=None, baseline=None,
         max_failures=None, max_seqlen=None, no_shrink=False, quiet=False, **kernel_kw):
    """`attest fuzz` on a kernel (fn as for check; kernel_kw: api, dtype, device, caps, ...).
    Returns the exit code; failing cases and fuzz-report.json go to `out`."""
    k = kernel(fn, **kernel_kw)
    b = kernel(baseline, **kernel_kw) if baseline is not None else None
    return cli("fuzz", "--kernel", k.spec,
               *_options(seed=seed, cases=cases, time=time, out=out, check=check,
                         baseline=b.spec if b else None, max_failures=max_failures,
                         max_seqlen=max_seqlen, no_shrink=no_shrink, quiet=quiet))


def repro(fn, case, check=None, dump=None, export=None, **kernel_kw):
    """`attest repro`: runs the checks of one saved case file on the kernel; the exit code.
    With `export` (a new or empty folder), `attest repro --export`: the first failing verdict
    as a folder to send upstream, with repro.py for a Python function (docs/python.md
    "Exporting a finding"); then the exit code is 1 with a folder written, 0 without."""
    k = kernel(fn, **kernel_kw)
    if export is not None:
        from . import export as _export
        return 1 if _export.export_case(k, case, export, check=check) else 0
    return cli("repro", "--kernel", k.spec, *_options(case=case, check=check, dump=dump))


def oracle(case, out, precision=None, threads=None, quiet=True):
    """`attest oracle`: the certified reference outputs of a case file into a safetensors file
    (o, lse, dq, dk, dv, delta as F64); the exit code."""
    return cli("oracle", *_options(case=case, out=out, precision=precision, threads=threads,
                                   quiet=quiet))


def compare(case, outputs, profile=None, output_format=None, lse_pos_inf=False, no_lse=False,
            json=None, junit=None, markdown=None, threads=None):
    """`attest compare`: judges outputs a kernel wrote for a case file's inputs; the exit
    code (reports to the given paths)."""
    return cli("compare", *_options(case=case, outputs=outputs, profile=profile,
                                    output_format=output_format, lse_pos_inf=lse_pos_inf,
                                    no_lse=no_lse, json=json, junit=junit, markdown=markdown,
                                    threads=threads))


class SuiteTests:
    """A suite as pytest test items (attest.pytest_plugin): assigned to a `test_*` name in a
    test module, it is collected as one item per suite row — (check, case) — with the case
    label in the item id; the rows run when their items run, and each item passes, fails with
    its failing verdicts (observed, allowed, worst location, repro line) or is skipped with the
    reason the row does not apply."""

    def __init__(self, fn, suite="gate", seed=0, only_check=None, failure_dir=None,
                 threads=0, time_budget=None, max_skipped=0.8, allow_skips=False,
                 **kernel_kw):
        self.kernel = kernel(fn, **kernel_kw)
        self.suite = suite
        self.seed = seed
        self.options = dict(only_check=only_check, failure_dir=failure_dir, threads=threads,
                            time_budget=time_budget, max_skipped=max_skipped,
                            allow_skips=allow_skips)

    def rows(self):
        return _core.suite_rows(self.suite, self.kernel.capabilities(), int(self.seed))

    def run(self, only_check=None):
        opts = dict(self.options)
        if only_check:
            opts["only_check"] = only_check
        return check(self.kernel, suite=self.suite, seed=self.seed, **opts)


def pytest_suite(fn, suite="gate", **kw):
    """`test_my_kernel = attest.pytest_suite(my_attention, api="sdpa", dtype="bf16")`: the
    suite's rows as pytest items (see SuiteTests; kw as for check)."""
    return SuiteTests(fn, suite=suite, **kw)
