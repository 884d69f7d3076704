#!/usr/bin/env python3
"""Draws docs/layers.svg, the picture of attest's layers in docs/design.md "Layers".

The layers and their parts are the data below; every folder that the layering table
(tools/layering/layering_test.cmake, its forbid() lines) names must appear in it, so that the
picture cannot miss a folder the test guards. Each layer includes only the layers under it;
inside verify/, the parts include only those to their left.

Usage:
  tools/docs/layers_svg.py           write docs/layers.svg
  tools/docs/layers_svg.py --check   exit 1 if docs/layers.svg is not what the data draws, or a
                                     folder of the layering table is missing from the data
"""
import os
import re
import sys
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "docs", "layers.svg")
TABLE = os.path.join(ROOT, "tools", "layering", "layering_test.cmake")

# Top to bottom: (folder, what it answers, [(part, what it holds), ...]).
FRONT_ENDS = [
    ("tools/attest", "the CLI", "attest check, fuzz, audit, ..."),
    ("python", "Python", "attest.check, pytest plugin"),
    ("include/attest", "C++ API", "RunChecks, gtest.h"),
    ("tools/workers", "exec: workers", "SDPA, flex, FA4"),
    ("property_tests", "properties", "RapidCheck"),
]
LAYERS = [
    ("run", "how a run goes", [
        ("suite", "suites and rows"), ("run", "the runner"), ("coverage", "the guard"),
        ("case_gen, fuzz", "cases, shrinking"), ("audit/", "low-precision"),
        ("check_run", "the front ends' call"), ("compare", "outside outputs")]),
    ("verify", "how we judge", [
        ("metrics/", "errors vs a reference"), ("tolerance/", "policies, baselines, Verdict"),
        ("checks/", "the checks"), ("report/", "console, JSON, JUnit")]),
    ("kernels", "what is tested", [
        ("kernel.h", "the interface"), ("models/", "CPU numerics models"),
        ("mutants/", "seeded bugs"), ("exec/", "exec: workers"), ("plugin/", "C ABI plugins"),
        ("device/", "CUDA, HIP")]),
    ("reference", "what is correct", [
        ("problem/", "problem, masks"), ("data/", "generators"), ("case/", "case files"),
        ("formats/", "MXFP8, NVFP4"), ("recipes/", "roundings"),
        ("oracle/", "float64, CUDA"), ("io/", "JSON, tensors"),
        ("golden/", "catalogue")]),
]
BESIDE = [("golden", "pinned outputs, findings"), ("bench", "speed and memory"),
          ("docs", "the contracts")]

W, MARGIN, GAP = 960, 16, 14
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"
LAYER_FILL = {"run": "#e8f0fe", "verify": "#e6f4ea", "kernels": "#fef7e0", "reference": "#fce8e6"}


def text(x, y, s, size=12, weight="normal", anchor="start", fill="#202124"):
    return (f"<text x='{x}' y='{y}' {FONT} font-size='{size}' font-weight='{weight}' "
            f"text-anchor='{anchor}' fill='{fill}'>{escape(s)}</text>")


def box(x, y, w, h, fill, stroke="#5f6368", rx=6):
    return (f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='{rx}' fill='{fill}' "
            f"stroke='{stroke}' stroke-width='1'/>")


def arrow(x, y0, y1):
    """A downward arrow from y0 to y1: "includes"."""
    return (f"<line x1='{x}' y1='{y0}' x2='{x}' y2='{y1 - 6}' stroke='#5f6368' "
            f"stroke-width='1.5'/><polygon points='{x - 5},{y1 - 7} {x + 5},{y1 - 7} {x},{y1}' "
            "fill='#5f6368'/>")


def parts_row(x, y, w, parts, fill, chain):
    """Equal boxes across one layer; chain: arrows between them (each includes its left)."""
    out, n, pad = [], len(parts), 8
    pw = (w - pad * (n + 1)) / n
    for i, (name, what) in enumerate(parts):
        px = x + pad + i * (pw + pad)
        out.append(box(f"{px:.1f}", y, f"{pw:.1f}", 44, fill, "#9aa0a6", 4))
        out.append(text(f"{px + pw / 2:.1f}", y + 18, name, 12, "bold", "middle"))
        out.append(text(f"{px + pw / 2:.1f}", y + 34, what, 10, "normal", "middle", "#3c4043"))
        if chain and i > 0:
            ax = px - pad
            out.append(f"<polygon points='{ax + 5:.1f},{y + 17} {ax + 5:.1f},{y + 27} "
                       f"{ax - 1:.1f},{y + 22}' fill='#5f6368'/>")
    return out


def draw():
    main_w = W - 2 * MARGIN - 170
    y = MARGIN
    out = [text(MARGIN, y + 14, "attest: each layer includes only the layers below it "
                "(tools/layering/layering_test.cmake)", 14, "bold")]
    y += 30
    # Front ends: one row of boxes.
    out.append(text(MARGIN, y + 12, "front ends and drivers", 12, "bold", fill="#3c4043"))
    y += 18
    n = len(FRONT_ENDS)
    fw = (main_w - 8 * (n - 1)) / n
    for i, (folder, role, what) in enumerate(FRONT_ENDS):
        fx = MARGIN + i * (fw + 8)
        out.append(box(f"{fx:.1f}", y, f"{fw:.1f}", 58, "#f1f3f4"))
        out.append(text(f"{fx + fw / 2:.1f}", y + 18, folder + "/", 12, "bold", "middle"))
        out.append(text(f"{fx + fw / 2:.1f}", y + 34, role, 11, "normal", "middle"))
        out.append(text(f"{fx + fw / 2:.1f}", y + 49, what, 9, "normal", "middle", "#5f6368"))
    y += 58
    for folder, role, parts in LAYERS:
        out.append(arrow(MARGIN + main_w / 2, y + 2, y + 22))
        y += 24
        h = 84
        out.append(box(MARGIN, y, main_w, h, LAYER_FILL[folder]))
        out.append(text(MARGIN + 10, y + 18, f"{folder}/", 13, "bold"))
        out.append(text(MARGIN + 10 + 9 * len(folder) + 16, y + 18, role, 12, "normal",
                        fill="#3c4043"))
        if folder == "verify":
            out.append(text(MARGIN + main_w - 10, y + 18, "inside: each part includes only "
                            "those to its left", 10, "normal", "end", "#5f6368"))
        out.extend(parts_row(MARGIN, y + 30, main_w, parts, "#ffffff", folder == "verify"))
        y += h
    # Beside: data and numbers every layer's tests use.
    bx = MARGIN + main_w + 16
    by = MARGIN + 48
    out.append(text(bx, by + 12, "beside the layers", 12, "bold", fill="#3c4043"))
    by += 20
    for folder, what in BESIDE:
        out.append(box(bx, by, 154, 50, "#ffffff", "#9aa0a6"))
        out.append(text(bx + 77, by + 20, folder + "/", 12, "bold", "middle"))
        out.append(text(bx + 77, by + 37, what, 10, "normal", "middle", "#3c4043"))
        by += 60
    height = y + MARGIN
    head = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{height}' "
            f"viewBox='0 0 {W} {height}'>\n<!-- generated by tools/docs/layers_svg.py; do not "
            "edit -->\n<rect width='100%' height='100%' fill='#ffffff'/>\n")
    return head + "\n".join(out) + "\n</svg>\n"


def table_folders():
    """The folders the layering table guards (first operand of each forbid())."""
    with open(TABLE) as f:
        return sorted(set(re.findall(r"^forbid\(([\w/]+)", f.read(), re.M)))


def drawn_folders():
    names = {f for f, _, _ in FRONT_ENDS} | {f for f, _ in BESIDE}
    for folder, _, parts in LAYERS:
        names.add(folder)
        for part, _ in parts:
            if part.endswith("/"):
                names.add(f"{folder}/{part[:-1]}")
    return names


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    drawn = drawn_folders()
    missing = [f for f in table_folders() if f not in drawn and
               not any(d == f or d.startswith(f + "/") for d in drawn)]
    if missing:
        print("layers_svg.py: the layering table guards folders the picture lacks: " +
              ", ".join(missing), file=sys.stderr)
        return 1
    svg = draw()
    if check:
        with open(OUT) as f:
            if f.read() != svg:
                print("layers_svg.py: docs/layers.svg is not what the data draws; run "
                      "tools/docs/layers_svg.py", file=sys.stderr)
                return 1
        print("layers_svg.py: docs/layers.svg is current")
        return 0
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        f.write(svg)
    os.replace(tmp, OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
