"""The result of attest.check (docs/python.md "Reports"): the verdicts of the JSON report
(docs/report.schema.json) as objects, and the report's JSON, JUnit, Markdown and console
forms exactly as `attest check` writes them (the same C++ writers, verify/report/report.h).
"""

import json
import math


class Verdict:
    """One verdict: a check's judgment of one tensor on one case. `margin` is observed /
    allowed (<= 1 passes; inf for a categorical failure); `worst` the worst element
    ({b, h, i, d, seq_axis, flat, observed, reference}); `repro` the command line reproducing
    a failure; `case_label` and `case_file` the case judged and where it was saved."""

    __slots__ = ("check", "tensor", "policy", "passed", "observed", "allowed", "margin",
                 "worst", "message", "detail", "repro", "case_label", "case_file", "problem",
                 "_kernel")

    def __init__(self, d, kernel=None):
        self._kernel = kernel
        self.check = d["check"]
        self.tensor = d["tensor"]
        self.policy = d["policy"]
        self.passed = d["pass"]
        self.observed = d["observed"]
        self.allowed = d["allowed"]
        self.margin = math.inf if d["margin"] is None else d["margin"]
        self.worst = d["worst"]
        self.message = d["message"]
        self.detail = d["detail"]
        self.repro = d["repro"]
        case = d.get("case") or {}
        self.case_label = case.get("label", "")
        self.case_file = case.get("file")
        self.problem = case.get("problem")

    def describe(self):
        """Several lines: the verdict, observed/allowed at the worst location, the repro."""
        w = self.worst or {}
        # "i" holds the sequence index: a query's (i) or a key's (j), as seq_axis says.
        names = {"i": w.get("seq_axis") or "i"}
        where = ", ".join(f"{names.get(k, k)}={w[k]}" for k in ("b", "h", "i", "d")
                          if w.get(k) is not None)
        head = (f"{'PASS' if self.passed else 'FAIL'} {self.check}"
                f"{'/' + self.tensor if self.tensor else ''} margin {self.margin:.3g}")
        lines = [head, f"  case: {self.case_label}" if self.case_label else None,
                 f"  {self.message}",
                 (f"  observed {self.observed:.6g}, allowed {self.allowed:.6g}"
                  f"{' at ' + where if where else ''}"
                  if self.observed is not None and self.allowed is not None else None),
                 f"  policy: {self.policy}" if self.policy else None,
                 f"  repro: {self.repro}" if self.repro else None]
        return "\n".join(x for x in lines if x)

    def export(self, folder):
        """This failing verdict as a folder to send upstream (docs/python.md "Exporting a
        finding"): its case, inputs and float64 oracle, REPORT.md, and for a Python function
        repro.py, a script that needs PyTorch alone and exits 1 while the finding
        reproduces. `folder` must be new or empty; returns it."""
        from . import export as _export
        if self.passed:
            raise ValueError("export: this verdict passed; only a failing one is exported")
        if not self.case_file:
            raise ValueError("export: the verdict's case was not saved (no case file)")
        if self._kernel is None:
            raise ValueError("export: the verdict does not know its kernel (a Report "
                             "made by attest.check knows it)")
        out = _export.export_case(self._kernel, self.case_file, folder, check=self.check,
                                  tensor=self.tensor or None)
        if out is None:
            raise ValueError(f"export: {self.check}/{self.tensor} does not fail on a re-run "
                             f"of {self.case_file}")
        return out

    def __repr__(self):
        return (f"Verdict({self.check}/{self.tensor} {'pass' if self.passed else 'FAIL'} "
                f"margin={self.margin:.3g} case={self.case_label!r})")


class Report:
    """A run's verdicts and counts. `passed` is the run's outcome (what `attest check`'s exit
    code 0 means); `failures` the failing verdicts in diagnosis order (the first names the
    bug class); `summary()` the console report."""

    def __init__(self, run, kernel, kernel_obj=None):
        self._run = run
        self.kernel = kernel
        self._kernel = kernel_obj  # the attest.Kernel, for export
        self.exit_code = run.exit_code
        self.data = json.loads(run.json)
        self.verdicts = [Verdict(v, self._kernel) for v in self.data["verdicts"]]
        self.skipped = list(self.data["skipped"])
        self.failure_cases = list(run.failure_cases)

    @property
    def passed(self):
        return self.exit_code == 0

    @property
    def failures(self):
        return [v for v in self.verdicts if not v.passed]

    def export(self, folder):
        """The first failing verdict (the one naming the bug class) exported to `folder`:
        Verdict.export."""
        if not self.failures:
            raise ValueError("export: no verdict failed")
        return self.failures[0].export(folder)

    def summary(self):
        return self._run.console

    def to_json(self):
        return self._run.json

    def to_junit(self):
        return self._run.junit

    def to_markdown(self):
        return self._run.markdown

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return (f"Report({self.kernel}: {'pass' if self.passed else 'FAIL'}, "
                f"{len(self.failures)} of {len(self.verdicts)} verdicts failed)")
