"""Time each Triton compile stage of one kernel config, offline for sm_90a (no GPU needed).

Usage (same arguments as ``compile_report.py``; a fresh ``TRITON_CACHE_DIR`` each run)::

    TRITON_CACHE_DIR=$(mktemp -d) python bench/compile_stages.py prefix 128/128/128/8/3 --head-dim 128 \\
        --page 16 --tile-pages --two-page-bases --offsets32 --layout nhd

Prints ``total T s  ttir=.. ttgir=.. llir=.. ptx=.. cubin=..``: the stages of ``triton.compile``
(``cubin`` is ptxas); ``total`` minus their sum is the Python front end (AST -> TTIR) and caching.
What a cold first call pays for compilation (NOTES step 33); on a 2-core machine repeat it, the
noise is +-20%.
"""

from __future__ import annotations

import sys
import time

import compile_report
import triton
from triton.backends.nvidia.compiler import CUDABackend

_TIMES: dict[str, float] = {}
_ADD_STAGES = CUDABackend.add_stages


def _timed_stages(self, stages, options, *args, **kwargs):
    _ADD_STAGES(self, stages, options, *args, **kwargs)
    for name, fn in list(stages.items()):

        def wrap(src, md, fn=fn, name=name):
            t0 = time.perf_counter()
            out = fn(src, md)
            _TIMES[name] = _TIMES.get(name, 0.0) + time.perf_counter() - t0
            return out

        stages[name] = wrap


def _report(src, warps: int, stages: int, dump: str | None = None) -> str:
    t0 = time.perf_counter()
    target = compile_report.GPUTarget("cuda", 90, 32)
    triton.compile(src, target=target, options={"num_warps": warps, "num_stages": stages})
    total = time.perf_counter() - t0
    return f"total {total:.2f} s  " + "  ".join(f"{n}={v:.2f}" for n, v in _TIMES.items())


if __name__ == "__main__":
    CUDABackend.add_stages = _timed_stages
    compile_report.report = _report
    sys.argv[0] = "compile_report.py"
    compile_report.main()
