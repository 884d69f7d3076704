#!/usr/bin/env python3
"""ctest results_page_detects_drift: results_page.py --check must see what it is there for.

On copies in a temporary folder (the committed files are not touched), each case runs the
same script as ctest results_page and requires its exit code and output:
  - the copies as committed: exit 0;
  - one measured number changed in the JSON: exit 1, and the diff shows the old and the new;
  - one number changed in the page: exit 1;
  - a page that is missing: exit 1;
  - JSON that does not parse, an entry without its machine, an unknown machine, a source
    that is not in the repository: exit 2, naming the file and the field.
"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "results_page.py"
ROOT = HERE.parents[1]
DATA = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "results.md"

failures = []


def run(data, page):
    p = subprocess.run([sys.executable, str(SCRIPT), "--check", "--data", str(data),
                        "--out", str(page)], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def expect(name, got_rc, out, want_rc, *needles):
    missing = [n for n in needles if n not in out]
    if got_rc != want_rc or missing:
        failures.append(f"{name}: exit {got_rc} (want {want_rc}); missing from the output: "
                        f"{missing}\n--- output ---\n{out[-3000:]}")
    else:
        print(f"ok: {name} (exit {got_rc})")


def first_number(data_dir):
    """(file, table, entry, key, value) of the first numeric value in a topic's table."""
    for path in sorted(Path(data_dir).glob("*.json")):
        if path.name == "page.json":
            continue
        topic = json.loads(path.read_text())
        for t, table in enumerate(topic["tables"]):
            for e, entry in enumerate(table["entries"]):
                for col in table["columns"]:
                    v = entry.get(col["key"])
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        return path, t, e, col["key"], v
    raise SystemExit("results_page_test: no numeric value in the data to change")


def fresh(tmp, name):
    work = Path(tmp) / name
    shutil.copytree(DATA, work / "results")
    shutil.copy(PAGE, work / "results.md")
    return work / "results", work / "results.md"


def main():
    with tempfile.TemporaryDirectory(prefix="results_page_test.") as tmp:
        data, page = fresh(tmp, "same")
        expect("the committed data and page", *run(data, page), 0)

        # A measured number drifts in the JSON.
        data, page = fresh(tmp, "json")
        path, t, e, key, value = first_number(data)
        topic = json.loads(path.read_text())
        new = value * 10 + 7
        topic["tables"][t]["entries"][e][key] = new
        path.write_text(json.dumps(topic, ensure_ascii=False, indent=2))
        rc, out = run(data, page)
        expect(f"{path.name}: tables[{t}].entries[{e}].{key} {value} -> {new}", rc, out, 1,
               "differs from what", f"+| ", str(new))

        # A number edited in the page by hand.
        data, page = fresh(tmp, "page")
        text = page.read_text()
        lines = text.splitlines(keepends=True)
        i = next(n for n, line in enumerate(lines) if line.startswith("| ") and any(
            ch.isdigit() for ch in line) and not line.startswith("|---"))
        j = next(k for k, ch in enumerate(lines[i]) if ch.isdigit())
        lines[i] = lines[i][:j] + str((int(lines[i][j]) + 1) % 10) + lines[i][j + 1:]
        page.write_text("".join(lines))
        expect("a digit of the page changed by hand", *run(data, page), 1, "-" + lines[i][:20])

        data, page = fresh(tmp, "missing")
        page.unlink()
        expect("the page missing", *run(data, page), 1, "differs from what")

        # Malformed data: exit 2, naming the file and the field.
        data, page = fresh(tmp, "syntax")
        victim = sorted(p for p in data.glob("*.json") if p.name != "page.json")[0]
        victim.write_text(victim.read_text().rstrip()[:-1])  # the closing brace gone
        expect("invalid JSON", *run(data, page), 2, victim.name, "not valid JSON")

        for name, edit, needles in [
            ("an entry without its machine",
             lambda e: e.pop("machine", None), ["entries[0].machine", "missing"]),
            ("an unknown machine",
             lambda e: e.__setitem__("machine", "a-machine-nobody-lent"),
             ["entries[0].machine", "unknown machine"]),
            ("a source outside the repository",
             lambda e: e.__setitem__("source", "docs/no-such-page.md"),
             ["entries[0].source", "not a file or folder of this repository"]),
            ("a date that is not one",
             lambda e: e.__setitem__("date", "yesterday"), ["entries[0].date"]),
        ]:
            data, page = fresh(tmp, name.replace(" ", "_"))
            victim = sorted(p for p in data.glob("*.json") if p.name != "page.json")[0]
            topic = json.loads(victim.read_text())
            table = topic["tables"][0]
            for k in ("machine", "source", "date"):  # the field must be the entry's own
                if k in table.get("defaults", {}):
                    table["entries"][0].setdefault(k, table["defaults"][k])
                    for other in table["entries"][1:]:
                        other.setdefault(k, table["defaults"][k])
                    del table["defaults"][k]
            edit(table["entries"][0])
            victim.write_text(json.dumps(topic, ensure_ascii=False, indent=2))
            expect(name, *run(data, page), 2, victim.name, *needles)

    if failures:
        print("results_page_test: FAIL\n" + "\n".join(failures), file=sys.stderr)
        return 1
    print("results_page_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
