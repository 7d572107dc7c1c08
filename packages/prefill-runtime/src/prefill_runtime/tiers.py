"""Tiered compiles: a quick-compiling form of a kernel for first calls, the full form compiled behind it.

Owns :class:`CompileTiers` (the per-key state: quick form, full form compiling in a daemon thread,
ready, loaded, failed) and the CUDA-graph-capture check it needs. It only chooses which of two
caller-given launches runs; the caller guarantees both forms compute the same output bit for bit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch


def _capturing() -> bool:
    """Is the current CUDA stream capturing a graph? (False without CUDA)"""
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


class CompileTiers:
    """Two forms of one kernel that compute the same output bit for bit: a *quick* form that compiles
    in less time (the first calls) and a *full* form that runs faster. The first call of a key (one
    compiled specialization: the caller's constexprs, dtype, optional arguments) launches the quick
    form, then a daemon thread compiles the full form (Triton's ``warmup``: compile, no launch); every
    call after that finished launches the full form. Why: a cold first call then waits for the quick
    form's compile only, while later calls get the full form's speed.

    ``launch(full, warmup)`` runs (``warmup``: only compiles) one form; its exceptions reach the caller
    (a failed background compile keeps the key on the quick form). The first launch of the full form
    loads its module, so inside a CUDA graph capture a key whose full form has not been launched yet
    stays on the quick form; call :meth:`finish` (e.g. an engine before it captures its graphs) to wait
    for the background compiles."""

    _LOADED = "loaded"  # full form compiled and launched once (its module loaded)
    _READY = "ready"  # full form compiled
    _FAILED = "failed"  # full form failed to compile: quick form for good

    def __init__(self) -> None:
        self._state: dict[object, object] = {}  # key -> Thread (compiling) | _READY | _LOADED | _FAILED
        self._lock = threading.Lock()

    def run(self, key: object, launch: Callable[[bool, bool], object]) -> bool:
        """Launch ``key``'s full form if compiled, else its quick form (starting the full form's
        background compile on the first call). Returns whether the full form ran."""
        state = self._state.get(key)
        if state is self._LOADED or (state is self._READY and not _capturing()):
            launch(True, False)
            if state is self._READY:
                self._state[key] = self._LOADED
            return True
        launch(False, False)
        if state is None:
            with self._lock:
                if key not in self._state:
                    thread = threading.Thread(
                        target=self._compile, args=(key, launch), daemon=True, name="prefill-full-compile"
                    )
                    self._state[key] = thread
                    thread.start()
        return False

    def _compile(self, key: object, launch: Callable[[bool, bool], object]) -> None:
        try:
            launch(True, True)
            state = self._READY
        except Exception:
            state = self._FAILED
        with self._lock:
            self._state[key] = state

    def pending(self) -> int:
        """How many full forms are compiling now."""
        return sum(isinstance(s, threading.Thread) for s in list(self._state.values()))

    def finish(self, timeout: float | None = None) -> bool:
        """Wait for the full forms compiling now (at most ``timeout`` seconds in all); True when none
        is left compiling."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for state in list(self._state.values()):
            if isinstance(state, threading.Thread):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                state.join(left)
        return self.pending() == 0

    def clear(self) -> None:
        """Forget every key (tests); compiles in flight finish on their own."""
        with self._lock:
            self._state.clear()
