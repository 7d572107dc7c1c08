"""What both kernel packages' vLLM plugins do: replace one vLLM function with the package's drop-in.

Each package's ``vllm_plugin.register`` (its ``vllm.general_plugins`` entry point) calls
:func:`replace` with vLLM's module and function name and its own replacement. With the environment
variable ``PREFILL_KERNELS_VLLM=1`` and ``vllm`` importable, :func:`replace` sets the replacement on
vLLM's module and rebinds the name in every already-imported ``vllm.*`` module that imported vLLM's
function directly, logging one INFO line per process under the package's logger (a child of vLLM's
``vllm`` logger, made by vLLM's ``vllm.logger.init_logger`` where that imports, so it prints wherever
vLLM's own lines do). Calling it again is harmless; without the variable or without vLLM it returns at
once and imports nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

ENV_VAR = "PREFILL_KERNELS_VLLM"


def enabled() -> bool:
    """True when ``PREFILL_KERNELS_VLLM=1`` asks for the replacement."""
    return os.environ.get(ENV_VAR, "0") == "1"


def vllm_importable() -> bool:
    """Whether ``import vllm`` can work, without importing it."""
    if "vllm" in sys.modules:
        return sys.modules["vllm"] is not None
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def vllm_logger(name: str) -> logging.Logger:
    """vLLM's ``init_logger(name)`` where ``vllm.logger`` imports (called only once vLLM is known to be
    importable), else ``logging.getLogger(name)``: the same logger either way."""
    try:
        from vllm.logger import init_logger
    except Exception:  # an old or partial vLLM tree: the plain logger has the same name
        return logging.getLogger(name)
    return init_logger(name)


def rebind(name: str, original: Callable[..., Any], replacement: Callable[..., Any]) -> list[str]:
    """Point every imported ``vllm.*`` module's attribute ``name`` that is ``original`` at
    ``replacement``; the modules' names, sorted."""
    rebound = []
    for mod_name, module in list(sys.modules.items()):
        if not (mod_name == "vllm" or mod_name.startswith("vllm.")) or module is None:
            continue
        namespace = getattr(module, "__dict__", None)  # no getattr on the module: never trigger lazy imports
        if isinstance(namespace, dict) and namespace.get(name) is original:
            setattr(module, name, replacement)
            rebound.append(mod_name)
    return sorted(rebound)


def replace(
    package: str,
    target_module: str,
    target_name: str,
    replacement: Callable[..., Any],
    state: dict[str, Any],
    logger_name: str,
) -> None:
    """Replace ``target_module.target_name`` with ``replacement`` (module docstring). ``state``: the
    caller's process state, ``"original"`` (vLLM's function once replaced) and ``"logged"`` (the one
    info line written); ``package`` and ``logger_name`` name the log line's source."""
    if not enabled() or not vllm_importable():
        return
    logger = vllm_logger(logger_name)
    try:
        target = importlib.import_module(target_module)
    except ImportError as e:
        logger.warning("%s=1 but %s cannot be imported (%s): vLLM's kernel stays", ENV_VAR, target_module, e)
        return
    current = target.__dict__.get(target_name)
    if current is None:
        logger.warning("%s=1 but %s has no %s: vLLM's kernel stays", ENV_VAR, target_module, target_name)
        return
    if current is not replacement:
        state["original"] = current
    original = state.get("original")
    if original is None:  # already ours, set by hand before any register(): nothing to rebind
        return
    rebound = rebind(target_name, original, replacement)
    if not state.get("logged"):
        state["logged"] = True
        logger.info(
            "%s: %s.%s replaced by %s.vllm_plugin.%s (%s=1); rebound in: %s",
            package, target_module, target_name, package, target_name, ENV_VAR,
            ", ".join(rebound) or "nothing",
        )  # fmt: skip
