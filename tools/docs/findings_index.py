#!/usr/bin/env python3
"""Renders docs/findings/README.md, the index of findings on real kernels, from the pages' data.

Each page docs/findings/<ID>-<slug>.md starts with its title line, "# <ID> — <title>", and,
right after it, a fenced ```json block: one object with these fields (all required unless
marked optional; no others):

  id          "K1", "K1b", "P2": the file name starts with it, the title line too
  title       the title line's text after "<ID> — "
  kernel      the route attest called (a torch_worker.py backend and what it calls)
  library     the library whose defect it is
  versions    list of "name version" strings it reproduced on (from docs/gpu-results.md)
  gpu         list of the GPUs it was measured on
  measured    list of where docs/gpu-results.md records it
  case_files  list of case files under golden/findings/ ([] where no attest case exists)
  repro       the one command line that reproduces it ("attest repro ..." with the first case)
  check       the check (or kernel error) that fails
  state       "open", "unconfirmed" or "withdrawn"
  upstream    {"status": "reported" | "known upstream" | "fixed upstream" |
                         "not reported upstream",
               "links": [{"url": "https://github.com/OWNER/REPO/issues/N" (or /pull/N),
                          "title": "the issue's or pull request's title"}, ...],
               "fixed_in": null or the release that has the fix,
               "note": "what the links say, and what was not verified",
               "searched": [queries] (optional; required with "not reported upstream"
                                      unless the state is "withdrawn")}

The index is generated from those blocks, so that a status is edited in one place (its page)
and the table cannot drift from it:

  python3 tools/docs/findings_index.py           write docs/findings/README.md
  python3 tools/docs/findings_index.py --check   exit 1 with a diff when the committed index
                                                 is not what the pages render; exit 2, naming
                                                 the file and the field, on a malformed block

ctest findings_index runs --check; findings_index_detects_drift (findings_index_test.py) makes
sure --check fails where it should. Standard library only.
"""
import argparse
import difflib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / "docs" / "findings"
COMMAND = "python3 tools/docs/findings_index.py"

FIELDS = ["id", "title", "kernel", "library", "versions", "gpu", "measured", "case_files",
          "repro", "check", "state", "upstream"]
UPSTREAM_FIELDS = ["status", "links", "fixed_in", "note", "searched"]
STATUSES = ["reported", "known upstream", "fixed upstream", "not reported upstream"]
STATES = ["open", "unconfirmed", "withdrawn"]
ID_RE = re.compile(r"^[KP][0-9]+[a-z]?$")
URL_RE = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)/(issues|pull)/"
                    r"([0-9]+)$")


class DataError(Exception):
    pass


def shown(path):
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


class Page:
    """Checks one page's block; every error names the file and the field."""

    def __init__(self, path):
        self.path = path

    def fail(self, field, what):
        raise DataError(f"{shown(self.path)}: {field}: {what}")

    def text(self, obj, key, field):
        if key not in obj:
            self.fail(field, "missing")
        v = obj[key]
        if not isinstance(v, str) or not v.strip():
            self.fail(field, f"must be a non-empty string, not {json.dumps(v)}")
        return v

    def texts(self, obj, key, field, allow_empty=False):
        if key not in obj:
            self.fail(field, "missing")
        v = obj[key]
        if not isinstance(v, list) or (not v and not allow_empty):
            self.fail(field, "must be a " + ("" if allow_empty else "non-empty ")
                      + "list of strings")
        for i, s in enumerate(v):
            if not isinstance(s, str) or not s.strip():
                self.fail(f"{field}[{i}]", "must be a non-empty string")
        return v


def no_duplicate_keys(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"key {json.dumps(k)} appears twice")
        seen[k] = v
    return seen


def read_page(path, root):
    c = Page(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{shown(path)}: cannot read: {e}")
    m = re.match(r"^# (\S+) — (.+)$", lines[0]) if lines else None
    if not m:
        c.fail("title line", 'the first line must be "# <ID> — <title>"')
    i = 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines) or lines[i].strip() != "```json":
        c.fail("data block", "a ```json block must follow the title line")
    end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
    if end is None:
        c.fail("data block", "the ```json block is not closed")
    try:
        data = json.loads("\n".join(lines[i + 1:end]), object_pairs_hook=no_duplicate_keys)
    except ValueError as e:
        c.fail("data block", f"not valid JSON: {e}")
    if not isinstance(data, dict):
        c.fail("data block", "must be one JSON object")
    for k in data:
        if k not in FIELDS:
            c.fail(k, f"unknown field (the fields: {', '.join(FIELDS)})")

    fid = c.text(data, "id", "id")
    if not ID_RE.match(fid):
        c.fail("id", f"{json.dumps(fid)} is not an id like K1, K1b or P2")
    if not path.name.startswith(fid + "-"):
        c.fail("id", f"the file name must start with {json.dumps(fid + '-')}")
    if m.group(1) != fid:
        c.fail("id", f"the title line names {m.group(1)}, the block {fid}")
    title = c.text(data, "title", "title")
    if m.group(2) != title:
        c.fail("title", "differs from the title line")
    for k in ("kernel", "library", "repro", "check"):
        c.text(data, k, k)
    for k in ("versions", "gpu", "measured"):
        c.texts(data, k, k)
    cases = c.texts(data, "case_files", "case_files", allow_empty=True)
    for n, case in enumerate(cases):
        if not case.startswith("golden/findings/") or not case.endswith(".case.json"):
            c.fail(f"case_files[{n}]", "must be golden/findings/<name>.case.json")
        if not (root / case).is_file():
            c.fail(f"case_files[{n}]", f"{case} is not a file of this repository")
    if cases and not (data["repro"].startswith("attest repro ") and cases[0] in data["repro"]):
        c.fail("repro", "must be an `attest repro` line on the first case file")
    state = c.text(data, "state", "state")
    if state not in STATES:
        c.fail("state", f"{json.dumps(state)} is not one of {', '.join(STATES)}")

    up = data.get("upstream")
    if not isinstance(up, dict):
        c.fail("upstream", "missing" if up is None else "must be an object")
    for k in up:
        if k not in UPSTREAM_FIELDS:
            c.fail(f"upstream.{k}", "unknown field")
    status = c.text(up, "status", "upstream.status")
    if status not in STATUSES:
        c.fail("upstream.status", f"{json.dumps(status)} is not one of {' | '.join(STATUSES)}")
    if "links" not in up or not isinstance(up["links"], list):
        c.fail("upstream.links", "missing" if "links" not in up else "must be a list")
    for n, link in enumerate(up["links"]):
        f = f"upstream.links[{n}]"
        if not isinstance(link, dict) or sorted(link) != ["title", "url"]:
            c.fail(f, 'must be {"url": ..., "title": ...}')
        if not isinstance(link["url"], str) or not URL_RE.match(link["url"]):
            c.fail(f + ".url", "must be https://github.com/OWNER/REPO/issues/N or /pull/N")
        c.text(link, "title", f + ".title")
    if status in ("reported", "known upstream", "fixed upstream") and not up["links"]:
        c.fail("upstream.links", f"a status of {json.dumps(status)} needs a link")
    if "fixed_in" not in up:
        c.fail("upstream.fixed_in", "missing (null where no release has the fix)")
    if up["fixed_in"] is not None and (not isinstance(up["fixed_in"], str)
                                       or not up["fixed_in"].strip()):
        c.fail("upstream.fixed_in", "must be null or a release")
    if up["fixed_in"] is not None and status != "fixed upstream":
        c.fail("upstream.fixed_in", 'a release only with the status "fixed upstream"')
    c.text(up, "note", "upstream.note")
    if "searched" in up:
        c.texts(up, "searched", "upstream.searched")
    elif status == "not reported upstream" and state != "withdrawn":
        c.fail("upstream.searched", '"not reported upstream" needs the queries searched')
    return data


def read_pages(folder, root):
    pages = sorted(p for p in Path(folder).glob("*.md") if p.name != "README.md")
    if not pages:
        raise DataError(f"{shown(folder)}: no finding pages (*.md)")
    found = {}
    for path in pages:
        data = read_page(path, root)
        if data["id"] in found:
            raise DataError(f"{shown(path)}: id: {data['id']} is also the id of "
                            f"{found[data['id']][0].name}")
        found[data["id"]] = (path, data)
    return sorted(found.values(), key=lambda pd: order(pd[1]["id"]))


def order(fid):
    m = re.match(r"^([KP])([0-9]+)([a-z]?)$", fid)
    return (m.group(1), int(m.group(2)), m.group(3))


def cell(s):
    return s.replace("|", "\\|").replace("\n", " ")


def link_label(url):
    owner, repo, kind, n = URL_RE.match(url).groups()
    return f"{owner}/{repo}#{n}" if kind == "issues" else f"{owner}/{repo} PR #{n}"


def sep(status):
    """Before a row's links: a page that found no report links only related ones."""
    return "; related: " if status == "not reported upstream" else ": "


def render(pages):
    counts = {s: 0 for s in STATUSES}
    for _, d in pages:
        counts[d["upstream"]["status"]] += 1
    out = [
        "# Findings on real kernels",
        "",
        "<!-- Generated by tools/docs/findings_index.py from the pages' data blocks: edit a "
        "page, then run",
        f"     `{COMMAND}`. ctest findings_index fails when this file is stale. -->",
        "",
        "One page per defect attest found in a real kernel (PyTorch's SDPA backends, "
        "FlashAttention-4,",
        "FlexAttention, cuDNN), as classified in docs/gpu-results.md (K-numbers: the H200 "
        "campaigns;",
        "P-numbers: PyTorch's public SDPA on an H100). attest's own defects (A-numbers) and "
        "documented",
        "refusals (D-numbers) have no page. The case files are under golden/findings/, and",
        "golden/findings/README.md says how to run them. Each page's \"Reproduce\" says what "
        "`attest repro",
        "--export` writes for it (a standalone repro.py, or the attest-only folder); on the "
        "CUDA host,",
        "tools/device/findings_export.sh exports every case of the pages of its backends and "
        "runs each",
        "repro.py with the device's own Python, recording whether it still reproduces.",
        "",
        "Each page starts with a ```json block right after its title line; "
        "tools/docs/findings_index.py",
        "documents its fields and checks them. `upstream.status` is one of: **reported** (an "
        "issue reports",
        "this finding), **known upstream** (an upstream issue or pull request describes the "
        "defect or its",
        "mechanism; the page says what was not verified, such as whether a fix was merged), "
        "**fixed",
        "upstream** (a merged fix was seen; `fixed_in` names the release when known), **not "
        "reported",
        "upstream** (nothing matching was found; the page lists the queries, and links only "
        "related",
        "reports). Links are issues and pull requests found by searching GitHub; none is "
        "this project's.",
        "",
        "Upstream status: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES) + f" "
        f"({len(pages)} findings).",
        "",
        "| id | title | kernel | check | upstream | case files |",
        "|---|---|---|---|---|---|",
    ]
    for path, d in pages:
        up = d["upstream"]
        links = ", ".join(f"[{link_label(l['url'])}]({l['url']})" for l in up["links"])
        status = up["status"] + (f" in {up['fixed_in']}" if up["fixed_in"] else "")
        state = "" if d["state"] == "open" else f" ({d['state']})"
        cases = "<br>".join(f"[{Path(c).name}](../../{c})" for c in d["case_files"]) or "—"
        kernel = d["kernel"].split(" (")[0]
        out.append(f"| [{d['id']}]({path.name}) | {cell(d['title'])}{state} | "
                   f"`{cell(kernel)}` | {cell(d['check'])} | "
                   f"{cell(status)}{sep(up['status']) + links if links else ''} | {cases} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare the index with what the pages render; exit 1 with a diff if "
                    "they differ")
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="folder of the finding pages")
    ap.add_argument("--out", default=None, help="the index (default: DIR/README.md)")
    ap.add_argument("--root", default=str(ROOT),
                    help="the repository the case files are paths of")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else Path(args.dir) / "README.md"
    try:
        pages = read_pages(args.dir, Path(args.root))
    except DataError as e:
        print(f"findings_index: malformed page:\n{e}", file=sys.stderr)
        return 2
    text = render(pages)
    if not args.check:
        out.write_text(text, encoding="utf-8")
        print(f"findings_index: wrote {shown(out)} ({len(pages)} findings)")
        return 0
    try:
        current = out.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = ""
    except (OSError, UnicodeDecodeError) as e:
        print(f"findings_index: cannot read {shown(out)}: {e}", file=sys.stderr)
        return 2
    if current == text:
        print(f"findings_index: {shown(out)} is what the {len(pages)} pages render")
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        current.splitlines(keepends=True), text.splitlines(keepends=True),
        fromfile=shown(out), tofile=f"rendered from {shown(args.dir)}/*.md"))
    print(f"findings_index: {shown(out)} differs from what the pages render (diff above: - the "
          f"index, + the pages); edit the pages and run `{COMMAND}`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
