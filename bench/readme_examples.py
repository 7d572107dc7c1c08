"""Run the READMEs' Python examples (the top-level README and each package's), each ```python block in
a fresh interpreter (```py blocks are fragments, such as the body of a kernel, and are not run).

    python bench/readme_examples.py                          # every block (needs a GPU: some use "cuda")
    python bench/readme_examples.py --cpu                    # only the blocks that name no "cuda" device
    python bench/readme_examples.py --readme packages/window-prefill/README.md   # one README

``bash bench/gpu_session.sh readme`` runs the first form on the GPU machine; the CPU test suite
(``tests/integration/test_readme.py``) runs the blocks of the second form in its own process. The
packages' ``src/`` directories go on ``PYTHONPATH`` (no install needed). A block fails if it exits
non-zero or prints a failed ``attn_reference.compare``; exits 1 if a block fails, printing its output.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READMES = [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md"))]
# a printed attn_reference.Comparison whose verdict is FAIL
FAILED_COMPARISON = re.compile(r"rel_l2=\S+.*\) FAIL$", re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block of ``text``."""
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S):
        out.append((text.count("\n", 0, m.start()) + 2, m.group(1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="only the blocks without a cuda device")
    ap.add_argument("--readme", type=Path, nargs="+", default=READMES, help="default: every README")
    args = ap.parse_args()
    src = [str(p) for p in sorted(ROOT.glob("packages/*/src"))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*src, os.environ.get("PYTHONPATH", "")])}
    if args.cpu:
        env["TRITON_INTERPRET"] = "1"
    failed = ran = 0
    for readme in args.readme:
        name = readme.resolve().relative_to(ROOT)
        for line, code in python_blocks(readme.read_text()):
            if args.cpu and "cuda" in code:
                print(f"{name}:{line}: skipped (needs a GPU)")
                continue
            proc = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT
            )
            ran += 1
            if proc.returncode == 0 and not FAILED_COMPARISON.search(proc.stdout):
                print(f"{name}:{line}: ok")
            else:
                failed += 1
                print(f"{name}:{line}: FAILED\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    print(f"{ran - failed} passed, {failed} failed")
    return 1 if failed or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
