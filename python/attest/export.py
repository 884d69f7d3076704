"""A finding as a folder a maintainer runs without attest (docs/python.md "Exporting a
finding"): `attest repro --export` on the verdict's saved case, and, for a Python function
running in this process, repro.py rendered here from the call its adapter makes
(tools/workers/torch_export.py; an `exec:` worker renders its own). The folder is assembled
beside its destination and renamed into place: never half a folder.
"""

import os
import shutil
import tempfile

from . import _core
from . import _kernel  # noqa: F401  (puts the worker modules on sys.path)


def export_case(k, case, folder, check=None, tensor=None):
    """Exports the first failing verdict (on `tensor` where given) of `check` on case file
    `case` for Kernel `k` into `folder` (new, or an empty folder). Returns `folder`, or None
    when no verdict fails. A bad argument raises ValueError."""
    folder = os.path.abspath(os.fspath(folder))
    case = os.fspath(case)
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise ValueError(f"export folder {folder}: exists and is not an empty folder")
    parent = os.path.dirname(folder)
    if not os.path.isdir(parent):
        raise ValueError(f"export folder {folder}: the folder {parent} does not exist")
    work = tempfile.mkdtemp(prefix="." + os.path.basename(folder) + ".", dir=parent)
    stage = os.path.join(work, "export")
    try:
        words = ["repro", "--kernel", k.spec, "--case", case, "--export", stage,
                 "--export-name", k.display]
        if check:
            words += ["--check", check]
        if tensor:
            words += ["--export-tensor", tensor]
        rc = _core.cli(words)
        if rc == 2:
            raise ValueError(f"attest repro --export: usage error on {case} (see stderr)")
        if not os.path.isdir(stage):
            return None  # no failing verdict
        if k.bridge is not None:
            _render_in_process(k, stage, check, tensor)
        if os.path.isdir(folder):
            os.rmdir(folder)  # empty, checked above
        os.rename(stage, folder)
        if k.bridge is not None:
            print(f"attest: exported to {folder}")
        return folder
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _render_in_process(k, stage, check, tensor):
    """repro.py for a function running in this process, with the adapter the run used; where
    the finding has no standalone form, REPORT.md says why."""
    import torch_export
    bridge = k.bridge
    fn_path = _kernel.importable_name(k.fn) if callable(k.fn) else None
    try:
        torch_export.export(stage, bridge.runner, bridge.dtype, str(bridge.device), fn_path,
                            check, tensor)
    except torch_export.NotExportable as e:
        report = os.path.join(stage, "REPORT.md")
        with open(report) as f:
            text = f.read()
        marker = "No standalone script: "
        start = text.find(marker)
        if start >= 0:
            end = text.find("\n", start)
            text = text[:start] + f"{marker}{e}." + text[end:]
        with open(report, "w") as f:
            f.write(text)
