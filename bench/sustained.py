"""Sustained runs: each implementation called back to back for some seconds while ``nvidia-smi`` samples
the SM clock and the board power (``bench/anchors.py --sustained``).

Under these kernels the card runs at its power cap, so its SM clock depends on how much energy an
implementation spends per cycle: two kernels with the same cycle count can differ in time by their
clocks. ``do_bench``'s short bursts (100 ms) start below the cap's steady state; an engine that
prefills for seconds does not. Each result: the time per call over the run (CUDA events around all
calls past the first 20), the median SM clock and power of the samples past the first quarter of the
run (the ramp), and their product, the call's cost in millions of SM cycles (``mcycles``): equal
``mcycles`` with different ``ms`` means a clock difference, not a schedule one.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import time

_QUERY = ("nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50")
_WARM_CALLS = 20  # calls before the timed span (the clock ramp, lazy allocations)
_SYNC_EVERY = 8  # calls between host syncs: the queue stays a few calls deep, never empty


def available() -> bool:
    """Whether the samples can be taken (``nvidia-smi`` on the PATH)."""
    return shutil.which("nvidia-smi") is not None


def run(fn, seconds: float) -> dict:
    """Call ``fn`` back to back for ``seconds``: ``{"sust_ms", "sm_mhz", "power_w", "mcycles",
    "samples"}`` (module docstring)."""
    import torch

    fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(_QUERY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0, n = time.perf_counter(), 0
    try:
        while n <= _WARM_CALLS or time.perf_counter() - t0 < seconds:
            if n == _WARM_CALLS:
                start.record()
            fn()
            n += 1
            if n % _SYNC_EVERY == 0:
                torch.cuda.synchronize()
        stop.record()
        torch.cuda.synchronize()
    finally:
        smi.terminate()
    text = smi.communicate()[0]
    samples = []
    for line in text.strip().splitlines():
        parts = line.split(",")
        try:
            samples.append((float(parts[0]), float(parts[1])))
        except (ValueError, IndexError):
            continue
    samples = samples[len(samples) // 4 :]
    ms = start.elapsed_time(stop) / (n - _WARM_CALLS)
    mhz = statistics.median(s[0] for s in samples) if samples else float("nan")
    watts = statistics.median(s[1] for s in samples) if samples else float("nan")
    return {
        "sust_ms": ms,
        "sm_mhz": mhz,
        "power_w": watts,
        "mcycles": ms * mhz / 1e3,
        "samples": len(samples),
    }


def median_runs(runs: list[dict]) -> dict:
    """The field-wise medians of several :func:`run` results (``samples`` summed)."""
    out = {k: statistics.median(r[k] for r in runs) for k in ("sust_ms", "sm_mhz", "power_w", "mcycles")}
    out["samples"] = sum(r["samples"] for r in runs)
    return out
