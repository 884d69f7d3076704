#!/usr/bin/env python3
"""Validates attest JSON reports against docs/report.schema.json (JSON Schema draft 2020-12,
with the `jsonschema` package from PyPI that tools/bootstrap installs in build/venv).

  validate_report.py REPORT.json...     exit 0 all valid, 1 one is not, 77 no jsonschema

Each invalid report is named with every violation's JSON path and message. The schema itself is
checked against its meta-schema first.
"""

import json
import os
import sys

SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                      "report.schema.json")


def validator():
    try:
        import jsonschema
    except ImportError:
        return None
    with open(SCHEMA, encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _not_json(constant):
    """JSON has no NaN or Infinity: Python's json module accepts them unless told not to."""
    raise ValueError(f"{constant} is not a JSON value")


def errors(v, report):
    """The violations of `report` (a parsed JSON value), as 'path: message' lines."""
    out = []
    for e in sorted(v.iter_errors(report), key=lambda e: list(e.absolute_path)):
        path = "/".join(str(p) for p in e.absolute_path) or "(top)"
        out.append(f"{path}: {e.message}")
    return out


def main(paths):
    v = validator()
    if v is None:
        print("validate_report: the jsonschema package is not installed (tools/bootstrap)")
        return 77
    bad = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            report = json.load(f, parse_constant=_not_json)
        found = errors(v, report)
        if found:
            bad += 1
            print(f"{path}: does not match docs/report.schema.json:")
            for line in found[:20]:
                print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
