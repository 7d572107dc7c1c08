"""A Gluon kernel's block loops in SASS, offline: what one iteration issues, ours beside FlashAttention-3's.

    python bench/sass_loops.py --ours window-causal-d128 [--ours window-causal-d128-persistent]
        [--fa3 .wheels/fa3_fwd-0.0.3-*.whl [--fa3-kernel SUBSTRING]] [--out FILE.md]

No GPU: our forms are compiled for sm90 with the installed Triton (the test suite's offline compile helpers,
``tests/conftest.py`` and ``tests/window_prefill/wp_util.py``); FA3's kernel is read from its wheel's cubins
(Triton's bundled ``cuobjdump``; ``c++filt`` picks the kernel by its demangled name, by default the bf16
head-128 causal forward of 128 x 128 tiles, ``IntraWGOverlap``, no varlen, no paging, no PackGQA).

A loop is a conditional backward branch (a plain one is an out-of-line wait's retry); a block loop is an
innermost loop that issues wgmma (``HGMMA``: a persistent kernel's tile loop holds them too). For each
block loop the table gives its instructions, the op counts of an attention block (the softmax's
``MUFU.EX2`` / ``FFMA`` / ``FMNMX`` / ``FADD``, O's rescale ``FMUL``, P's ``F2FP``, ``SHFL``, barriers)
and ``ex2_beside_pv``: the most ``MUFU.EX2`` between a wait for ``S_j`` (``WARPGROUP.DEPBAR.LE gsb0,
0x1``) and the next wait for all (``0x0``, the one for ``P_{j-1} V_{j-1}``), the softmax that runs while
the warpgroup's own P @ V does (NOTES entry 136: ptxas may hoist that wait). A loop with runtime branches
(our masked blocks) is counted whole.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_package_paths  # noqa: E402

add_package_paths()

OPS = ("HGMMA", "MUFU.EX2", "FFMA", "FMNMX", "FADD", "FMUL", "F2FP", "SHFL", "BAR.SYNC", "BAR.ARV", "SYNCS")
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BACK_EDGE = re.compile(r"^@!?P\d+\s+BRA\s+(?:!?P\d+, )?0x([0-9a-f]+)$")  # conditional (a plain BRA: a retry)
FA3_KERNEL = (
    "cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float, "
    "cutlass::arch::Sm90, true, false, false, false, false, false, false, true, true, false, false, false>"
)
# our forms: name -> the arguments of wp_util's compile_wp (head, lse, then keywords)
OURS = {
    "window-causal-d128": "128, False, IS_CAUSAL=True, HAS_LEFT=False, HAS_RIGHT=False",
    "window-causal-d128-persistent": "128, False, IS_CAUSAL=True, HAS_LEFT=False, HAS_RIGHT=False, "
    "PERSISTENT=True",
    "window-causal-d256": "256, False, IS_CAUSAL=True, HAS_LEFT=False, HAS_RIGHT=False",
}


def _cuobjdump() -> str:
    """Triton's bundled cuobjdump (sm90 SASS without a CUDA toolkit)."""
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def instructions(sass: str) -> list[tuple[int, str]]:
    """``(address, instruction)`` of every SASS line of ``cuobjdump -sass``'s text (predicates kept)."""
    return [(int(m.group(1), 16), m.group(2)) for m in LINE.finditer(sass)]


def block_loops(sass: str) -> list[dict]:
    """The block loops of ``sass`` (a function's SASS): per loop its address range, instruction count, the
    :data:`OPS` counts and ``ex2_beside_pv`` (module docstring)."""
    ins = instructions(sass)
    loops, spans = [], []
    for addr, text in ins:
        m = BACK_EDGE.search(text)
        if not m or int(m.group(1), 16) >= addr:
            continue
        start = int(m.group(1), 16)
        body = [t for a, t in ins if start <= a <= addr]
        if not any("HGMMA" in t for t in body):
            continue
        row = {"range": f"{start:#x}-{addr:#x}", "instructions": len(body)}
        row.update({op: sum(op in t for t in body) for op in OPS})
        best = 0
        for k, t in enumerate(body):
            if "DEPBAR.LE gsb0, 0x1" in t:
                waits = [e for e in range(k + 1, len(body)) if "DEPBAR.LE gsb0, 0x0" in body[e]]
                end = waits[0] if waits else len(body)
                best = max(best, sum("MUFU.EX2" in b for b in body[k:end]))
        row["ex2_beside_pv"] = best
        loops.append(row)
        spans.append((start, addr))

    def outer(lo: int, hi: int) -> bool:  # another loop lies inside [lo, hi]
        return any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in spans)

    return [r for r, span in zip(loops, spans, strict=True) if not outer(*span)]


def ours_sass(form: str) -> str:
    """The SASS of one of our Gluon forms (:data:`OURS`), compiled for sm90 in a fresh interpreter."""
    script = (
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT / 'tests')!r}, {str(ROOT / 'tests' / 'window_prefill')!r}]\n"
        "from conftest import GLUON_COMPILE_PREAMBLE\n"
        "from wp_util import WP_COMPILE_HEAD\n"
        "ns = {}\n"
        "exec(GLUON_COMPILE_PREAMBLE + WP_COMPILE_HEAD, ns)\n"
        f"kernel = ns['compile_wp']({OURS[form]})\n"
        "open(sys.argv[1], 'wb').write(kernel.asm['cubin'])\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "k.cubin")
        env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        r = subprocess.run(
            [sys.executable, "-c", script, str(cubin)], env=env, capture_output=True, text=True
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-3000:])
        return subprocess.run(
            [_cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True
        ).stdout


def fa3_sass(wheel: Path, kernel: str) -> tuple[str, str]:
    """``(demangled name, SASS)`` of the first sm90 kernel of FA3's wheel whose demangled name holds
    ``kernel``."""
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            so = next(n for n in z.namelist() if n.endswith(".so"))
            z.extract(so, tmp)
        subprocess.run([_cuobjdump(), "-xelf", "all", str(Path(tmp, so))], cwd=tmp, capture_output=True,
                       check=True)  # fmt: skip
        for cubin in sorted(Path(tmp).glob("*sm_90*.cubin")):
            names = sorted(set(re.findall(rb"_ZN7cutlass13device_kernel[0-9A-Za-z_]+", cubin.read_bytes())))
            for name in names:
                plain = subprocess.run(
                    ["c++filt"], input=name.decode(), capture_output=True, text=True
                ).stdout
                if kernel in plain and "Sm90" in plain:
                    sass = subprocess.run([_cuobjdump(), "-sass", "-fun", name.decode(), str(cubin)],
                                          capture_output=True, text=True, check=True).stdout  # fmt: skip
                    return plain.strip(), sass
    raise SystemExit(f"no sm90 kernel of {wheel} matches {kernel!r}")


def table(rows: list[tuple[str, dict]]) -> str:
    """The block loops as a Markdown table, one row per (kernel, loop)."""
    cols = ["instructions", *OPS, "ex2_beside_pv"]
    out = ["| kernel | loop | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for name, loop in rows:
        out.append(f"| {name} | {loop['range']} | " + " | ".join(str(loop[c]) for c in cols) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", action="append", default=[], choices=sorted(OURS), help="our forms to compile")
    ap.add_argument("--fa3", type=Path, help="FA3's wheel (fa3_fwd-*.whl)")
    ap.add_argument("--fa3-kernel", default=FA3_KERNEL, help="a substring of the FA3 kernel's demangled name")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args()
    rows = []
    for form in args.ours:
        rows += [(form, loop) for loop in block_loops(ours_sass(form))]
    if args.fa3:
        name, sass = fa3_sass(args.fa3, args.fa3_kernel)
        print(f"FA3 kernel: {name[:400]}")
        rows += [("fa3", loop) for loop in block_loops(sass)]
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
