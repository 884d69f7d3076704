"""attest's pytest plugin (entry point `pytest11`, docs/python.md "pytest"): a test module
that assigns `attest.pytest_suite(fn, ...)` to a `test_*` name gets one test item per suite
row, named `<check>[<case label>]`, so that `-k accuracy`, `-k "causal and not dq"`, `-x`
and `--junitxml` work as for any test. A row's verdicts are computed when the first selected
item runs: the selected rows' checks run in one suite run (only that check's rows when every
selected item has the same check), and each item reports its own verdicts.
"""

import pytest

import attest


class AttestFailure(Exception):
    """An item's failing verdicts, already formatted."""


def pytest_configure(config):
    config.addinivalue_line("markers", "attest: an item of an attest suite (attest.pytest_suite)")


def pytest_pycollect_makeitem(collector, name, obj):
    if isinstance(obj, attest.SuiteTests) and collector.funcnamefilter(name):
        return SuiteCollector.from_parent(collector, name=name, spec=obj)
    return None


class SuiteCollector(pytest.Collector):
    def __init__(self, *, spec, **kw):
        super().__init__(**kw)
        self.spec = spec
        self.report = None
        self.ran_check = None
        self.add_marker("attest")

    def collect(self):
        seen = {}
        for row in self.spec.rows():
            if self.spec.options["only_check"] and row["check"] != self.spec.options["only_check"]:
                continue
            base = f"{row['check']}[{row['label']}]"
            seen[base] = seen.get(base, 0) + 1
            name = base if seen[base] == 1 else f"{row['check']}[{row['label']} #{seen[base]}]"
            yield SuiteItem.from_parent(self, name=name, row=row)
        # The coverage guard judges the run as a whole (run/coverage.h).
        yield SuiteItem.from_parent(self, name="coverage", row=None)

    def verdicts_for(self, item):
        if self.report is None:
            selected = [i for i in self.session.items if isinstance(i, SuiteItem) and
                        i.parent is self and i.row is not None]
            checks = {i.row["check"] for i in selected}
            self.ran_check = checks.pop() if len(checks) == 1 else None
            self.report = self.spec.run(only_check=self.ran_check)
        if item.row is None:
            return [v for v in self.report.verdicts if v.check == "coverage"]
        label = item.row["label"]
        return [v for v in self.report.verdicts if v.case_label == label and
                v.check in (item.row["check"], "kernel-error")]


class SuiteItem(pytest.Item):
    def __init__(self, *, row, **kw):
        super().__init__(**kw)
        self.row = row

    def runtest(self):
        if self.row is not None and self.row["skipped"]:
            pytest.skip(f"row does not apply: {self.row['skipped']}")
        verdicts = self.parent.verdicts_for(self)
        failed = [v for v in verdicts if not v.passed]
        if failed:
            raise AttestFailure("\n".join(v.describe() for v in failed))
        if not verdicts and self.row is not None:
            skipped = [s["reason"] for s in self.parent.report.skipped
                       if s["check"] == self.row["check"] and s["case"] == self.row["label"]]
            pytest.skip(skipped[0] if skipped else "no verdict on this case")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, AttestFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::{self.name}"
