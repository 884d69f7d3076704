#!/usr/bin/env python3
"""ctest findings_index_detects_drift: findings_index.py --check must see what it is there for.

On copies in a temporary folder (the committed files are not touched), each case runs the
same script as ctest findings_index and requires its exit code and output:
  - the copies as committed: exit 0;
  - a page's upstream status changed: exit 1, and the diff shows the old and the new row;
  - a page's title changed (title line and block together): exit 1;
  - a row of the index edited by hand: exit 1;
  - the index missing: exit 1;
  - a block that does not parse, a missing field, an unknown status, a link that is not a
    GitHub issue or pull request, a case file that is not in the repository, an id that does
    not match the file name: exit 2, naming the file and the field.
"""
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "findings_index.py"
ROOT = HERE.parents[1]
PAGES = ROOT / "docs" / "findings"

failures = []


def run(folder):
    p = subprocess.run([sys.executable, str(SCRIPT), "--check", "--dir", str(folder),
                        "--root", str(ROOT)], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def expect(name, got_rc, out, want_rc, *needles):
    missing = [n for n in needles if n not in out]
    if got_rc != want_rc or missing:
        failures.append(f"{name}: exit {got_rc} (want {want_rc}); missing from the output: "
                        f"{missing}\n--- output ---\n{out[-3000:]}")
    else:
        print(f"ok: {name} (exit {got_rc})")


def fresh(tmp, name):
    work = Path(tmp) / name
    shutil.copytree(PAGES, work)
    return work


def victim(folder, prefix="K9-"):
    return next(p for p in sorted(folder.glob("*.md")) if p.name.startswith(prefix))


def split(page):
    """(lines before the block, the block as an object, lines after it)."""
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == "```json")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "```")
    return lines[:start + 1], json.loads("".join(lines[start + 1:end])), lines[end:]


def write(page, head, block, tail):
    page.write_text("".join(head) + json.dumps(block, ensure_ascii=False, indent=2) + "\n"
                    + "".join(tail), encoding="utf-8")


def main():
    with tempfile.TemporaryDirectory(prefix="findings_index_test.") as tmp:
        expect("the committed pages and index", *run(fresh(tmp, "same")), 0)

        # An upstream status changes on its page, the index is not regenerated.
        folder = fresh(tmp, "status")
        page = victim(folder)
        head, block, tail = split(page)
        old = block["upstream"]["status"]
        new = "not reported upstream" if old != "not reported upstream" else "known upstream"
        block["upstream"]["status"] = new
        block["upstream"].setdefault("searched", ["a query"])
        write(page, head, block, tail)
        expect(f"{page.name}: upstream.status {old} -> {new}", *run(folder), 1,
               "differs from what the pages render", "-| [K9]", "+| [K9]", new)

        # The title, in the title line and the block alike.
        folder = fresh(tmp, "title")
        page = victim(folder)
        head, block, tail = split(page)
        block["title"] = block["title"] + " (edited)"
        head[0] = re.sub(r" — .*", " — " + block["title"], head[0].rstrip("\n")) + "\n"
        write(page, head, block, tail)
        expect("a title changed on its page", *run(folder), 1, "(edited)")

        # A row of the index edited by hand.
        folder = fresh(tmp, "index")
        index = folder / "README.md"
        text = index.read_text(encoding="utf-8")
        edited = text.replace("| not reported upstream |", "| fixed upstream |", 1)
        if edited == text:
            failures.append("the index has no row 'not reported upstream' to edit")
        index.write_text(edited, encoding="utf-8")
        expect("a row of the index edited by hand", *run(folder), 1, "-| [", "+| [")

        folder = fresh(tmp, "missing")
        (folder / "README.md").unlink()
        expect("the index missing", *run(folder), 1, "differs from what the pages render")

        # Malformed blocks: exit 2, naming the file and the field.
        folder = fresh(tmp, "syntax")
        page = victim(folder)
        page.write_text(page.read_text(encoding="utf-8").replace('"id": "K9",', '"id": "K9"',
                                                                 1), encoding="utf-8")
        expect("a block that is not JSON", *run(folder), 2, page.name, "not valid JSON")

        folder = fresh(tmp, "no_block")
        page = victim(folder)
        page.write_text(page.read_text(encoding="utf-8").replace("```json", "```", 1),
                        encoding="utf-8")
        expect("no ```json block after the title", *run(folder), 2, page.name, "data block")

        for name, edit, needles in [
            ("a missing field", lambda b: b.pop("check"), ["check", "missing"]),
            ("a missing upstream note", lambda b: b["upstream"].pop("note"),
             ["upstream.note", "missing"]),
            ("an unknown status",
             lambda b: b["upstream"].__setitem__("status", "probably fine"),
             ["upstream.status", "is not one of"]),
            ("a link that is not a GitHub issue or pull request",
             lambda b: b["upstream"]["links"].append({"url": "https://example.org/bug/1",
                                                      "title": "x"}),
             ["upstream.links[", ".url"]),
            ("a case file that is not in the repository",
             lambda b: b["case_files"].append("golden/findings/no-such.case.json"),
             ["case_files[1]", "not a file of this repository"]),
            ("an unknown field", lambda b: b.__setitem__("severity", "high"),
             ["severity", "unknown field"]),
            ("an id that does not match the file name", lambda b: b.__setitem__("id", "K99"),
             ["id", "file name"]),
            ("a release without the status fixed upstream",
             lambda b: b["upstream"].__setitem__("fixed_in", "2.12.0"),
             ["upstream.fixed_in"]),
        ]:
            folder = fresh(tmp, re.sub(r"\W+", "_", name))
            page = victim(folder)
            head, block, tail = split(page)
            edit(block)
            write(page, head, block, tail)
            expect(name, *run(folder), 2, page.name, *needles)

        folder = fresh(tmp, "not_reported_without_queries")
        page = victim(folder, "K3-")
        head, block, tail = split(page)
        block["upstream"].pop("searched", None)
        write(page, head, block, tail)
        expect("not reported upstream without the queries", *run(folder), 2, page.name,
               "upstream.searched")

    if failures:
        print("findings_index_test: FAIL\n" + "\n".join(failures), file=sys.stderr)
        return 1
    print("findings_index_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
