"""vLLM 0.33's own Triton attention files beside the stand-ins, for the drop-in tests.

``tests/integration/test_vllm_dropin.py`` runs vLLM 0.33's ``chunked_prefill_paged_decode`` and reads
vLLM's ``context_attention_fwd`` signatures. Their files come from the vllm wheel and are never part
of this repository: this script (standard library only) copies the stand-in ``vllm`` package of
``tests/vllm_standin/tree`` into a git-ignored folder and unpacks vLLM's three files over its
stand-ins::

    python tests/vllm_standin/prepare.py                      # pip download (336 MB) into the cache
    python tests/vllm_standin/prepare.py --wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

The folder (default ``.peers/vllm-0.33.0``, ignored by git) then serves the tests offline, e.g. on a GPU
machine without network: carry it along. The tests take vLLM's files from ``VLLM_WHEEL`` where it is set
(a wheel file, a folder holding one, or a folder with the unpacked ``vllm/v1/attention/ops/*.py``), else
from that folder, else from a wheel in the download cache (``$XDG_CACHE_HOME/prefill-kernels``, default
``~/.cache/prefill-kernels``), and skip with the reason when there is none. They assemble a fresh copy
of the stand-ins each session, so an older prepared folder serves as well.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

VERSION = "0.33.0"
OPS = "vllm/v1/attention/ops"
# vLLM's files the tests run or read (they replace the stand-ins of the same names)
FILES = tuple(
    f"{OPS}/{n}.py" for n in ("prefix_prefill", "triton_prefill_attention", "chunked_prefill_paged_decode")
)
TREE = Path(__file__).resolve().parent / "tree"
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEST = ROOT / ".peers" / f"vllm-{VERSION}"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefill-kernels"
MARK = "VLLM_SOURCE"  # in an assembled folder: what vLLM's files came from


def _wheels(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"vllm-{VERSION}-*.whl"))


def has_files(folder: Path) -> bool:
    """Whether ``folder`` holds vLLM's :data:`FILES` (unpacked, or assembled by :func:`assemble`)."""
    return all((folder / f).is_file() for f in FILES)


def source() -> tuple[Path | None, str]:
    """Where vLLM's files can come from, without network: ``(path, "")`` (an assembled folder, a wheel,
    or a folder with the unpacked files) or ``(None, why not)``."""
    given = os.environ.get("VLLM_WHEEL")
    if given:
        path = Path(given)
        if path.is_file() or (path.is_dir() and has_files(path)):
            return path, ""
        if path.is_dir() and _wheels(path):
            return _wheels(path)[-1], ""
        return None, f"VLLM_WHEEL={given} is neither a vllm {VERSION} wheel nor a folder holding one or {OPS}"
    if has_files(DEFAULT_DEST):
        return DEFAULT_DEST, ""
    if CACHE.is_dir() and _wheels(CACHE):
        return _wheels(CACHE)[-1], ""
    return None, (
        f"vLLM {VERSION}'s files are not here: run `python tests/vllm_standin/prepare.py` (pip downloads the "
        f"wheel) or set VLLM_WHEEL to the wheel or to a folder holding it"
    )


def assemble(src: Path, dest: Path) -> Path:
    """Fill ``dest`` anew with the stand-in tree and vLLM's :data:`FILES` from ``src`` (a wheel, or a
    folder with the unpacked files, which may be ``dest`` itself); returns ``dest``."""
    if src.is_file():
        with zipfile.ZipFile(src) as wheel:
            files = {name: wheel.read(name) for name in FILES}
    else:
        files = {name: (src / name).read_bytes() for name in FILES}
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(TREE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for name, data in files.items():
        (dest / name).write_bytes(data)
    (dest / MARK).write_text(f"{src}\n")
    return dest


def download(cache: Path = CACHE) -> Path:
    """``pip download --no-deps vllm==VERSION`` into ``cache`` (once); the wheel's path."""
    if not _wheels(cache):
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            f"vllm=={VERSION}",
            "-d",
            str(cache),
        ]
        subprocess.run(cmd, check=True)
    return _wheels(cache)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help="the vllm wheel (or a folder with the unpacked files)")
    parser.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"default {DEFAULT_DEST}")
    args = parser.parse_args()
    src = args.wheel
    if src is None:
        found, _ = source()
        src = found if found is not None else download()
    print(f"vLLM {VERSION}'s files from {src} with the stand-ins in {assemble(src, args.dest.resolve())}")


if __name__ == "__main__":
    main()
