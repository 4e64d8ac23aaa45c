"""Bring the outputs the pages show up to what their blocks print, keeping each page's excerpt: after
`PEXEC_DOC_DUMP=DIR pytest tests/test_doc_examples.py -k page_examples` has dumped every block's output,
`python tests/rewrite_doc_outputs.py DIR` adds to each shown output that differs the few lines it left out (up to
three, none a table row or a temporary path) or a line `…` where it leaves out more, and names the outputs whose
shown lines the block no longer prints at all (those need a person: the page says something that is no longer
true). Read the diff before committing it."""

import json
import sys
from pathlib import Path

import test_doc_examples as T

ROOT = Path(__file__).resolve().parents[1]
dump = Path(sys.argv[1])
for f in sorted(dump.glob("*.json")):
    page = f.stem.replace("__", "/")
    outputs = {d["line"]: d["output"] for d in json.loads(f.read_text())}
    text = (ROOT / page).read_text()
    lines = text.split("\n")
    blocks = [b for b in T.page_blocks(page) if b.not_run is None]
    edits = []  # (start_line_index_of_shown_body, end, new_body_lines)
    offset = 0
    if page == "README.md":
        offset = text.split(T.TOUR, 1)[0].count("\n")
    for b in blocks:
        if b.shown is None or b.line not in outputs:
            continue
        printed = outputs[b.line]
        if T.output_differs(b.shown, printed) is None:
            continue
        shown_raw = b.shown.rstrip("\n").split("\n")
        plines = T.compared_lines(printed)
        # align each compared shown line to a printed compared line, in order
        idx, at, ok = [], 0, True
        for raw in shown_raw:
            if raw.strip() == "…" or not T.compared_lines(raw):
                idx.append(None)
                continue
            pat = T._pattern(raw)
            k = next((i for i in range(at, len(plines)) if pat.fullmatch(plines[i])), None)
            if k is None:
                ok = False
                break
            idx.append(k)
            at = k + 1
        if not ok:
            print(f"CANNOT ALIGN {page}:{b.line + offset}: {raw!r}")
            continue

        def gap(lo: int, hi: int, plines: list[str] = plines) -> list[str]:
            missing = plines[lo:hi]
            if not missing:
                return []
            if len(missing) <= 3 and not any("/tmp/" in m or m.startswith(("│", "┃")) for m in missing):
                return missing
            return ["…"]

        new, prev = [], 0
        for raw, k in zip(shown_raw, idx, strict=True):
            if raw.strip() == "…":
                continue  # recomputed
            if k is not None:
                new += gap(prev, k)
                prev = k + 1
            new.append(raw)
        new += gap(prev, len(plines))
        # locate the shown block in the file: the fence after the bash block at b.line + offset
        i = b.line + offset  # 1-based line of ```bash => index i-1; find its closing fence then the next fence
        j = i
        while lines[j].strip() != "```":
            j += 1
        k2 = j + 1
        while not lines[k2].strip().startswith("```"):
            k2 += 1
        start = k2 + 1
        end = start
        while lines[end].strip() != "```":
            end += 1
        edits.append((start, end, new))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    if edits:
        (ROOT / page).write_text("\n".join(lines))
        print(f"rewrote {len(edits)} output(s) of {page}")
