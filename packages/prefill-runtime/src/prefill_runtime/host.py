"""The names ``prefill_runtime.host`` holds, re-exported from the modules that own them.

Kept so that code written against this module (tests, bench probes, docstrings of the kernel packages)
keeps working; new code imports from :mod:`prefill_runtime` or the owning module:
:mod:`~prefill_runtime.triton_setup`, :mod:`~prefill_runtime.compiler_hooks`,
:mod:`~prefill_runtime.tiers`, :mod:`~prefill_runtime.checks`, :mod:`~prefill_runtime.gluon_host`.
The re-exported state (the compile options' thread-locals) is the owning module's own object. Assigning
a name here (e.g. a test's monkeypatch) does not reach the owning module: patch that module instead.
"""

from prefill_runtime import *  # noqa: F403  (every public name of the package)
from prefill_runtime import __all__ as _public

# the private names tests and bench probes use when they compile with triton.compile themselves
from prefill_runtime.compiler_hooks import (  # noqa: F401
    _DESC_FIX,
    _LLVM_LEVEL,
    _LLVM_O0,
    _asm_wrapper,
    _build_launcher,
    _llvm_level_wrapper,
)

__all__ = [name for name in _public if name != "__version__"]
