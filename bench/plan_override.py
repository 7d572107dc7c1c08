"""Benchmarks' A/B settings: a kernel package's launch plans with constexprs overridden.

Every kernel and setting a call runs is the package's plan (``prefix_prefill.plan.plan``,
``window_prefill.plan.plan``); an A/B run times the plan against the same plan with some constexprs
changed (``--set NAME=VALUE``), never module globals::

    with overridden("prefix_prefill", {"PREFETCH_IDS": False}, kernel="triton"):
        prefix_prefill(...)

``kernel``: override only plans of this kernel (``"triton"``, ``"gluon-nhd"``, ``"gluon-hnd"``,
``"gluon-split"``; ``"gluon"``: every Gluon plan, ``"gluon-tma"``: the NHD/HND kernel's two plans, one
compiled kernel); None: every plan that has the constexpr. Values are Python literals (``NAME=0``, ``True``,
``3``). The packages' caches of call signatures and compiled variants are keyed by the plan, so the two
settings never share an entry; the signature and plan caches are cleared on entry and exit.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util

# kernel filters that name several plans
_KERNELS = {"gluon-tma": ("gluon-nhd", "gluon-hnd")}


def _matches(kernel: str, planned: str) -> bool:
    """Whether the filter ``kernel`` (module docstring) names the plan of kernel ``planned``."""
    return planned == kernel or planned.startswith(f"{kernel}-") or planned in _KERNELS.get(kernel, ())


def parse_sets(sets: list[str], error) -> dict:
    """``["NAME=VALUE", ...]`` as a dict of constexprs (``error(msg)`` for a malformed one)."""
    out = {}
    for kv in sets:
        name, sep, val = kv.partition("=")
        if not sep or not name.isidentifier():
            error(f"--set {kv!r}: expected NAME=VALUE, NAME a kernel constexpr (e.g. PREFETCH_IDS=0)")
        try:
            out[name] = ast.literal_eval(val)
        except (ValueError, SyntaxError):
            error(f"--set {kv!r}: VALUE must be a Python literal (0, 1, True, 64, ...)")
    return out


def _launch_module(package: str):
    return importlib.import_module(f"{package}.launch")


def _clear_caches(package: str) -> None:
    """Forget the package's cached call signatures and plans (made with the other setting)."""
    cached = getattr(_launch_module(package), "_planned", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
    for name in (f"{package}.signatures", f"{package}.api"):  # (where each package keeps them)
        if importlib.util.find_spec(name) is not None:
            seen = getattr(importlib.import_module(name), "SEEN", None)
            if seen is not None:
                seen.clear()


@contextlib.contextmanager
def overridden(package: str, consts: dict, kernel: str | None = None):
    """Inside the block, ``package``'s plans with ``consts`` merged in (see the module docstring)."""
    if not consts:
        yield
        return
    launch = _launch_module(package)
    real = launch.plan

    def plan(problem):
        chosen = real(problem)
        if kernel is not None and not _matches(kernel, chosen.kernel):
            return chosen
        names = dict(chosen.constexprs)
        change = {n: v for n, v in consts.items() if n in names}
        return chosen.replace(constexprs=change) if change else chosen

    _clear_caches(package)
    launch.plan = plan
    try:
        yield
    finally:
        launch.plan = real
        _clear_caches(package)
