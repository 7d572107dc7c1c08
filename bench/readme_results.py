"""The README's results table, built from one results folder (no GPU needed).

    python bench/readme_results.py bench/results/NVIDIA_H200/2026-12-01-a03ab6a          # print it
    python bench/readme_results.py bench/results/NVIDIA_H200/<date>-<commit> --write     # into README.md

The folder must hold the main benchmarks of one run (``window_prefill[_<commit>].csv`` and
``prefix_prefill[_<commit>].csv``, peers measured in the same processes) and ``env.txt``. ``--write``
replaces what lies between the README's ``<!-- results:begin ... -->`` and ``<!-- results:end -->``
markers; ``tests/integration/test_readme.py`` checks that the README's block is this script's output for
the folder its marker names.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN = re.compile(r"<!-- results:begin folder=(\S+) -->\n")
END = "<!-- results:end -->"


def _rows(folder: Path, stem: str) -> list[dict]:
    own = re.compile(rf"{stem}(_[0-9a-f]{{7,}})?")  # the main benchmark, not a variant (e.g. _softcap30)
    found = sorted(p for p in folder.glob(f"{stem}*.csv") if own.fullmatch(p.stem))
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one {stem}[_<commit>].csv, found {[p.name for p in found]}")
    with found[0].open() as f:
        return list(csv.DictReader(f))


def _env(folder: Path) -> tuple[str, str]:
    """(GPU name, 'torch X, triton Y') from the folder's env.txt."""
    text = (folder / "env.txt").read_text()
    gpu = re.search(r"^(NVIDIA [^,]+|AMD [^,]+),", text, re.M)
    versions = re.search(r"^torch (\S+) triton (\S+)", text, re.M)
    if not (gpu and versions):
        raise SystemExit(f"{folder}/env.txt: no GPU name or torch/triton versions")
    return gpu.group(1), f"torch {versions.group(1)}, triton {versions.group(2)}"


def _ms(x: float) -> str:
    return f"{x:.4f}" if x < 0.1 else f"{x:.3f}" if x < 10 else f"{x:.2f}"


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return _ms(lo) if _ms(lo) == _ms(hi) else f"{_ms(lo)}-{_ms(hi)}"


def table(folder: Path) -> str:
    folder = folder.resolve()
    rel = folder.relative_to(ROOT).as_posix()
    date, _, commit = folder.name.rpartition("-")
    gpu, versions = _env(folder)
    win = {(r["shape"], r["peer"]): r for r in _rows(folder, "window_prefill")}
    pre = _rows(folder, "prefix_prefill")

    def w(shape: str, peer: str) -> float:
        return float(win[(shape, peer)]["ms"])

    def wt(shape: str, peer: str) -> str:
        return f"{float(win[(shape, peer)]['tflops']):.0f}"

    lines = [
        f"{gpu}, bf16, {versions}; measured {date} at commit `{commit}`. Every peer ran in the same process "
        f"as ours on the same inputs; each time is the median of 3 rounds of `triton.testing.do_bench`. "
        f"Files: [`{rel}/`]({rel}).",
        "",
        "| shape | ours | vLLM 0.33 | FlexAttention | floor |",
        "|---|---|---|---|---|",
    ]
    pr = win[("pr", "ours")]
    lines.append(
        f"| narrow window: {pr['n']} tokens, {pr['heads']} heads, D {pr['head_dim']}, window ±64, not causal "
        f"| **{_ms(w('pr', 'ours_graph'))} ms** (CUDA graph; {_ms(w('pr', 'ours'))} eager) "
        f"| {_ms(w('pr', 'vllm'))} ms | {_ms(w('pr', 'flex'))} ms | {_ms(float(pr['floor_ms']))} ms |"
    )
    llm = win[("llm", "ours")]
    lines.append(
        f"| wide window: {llm['n']} tokens, {llm['heads']}/{llm['kv_heads']} heads, D {llm['head_dim']}, "
        f"causal, left {llm['window'].split('/')[0]} "
        f"| **{_ms(w('llm', 'ours'))} ms** ({wt('llm', 'ours')} TFLOP/s) "
        f"| {_ms(w('llm', 'vllm'))} ms | {_ms(w('llm', 'flex'))} ms | {_ms(float(llm['floor_ms']))} ms |"
    )
    names = {"llama": "prefix llama: 8 x (4096 cached + 4096 new), 32/8 heads, D 128",
             "qwen": "prefix qwen-hybrid: 4 x (8192 cached + 2048 new), 16/2 heads, D 256"}  # fmt: skip
    for shape, label in names.items():
        rows = [r for r in pre if r["shape"] == shape]
        pages = sorted({int(r["page"]) for r in rows if r["page"] != "-"})
        vllm = [float(r["ms"]) for r in rows if r["peer"] == "vllm"]
        flex = [float(r["ms"]) for r in rows if r["peer"] == "flex"]
        floor = float(rows[0]["floor_ms"])
        for peer, layout in (("ours_nhd", "NHD cache"), ("ours", "vLLM's split cache")):
            ms = [float(r["ms"]) for r in rows if r["peer"] == peer]
            tf = [float(r["tflops"]) for r in rows if r["peer"] == peer]
            lines.append(
                f"| {label}, {layout}, {len(pages)} page sizes "
                f"| **{_span(ms)} ms** ({min(tf):.0f}-{max(tf):.0f} TFLOP/s; slowest page "
                f"{max(ms) / min(ms):.3f}x the fastest) | {_span(vllm)} ms (split cache) "
                f"| {_span(flex)} ms (contiguous K/V) | {_ms(floor)} ms |"
            )
    lines.append("")
    lines.append(f"Page sizes of the prefix rows: {', '.join(map(str, pages))} tokens.")
    window_png = sorted(folder.glob("window_prefill*.png"))
    prefix_png = sorted(folder.glob("prefix_prefill*.png"))
    lines.append("")
    if window_png:
        p = window_png[0].relative_to(ROOT).as_posix()
        lines.append(f"![window-prefill time against N at a fixed window, with the peers]({p})")
    if prefix_png:
        p = prefix_png[0].relative_to(ROOT).as_posix()
        lines.append(f"![prefix-prefill time per page size, both cache layouts, with the peers]({p})")
    return "\n".join(lines) + "\n"


def block(folder: Path) -> str:
    rel = folder.resolve().relative_to(ROOT / "bench" / "results").as_posix()
    return f"<!-- results:begin folder={rel} -->\n{table(folder)}{END}"


def readme_folder(text: str) -> Path:
    m = BEGIN.search(text)
    if not m:
        raise SystemExit("README.md has no <!-- results:begin folder=... --> marker")
    return ROOT / "bench" / "results" / m.group(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, nargs="?", help="default: the folder the README's marker names")
    ap.add_argument("--write", action="store_true", help="replace the README's results block")
    args = ap.parse_args()
    text = README.read_text()
    folder = args.folder or readme_folder(text)
    new = block(folder)
    if not args.write:
        print(new)
        return 0
    start = BEGIN.search(text)
    end = text.index(END, start.start()) + len(END)
    README.write_text(text[: start.start()] + new + text[end:])
    print(f"README.md: results block from {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
