"""Python callables as attest kernels (docs/python.md "Calling conventions").

`make_kernel(fn, api=..., ...)` wraps a function in one of the calling conventions of
tools/workers/torch_backends.py, the same adapters the exec worker runs (an adapter translates
layouts and declares capabilities; it never does the kernel's work), and registers it with the
C++ kernel registry under `py:<id>`. The C++ side (python/src/core.cc PyKernel) calls the
Bridge with DLPack views of attest's tensors; the Bridge hands them to the adapter as torch
tensors on the chosen device and returns the kernel's outputs as it wrote them.
"""

import itertools
import json
import os
import sys
import traceback
import types
import weakref

_WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_workers")
if _WORKERS not in sys.path:
    sys.path.insert(0, _WORKERS)

import attest_worker as aw  # noqa: E402  (python/CMakeLists.txt puts it in _workers/)

from . import _core  # noqa: E402

Unsupported = aw.Unsupported

APIS = ("sdpa", "flash_attn", "attest")
_DTYPES = ("bf16", "f16", "f32")

_ids = itertools.count(1)
_live = weakref.WeakValueDictionary()


def _lookup(key):
    return _live.get(key)


_core.set_lookup(_lookup)


def _error_text(e):
    """An exception as the exec protocol reports a worker's: its type and message, then the
    traceback's lines (verify/checks/check.cc KernelError shows the last one in the verdict
    and keeps the whole as its detail)."""
    lines = [ln for ln in traceback.format_exception(e) for ln in ln.rstrip("\n").split("\n")]
    return f"kernel reported an error: {type(e).__name__}: {e}; stderr: " + " | ".join(
        ln for ln in lines if ln.strip())


class Bridge:
    """What python/src/core.cc PyKernel calls: forward/backward with the problem as JSON text
    and DLPack views of attest's tensors; replies ("ok", outputs...), ("unsupported", why) or
    ("error", text). Only `Exception`s become replies: KeyboardInterrupt stops the run."""

    def __init__(self, runner, name, dtype, device):
        import torch
        self.torch = torch
        self.runner = runner
        self.name = name
        self.dtype = dtype
        self.device = torch.device(device)
        self.capabilities_json = json.dumps(runner.caps)
        self.key = str(next(_ids))
        self.spec = "py:" + self.key
        _live[self.key] = self

    def _in(self, x):
        """attest's tensor on the kernel's device, with the strides attest gave it (a view of
        the layouts check, python/src/core.cc ToPython). A copy: a kernel that writes its inputs
        cannot change the harness's (torch.from_dlpack itself shares the memory)."""
        if x is None:
            return None
        t = self.torch.from_dlpack(x)
        if t.is_contiguous() or t.numel() == 0:
            return t.to(self.device, copy=True)
        # Tensor.to keeps the strides of dense tensors only: copy the storage it views, then
        # view the copy the same way.
        flat = self.torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
        return self.torch.as_strided(flat.to(self.device, copy=True), t.shape, t.stride(),
                                     t.storage_offset())

    def _out(self, t, what):
        if t is None:
            return None
        if not isinstance(t, self.torch.Tensor):
            raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
        return t.detach().to("cpu")

    def forward(self, problem_json, q, k, v):
        try:
            p = json.loads(problem_json)
            o, lse = self.runner.forward(p, *(self._in(x) for x in (q, k, v)))
            return ("ok", self._out(o, "o"), self._out(lse, "lse"))
        except Unsupported as e:
            return ("unsupported", str(e))
        except Exception as e:  # noqa: BLE001 - every failure of the kernel is reported
            return ("error", _error_text(e))

    def backward(self, problem_json, q, k, v, o, lse, do):
        try:
            p = json.loads(problem_json)
            args = [self._in(x) for x in (q, k, v, do, o, lse)]
            dq, dk, dv = self.runner.backward(p, *args[:4], o=args[4], lse=args[5])
            return ("ok", self._out(dq, "dq"), self._out(dk, "dk"), self._out(dv, "dv"))
        except Unsupported as e:
            return ("unsupported", str(e))
        except Exception as e:  # noqa: BLE001
            return ("error", _error_text(e))

    def route(self):
        return getattr(self.runner.backend, "route", "") or ""


def default_device():
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def make_runner(fn, api, dtype, device, caps=None, backward=None, deterministic=False,
                mask_form="bool"):
    """A torch_backends.Runner for `fn` in calling convention `api`."""
    import torch_backends as tb
    if api not in APIS:
        raise ValueError(f"api={api!r}: not one of {', '.join(APIS)}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r}: not one of {', '.join(_DTYPES)}")
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    args = types.SimpleNamespace(device=device, dtype=dtype, mask_form=mask_form,
                                 deterministic=deterministic, flex_dynamic="auto", caps=None)
    if api == "sdpa":
        backend = tb.SdpaCallable(args, fn)
    elif api == "flash_attn":
        backend = tb.FlashAttn(args, None, None, fn=fn, varlen_fn=getattr(fn, "varlen", None))
    else:
        if caps is None:
            raise ValueError('api="attest" needs caps= (what the function supports)')
        backend = tb.AttestCallable(args, fn, {})
    return tb.Runner(backend, caps, backward)


def kernel_name(fn):
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def make_kernel(fn, api="sdpa", dtype="bf16", device=None, caps=None, backward=None,
                name=None, deterministic=False, mask_form="bool"):
    """A registered Bridge for `fn`: its `spec` ("py:N") names it to every attest command in
    this process while the Bridge is alive."""
    device = device or default_device()
    runner = make_runner(fn, api, dtype, device, caps, backward, deterministic, mask_form)
    return Bridge(runner, name or f"{kernel_name(fn)}-{dtype}", dtype, device)


def importable_name(fn):
    """"module:qualname" when `fn` can be imported again by that name (a child process can
    then run it: isolate=True, and the repro line), else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    import importlib
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001
        return None
    target = getattr(fn, "__wrapped__", fn)
    return f"{module}:{qualname}" if obj is fn or obj is target else None


def worker_spec(fn, api, dtype, device, caps=None, deterministic=False, mask_form="bool"):
    """The exec: spec of a child process running `fn` (python -m attest.worker), or None when
    `fn` is not importable by name."""
    target = importable_name(fn)
    if target is None:
        return None
    words = [sys.executable, "-m", "attest.worker", target, "--api", api, "--dtype", dtype,
             "--device", device]
    root = _import_root(fn)
    if root is not None:
        words += ["--path", root]
    if caps:
        words += ["--caps", json.dumps(caps, separators=(",", ":"))]
    if deterministic:
        words.append("--deterministic")
    if mask_form != "bool":
        words += ["--mask-form", mask_form]
    return "exec:" + " ".join(_quote(w) for w in words)


def _import_root(fn):
    """The folder `fn`'s top-level module or package is imported from (what the child's
    sys.path needs), or None for a module without a file."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not path:
        return None
    root = os.path.dirname(os.path.abspath(path))
    for _ in range(fn.__module__.count(".")):
        root = os.path.dirname(root)
    return root


def _quote(word):
    import shlex
    return shlex.quote(word)

