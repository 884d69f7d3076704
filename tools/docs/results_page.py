#!/usr/bin/env python3
"""Renders docs/results.md, the page of measured numbers, from the JSON under docs/results/.

The numbers live in JSON, one file per topic; the page is generated from them, so that a
number is edited in one place and the page cannot drift from it.

  docs/results/page.json     the page's title and introduction, and the machines: an id per
                             machine, with the short label the tables print and a description
  docs/results/<topic>.json  one section of the page:
      {"order": N, "title": "...", "summary": "...",            (summary optional)
       "tables": [{"caption": "...",                            (caption optional)
                   "columns": [{"key": "k", "label": "...", "align": "left"|"right",
                                "decimals": D}, ...],           (align, decimals optional)
                   "defaults": {...},                           (optional: merged into entries)
                   "entries": [{"k": value, ...,
                                "machine": "<id in page.json>",
                                "date": "YYYY-MM-DD" or "YYYY-MM-DD HH:MM UTC",
                                "attest_commit": "<hex>" or null (the attest measured, where
                                                 the source says),
                                "source": "<file in this repository>", "section": "...",
                                "evidence": ["<file or folder>", ...],
                                "recorded_in": "<hex>" (the commit that wrote the number down),
                                "note": "..."}, ...],           (section..note optional)
                   "notes": ["..."]}],                          (optional)
       "notes": ["..."]}                                        (optional)
  A value is a string, a number, a boolean or null. Sections follow "order".

Usage:
  tools/docs/results_page.py            write docs/results.md
  tools/docs/results_page.py --check    exit 1 with a diff if docs/results.md is not what the
                                        JSON renders, 0 if it is (ctest results_page)
  --data DIR, --out FILE                other data folder, other page (tests use copies)
Malformed data (invalid JSON, a missing or mistyped field, an unknown machine, a source that is
not in the repository) is exit 2 with the file and the field named.
"""
import argparse
import difflib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = ROOT / "docs" / "results"
DEFAULT_PAGE = ROOT / "docs" / "results.md"
COMMAND = "python3 tools/docs/results_page.py"

DATE = re.compile(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2} UTC)?\Z")
COMMIT = re.compile(r"[0-9a-f]{7,40}\Z")
META = ("machine", "date", "attest_commit", "source", "section", "evidence", "recorded_in",
        "note")
REQUIRED_META = ("machine", "date", "attest_commit", "source")


class DataError(Exception):
    """Malformed data: the message names the file and the field."""


def shown(path):
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise ValueError(f'duplicate key "{k}"')
    return dict(pairs)


def load(path):
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{shown(path)}: cannot read: {e}") from None
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise DataError(f"{shown(path)}: not valid JSON: line {e.lineno} column {e.colno}: "
                        f"{e.msg}") from None
    except ValueError as e:
        raise DataError(f"{shown(path)}: {e}") from None


class Checker:
    """Collects every schema error of one file as 'FILE: FIELD: what'."""

    def __init__(self, path):
        self.path = path
        self.errors = []

    def fail(self, field, what):
        self.errors.append(f"{shown(self.path)}: {field}: {what}")

    def text(self, obj, key, field, optional=False):
        if key not in obj:
            if not optional:
                self.fail(f"{field}.{key}" if field else key, "missing")
            return None
        v = obj[key]
        name = f"{field}.{key}" if field else key
        if not isinstance(v, str) or not v.strip():
            self.fail(name, f"must be a non-empty string, not {json.dumps(v)}")
            return None
        if "\n" in v:
            self.fail(name, "must be one line")
            return None
        return v

    def keys(self, obj, allowed, field):
        for k in obj:
            if k not in allowed:
                self.fail(f"{field}.{k}" if field else k,
                          f"unknown field (allowed: {', '.join(allowed)})")


def check_page(path, data):
    c = Checker(path)
    if not isinstance(data, dict):
        raise DataError(f"{shown(path)}: must be a JSON object")
    c.keys(data, ("title", "intro", "machines"), "")
    c.text(data, "title", "")
    intro = data.get("intro", [])
    if not isinstance(intro, list) or not all(isinstance(p, str) and p.strip() for p in intro):
        c.fail("intro", "must be a list of non-empty strings (paragraphs)")
    machines = data.get("machines")
    if not isinstance(machines, dict) or not machines:
        c.fail("machines", "must be a non-empty object {id: {label, description}}")
    else:
        labels = {}
        for mid, m in machines.items():
            field = f"machines.{mid}"
            if not isinstance(m, dict):
                c.fail(field, "must be an object {label, description}")
                continue
            c.keys(m, ("label", "description"), field)
            label = c.text(m, "label", field)
            c.text(m, "description", field)
            if label is not None:
                if label in labels:
                    c.fail(f"{field}.label", f'"{label}" is also the label of {labels[label]}')
                labels[label] = mid
    if c.errors:
        raise DataError("\n".join(c.errors))
    return data


def check_value(c, field, v):
    if isinstance(v, str):
        if "\n" in v:
            c.fail(field, "must be one line")
    elif not (v is None or isinstance(v, (bool, int, float))):
        c.fail(field, f"must be a string, a number, a boolean or null, not {json.dumps(v)}")


def check_entry(c, field, entry, keys, machines):
    if not isinstance(entry, dict):
        c.fail(field, "must be an object")
        return
    c.keys(entry, tuple(keys) + META, field)
    for k in keys:
        if k not in entry:
            c.fail(f"{field}.{k}", "missing (a column of the table)")
        else:
            check_value(c, f"{field}.{k}", entry[k])
    for k in REQUIRED_META:
        if k not in entry:
            c.fail(f"{field}.{k}", "missing")
    if "machine" in entry and entry["machine"] not in machines:
        c.fail(f"{field}.machine", f"unknown machine {json.dumps(entry['machine'])} "
               f"(page.json machines: {', '.join(sorted(machines))})")
    if "date" in entry and not (isinstance(entry["date"], str) and DATE.match(entry["date"])):
        c.fail(f"{field}.date",
               f'must be "YYYY-MM-DD" or "YYYY-MM-DD HH:MM UTC", not {json.dumps(entry["date"])}')
    for k in ("attest_commit", "recorded_in"):
        if k in entry and entry[k] is not None and not (
                isinstance(entry[k], str) and COMMIT.match(entry[k])):
            c.fail(f"{field}.{k}", f"must be a commit (7-40 lowercase hex digits)"
                   f"{' or null' if k == 'attest_commit' else ''}, not {json.dumps(entry[k])}")
    if "recorded_in" in entry and entry["recorded_in"] is None:
        c.fail(f"{field}.recorded_in", "leave it out rather than null")
    paths = []
    if "source" in entry:
        if isinstance(entry["source"], str) and entry["source"].strip():
            paths.append(("source", entry["source"]))
        else:
            c.fail(f"{field}.source", "must be a path in this repository")
    ev = entry.get("evidence", [])
    if not isinstance(ev, list) or not all(isinstance(p, str) and p.strip() for p in ev):
        c.fail(f"{field}.evidence", "must be a list of paths in this repository")
    else:
        paths += [(f"evidence[{i}]", p) for i, p in enumerate(ev)]
    for name, p in paths:
        if Path(p).is_absolute() or ".." in Path(p).parts or not (ROOT / p).exists():
            c.fail(f"{field}.{name}", f"{json.dumps(p)} is not a file or folder of this repository")
    for k in ("section", "note"):
        if k in entry:
            c.text(entry, k, field)


def check_topic(path, data, machines):
    if not isinstance(data, dict):
        raise DataError(f"{shown(path)}: must be a JSON object")
    c = Checker(path)
    c.keys(data, ("order", "title", "summary", "tables", "notes"), "")
    if not isinstance(data.get("order"), int) or isinstance(data.get("order"), bool):
        c.fail("order", f"must be an integer, not {json.dumps(data.get('order'))}")
    c.text(data, "title", "")
    c.text(data, "summary", "", optional=True)
    check_notes(c, data, "notes")
    tables = data.get("tables")
    if not isinstance(tables, list) or not tables:
        c.fail("tables", "must be a non-empty list")
        tables = []
    for t, table in enumerate(tables):
        tf = f"tables[{t}]"
        if not isinstance(table, dict):
            c.fail(tf, "must be an object")
            continue
        c.keys(table, ("caption", "columns", "defaults", "entries", "notes"), tf)
        c.text(table, "caption", tf, optional=True)
        check_notes(c, table, f"{tf}.notes")
        columns = table.get("columns")
        keys = []
        if not isinstance(columns, list) or not columns:
            c.fail(f"{tf}.columns", "must be a non-empty list")
        else:
            for i, col in enumerate(columns):
                cf = f"{tf}.columns[{i}]"
                if not isinstance(col, dict):
                    c.fail(cf, "must be an object {key, label, align}")
                    continue
                c.keys(col, ("key", "label", "align", "decimals"), cf)
                key = c.text(col, "key", cf)
                c.text(col, "label", cf)
                d = col.get("decimals", 0)
                if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= 6:
                    c.fail(f"{cf}.decimals", f"must be an integer 0-6, not {json.dumps(d)}")
                if col.get("align", "left") not in ("left", "right"):
                    c.fail(f"{cf}.align", f'must be "left" or "right", not {json.dumps(col["align"])}')
                if key in META:
                    c.fail(f"{cf}.key", f'"{key}" is an entry\'s own field, not a column')
                elif key in keys:
                    c.fail(f"{cf}.key", f'"{key}" twice')
                elif key is not None:
                    keys.append(key)
        defaults = table.get("defaults", {})
        if not isinstance(defaults, dict):
            c.fail(f"{tf}.defaults", "must be an object")
            defaults = {}
        entries = table.get("entries")
        if not isinstance(entries, list) or not entries:
            c.fail(f"{tf}.entries", "must be a non-empty list")
            entries = []
        merged = []
        for e, entry in enumerate(entries):
            if isinstance(entry, dict):
                entry = {**defaults, **entry}
            check_entry(c, f"{tf}.entries[{e}]", entry, keys, machines)
            merged.append(entry)
        table["entries"] = merged
    if c.errors:
        raise DataError("\n".join(c.errors))
    return data


def check_notes(c, obj, field):
    notes = obj.get("notes", [])
    if not isinstance(notes, list) or not all(
            isinstance(n, str) and n.strip() and "\n" not in n for n in notes):
        c.fail(field, "must be a list of one-line strings")


def read_data(data_dir):
    data_dir = Path(data_dir)
    page_path = data_dir / "page.json"
    if not page_path.is_file():
        raise DataError(f"{shown(page_path)}: missing (the page's title and machines)")
    page = check_page(page_path, load(page_path))
    topics, errors = [], []
    for path in sorted(data_dir.glob("*.json")):
        if path.name == "page.json":
            continue
        try:
            topics.append((path, check_topic(path, load(path), page["machines"])))
        except DataError as e:
            errors.append(str(e))
    if errors:
        raise DataError("\n".join(errors))
    if not topics:
        raise DataError(f"{shown(data_dir)}: no topic files (*.json besides page.json)")
    seen = {}
    for path, topic in topics:
        if topic["order"] in seen:
            raise DataError(f"{shown(path)}: order: {topic['order']} is also the order of "
                            f"{shown(seen[topic['order']])}")
        seen[topic["order"]] = path
    topics.sort(key=lambda pt: pt[1]["order"])
    return page, [t for _, t in topics]


def cell(v, decimals=None):
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return f"{v:.{decimals}f}" if decimals is not None else str(v)
    return v.replace("|", "\\|")


def commit(v):
    return f"`{v[:7]}`" if v else "—"


def source(entry):
    s = f"`{entry['source']}`"
    if entry.get("section"):
        s += f' "{entry["section"]}"'
    if entry.get("evidence"):
        s += "; " + ", ".join(f"`{p}`" for p in entry["evidence"])
    if entry.get("recorded_in"):
        s += f"; recorded in `{entry['recorded_in'][:7]}`"
    return s


def render_table(table, machines):
    out = []
    if table.get("caption"):
        out += [f"**{table['caption']}**", ""]
    entries = table["entries"]
    meta = [("machine", "machine", lambda e: machines[e["machine"]]["label"]),
            ("date", "date", lambda e: e["date"]),
            ("attest", "attest commit", lambda e: commit(e["attest_commit"])),
            ("source", "source", source)]
    shared, varying = [], []
    for name, label, fn in meta:
        values = [fn(e) for e in entries]
        (shared if len(set(values)) == 1 else varying).append((name, label, fn, values[0]))
    cols = [(c["label"], c.get("align", "left")) for c in table["columns"]]
    cols += [(label, "left") for _, label, _, _ in varying]
    out.append("| " + " | ".join(cell(label) for label, _ in cols) + " |")
    out.append("|" + "|".join("---:" if a == "right" else "---" for _, a in cols) + "|")
    notes = []
    for e in entries:
        row = [cell(e[c["key"]], c.get("decimals")) for c in table["columns"]]
        if e.get("note"):
            notes.append(e["note"])
            row[0] += f" [{len(notes)}]"
        row += [fn(e) for _, _, fn, _ in varying]
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    if shared:
        out += ["; ".join(f"{label}: {'not recorded' if value == '—' else value}"
                          for _, label, _, value in shared) + ".", ""]
    for i, n in enumerate(notes, 1):
        out.append(f"- [{i}] {n}")
    if notes:
        out.append("")
    for n in table.get("notes", []):
        out += [n, ""]
    return out


def render(page, topics):
    machines = page["machines"]
    out = [f"# {page['title']}", "",
           f"<!-- Generated by `{COMMAND}` from docs/results/*.json: edit the JSON, then run it. -->",
           f"_This page is generated by `{COMMAND}` from the JSON files in `docs/results/` "
           "(one per section); edit those and rerun it. ctest `results_page` fails when the "
           "two differ._", ""]
    for p in page.get("intro", []):
        out += [p, ""]
    out += ["Sections: " + ", ".join(f"[{t['title']}](#{anchor(t['title'])})" for t in topics)
            + ", [Machines](#machines).", ""]
    for t in topics:
        out += [f"## {t['title']}", ""]
        if t.get("summary"):
            out += [t["summary"], ""]
        for table in t["tables"]:
            out += render_table(table, machines)
        for n in t.get("notes", []):
            out += [n, ""]
    out += ["## Machines", "", "| machine | what it is |", "|---|---|"]
    for mid in sorted(machines, key=lambda m: machines[m]["label"]):
        out.append(f"| {cell(machines[mid]['label'])} | {cell(machines[mid]['description'])} |")
    return "\n".join(out) + "\n"


def anchor(title):
    """GitHub's heading anchor: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare the page with what the data renders; exit 1 with a diff if "
                    "they differ")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="folder of the JSON files")
    ap.add_argument("--out", default=str(DEFAULT_PAGE), help="the page")
    args = ap.parse_args(argv)
    try:
        page, topics = read_data(args.data)
    except DataError as e:
        print(f"results_page: malformed data:\n{e}", file=sys.stderr)
        return 2
    text = render(page, topics)
    out = Path(args.out)
    if not args.check:
        out.write_text(text, encoding="utf-8")
        print(f"results_page: wrote {shown(out)} ({len(topics)} sections)")
        return 0
    try:
        current = out.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = ""
    except (OSError, UnicodeDecodeError) as e:
        print(f"results_page: cannot read {shown(out)}: {e}", file=sys.stderr)
        return 2
    if current == text:
        print(f"results_page: {shown(out)} is what {shown(args.data)}/*.json renders")
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        current.splitlines(keepends=True), text.splitlines(keepends=True),
        fromfile=shown(out), tofile=f"rendered from {shown(args.data)}/*.json"))
    print(f"results_page: {shown(out)} differs from what {shown(args.data)}/*.json renders "
          f"(diff above: - the page, + the data); edit the JSON and run `{COMMAND}`",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
