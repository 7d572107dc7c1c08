"""vLLM stand-ins for the tests: no vLLM code is part of this repository.

* ``tree/vllm``: a ``vllm`` package of small modules of our own, the parts of vLLM that the plugins
  (``prefix_prefill.vllm_plugin``, ``window_prefill.vllm_plugin``) and vLLM 0.33's Triton attention
  files touch: ``vllm.logger`` (configures the ``vllm`` logger as vLLM does), ``vllm.platforms``,
  ``vllm.triton_utils``, ``vllm._custom_ops``, ``vllm.plugins.load_general_plugins``, and the kernel
  modules as recording float64-reference stand-ins with modules that import their functions by name.
  The plugin tests run on it from a plain clone.
* :mod:`vllm_standin.prepare`: the same tree with vLLM 0.33's own files (from the wheel) over the
  kernel stand-ins, in a git-ignored folder, for the drop-in tests.
* :func:`imported`: a ``vllm`` tree importable and freshly imported for a while.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_standin.prepare import TREE, assemble, source

__all__ = ["TREE", "assemble", "imported", "source", "vllm_modules"]


def vllm_modules() -> list[str]:
    """The names of the imported ``vllm`` modules."""
    return [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]


@contextmanager
def imported(root: Path) -> Iterator[Path]:
    """``root``'s ``vllm`` package importable, with no ``vllm`` module imported yet; afterwards
    ``sys.modules`` holds the ``vllm`` modules it held before and ``sys.path`` is as it was."""
    saved = {n: sys.modules.pop(n) for n in vllm_modules()}
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        for n in vllm_modules():
            del sys.modules[n]
        sys.modules.update(saved)
        sys.path.remove(str(root))
