"""Opt-in autotuning (``PREFIX_PREFILL_AUTOTUNE=1``); the default call path never comes here.

On the first call for a table key it times a few candidate configs on that call's own inputs
(host syncs: do not enable it while capturing a CUDA graph), keeps the fastest, and stores it in
``~/.cache/prefix_prefill/autotune.json`` (directory overridable with ``PREFIX_PREFILL_CACHE_DIR``)
under ``"<device name>|triton <version>|<arch>,<head bucket>,<dtype class>,<page class>"``. The key
never holds a sequence length or a batch size, so the stored choice serves every later call.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
import triton

from prefix_prefill.configs import SHARED_MEMORY_BUDGET, KernelConfig

_MEMO: dict[str, KernelConfig] = {}


def autotune_enabled() -> bool:
    return os.environ.get("PREFIX_PREFILL_AUTOTUNE", "0") == "1"


def cache_file() -> Path:
    root = os.environ.get("PREFIX_PREFILL_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "prefix_prefill"
    return base / "autotune.json"


def candidates(arch: str, head_size: int, dtype_bytes: int) -> list[KernelConfig]:
    """A small grid, filtered by the static shared-memory model for ``arch``."""
    from prefix_prefill.configs import shared_memory_bytes

    budget = SHARED_MEMORY_BUDGET.get(arch, SHARED_MEMORY_BUDGET["default"])
    out = []
    for bm in (64, 128):
        for bn in (32, 64):
            for w in (4, 8):
                for s in (1, 2, 3):
                    cfg = KernelConfig(bm, bn, bn, w, s)
                    if shared_memory_bytes(cfg, head_size, dtype_bytes) <= budget:
                        out.append(cfg)
    return out


def _entry_key(device: torch.device, key: tuple) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return f"{name}|triton {triton.__version__}|" + ",".join(str(k) for k in key)


def _load() -> dict[str, dict[str, int]]:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def tuned_config(
    device: torch.device,
    key: tuple,
    run: Callable[[KernelConfig], None],
    default: KernelConfig,
    cands: list[KernelConfig],
) -> KernelConfig:
    """Best of ``cands`` (and ``default``) for ``key`` on ``device``: from memory, the JSON file,
    or by timing ``run(cfg)`` now. A candidate that fails to compile or launch is skipped."""
    ek = _entry_key(device, key)
    if ek in _MEMO:
        return _MEMO[ek]
    stored = _load().get(ek)
    if stored is not None:
        try:
            cfg = KernelConfig(**stored)
            _MEMO[ek] = cfg
            return cfg
        except TypeError:
            pass
    best, best_ms = default, float("inf")
    for cfg in [default, *[c for c in cands if c != default]]:
        try:
            ms = float(triton.testing.do_bench(lambda c=cfg: run(c), warmup=5, rep=20, return_mode="median"))
        except Exception:  # out of resources, unsupported tile on this device
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    _MEMO[ek] = best
    data = _load()
    data[ek] = best.as_dict()
    try:
        path = cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass
    return best
