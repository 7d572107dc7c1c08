"""prefill-runtime: what the prefill kernel packages (window-prefill, prefix-prefill) share at run time.

Modules, each owning one concern (every public name below is importable from ``prefill_runtime``):

* :mod:`~prefill_runtime.triton_setup`: :func:`prime_triton` (Triton's one-time process setup, side by
  side, before a first launch), :func:`prime_triton_in_background` (the same started early by an
  engine, opt-in), :func:`ptxas_launch_options` (a ptxas flag for one kernel's launches).
* :mod:`~prefill_runtime.compiler_hooks`: :func:`hook_compiles` (a kernel's compile with its launcher
  built alongside, and its compile options: LLVM at O0, the PTX pass
  :func:`clear_noswizzle_base_offsets`), contained to the hooked kernels.
* :mod:`~prefill_runtime.gluon_support`: :func:`gluon_supported` (may the Gluon kernels run on this
  Triton: the allowlist :data:`VERIFIED_TRITON_VERSIONS`, env ``PREFILL_GLUON``).
* :mod:`~prefill_runtime.tiers`: :class:`CompileTiers` (a quick-compiling form of a kernel for first
  calls, the full form compiled in the background).
* :mod:`~prefill_runtime.checks`: :func:`softcap_form` (which soft-capping form a kernel compiles for a
  device), :func:`check_lse` (the softmax log-sum-exp buffer of a ``return_lse=True`` call),
  :func:`~prefill_runtime.checks.validate_requested` (``validate=True`` or ``PREFILL_VALIDATE=1``).
* :mod:`~prefill_runtime.fp8`: the fp8 dtypes, :func:`~prefill_runtime.fp8.check_fp8_supported` and the
  per-tensor scales as kernels read them (:func:`~prefill_runtime.fp8.scale_of`: a float's 1-element tensor
  made once per value and device).
* :mod:`~prefill_runtime.gluon_host`: the Gluon kernels' host side: :func:`gluon_applies`,
  :func:`~prefill_runtime.gluon_host.multiprocessors` (the persistent forms' grids),
  :func:`gluon_token_rows` / :func:`gluon_descriptor` (TMA descriptors; Gluon imported on first use),
  :func:`gluon_try_launch` (a launch that falls back on failure).
* :mod:`~prefill_runtime.status`: the status bits a kernel reports on malformed device metadata
  (``status=``), :func:`status_names`, :func:`new_status`, :func:`check_status`.
* Device side (``@triton.jit``, :mod:`prefill_runtime.device`): ``tanh`` (hardware or exp2 form);
  :mod:`prefill_runtime.bounds`: the clamps that keep a kernel inside the tensors whatever the
  metadata says, its status report and the zeroing of rows no program computes (Gluon twin:
  :mod:`prefill_runtime.gluon_bounds`).
* Gluon device code (sm90, :mod:`prefill_runtime.gluon`, imported only by the kernels' Gluon
  modules): ``consumer`` (the compute warpgroup of both packages' warp-specialised kernels),
  ``softmax_step``, ``score_terms``, ``segment_terms`` (an fp8 segment's scales per key block),
  ``zero_v_rows``, ``allocate_rings``, ``allocate_q_empty``.
* :mod:`~prefill_runtime.plan`: :class:`LaunchPlan` (the plan both kernel packages' ``plan()`` returns).
* :mod:`~prefill_runtime.compiled_launch`: :class:`~prefill_runtime.compiled_launch.CompiledLaunches` (a
  kernel's compiled variants launched directly, by the caller's key; their frames, the C-launcher
  arguments of a warm call with per-call slots).
* :mod:`~prefill_runtime.signatures`: the call-signature key parts both public APIs build,
  :class:`~prefill_runtime.signatures.Seen` (the bounded table of signatures seen before) and
  :func:`~prefill_runtime.signatures.bump_versions` (the version counters of a launch's outputs).
* :mod:`~prefill_runtime.host`: the names this module held before the split, re-exported.

Versioned on its own: window-prefill pins ``prefill-runtime>=0.28.0,<1``, prefix-prefill ``>=0.29.0,<1``.
"""

__version__ = "0.29.0"

from prefill_runtime.checks import check_lse, softcap_form
from prefill_runtime.compiler_hooks import clear_noswizzle_base_offsets, hook_compiles
from prefill_runtime.gluon_host import gluon_applies, gluon_descriptor, gluon_token_rows, gluon_try_launch
from prefill_runtime.gluon_support import VERIFIED_TRITON_VERSIONS, gluon_supported
from prefill_runtime.plan import LaunchPlan
from prefill_runtime.status import check_status, new_status, status_names
from prefill_runtime.tiers import CompileTiers
from prefill_runtime.triton_setup import prime_triton, prime_triton_in_background, ptxas_launch_options

__all__ = [
    "VERIFIED_TRITON_VERSIONS",
    "CompileTiers",
    "LaunchPlan",
    "__version__",
    "check_lse",
    "check_status",
    "clear_noswizzle_base_offsets",
    "gluon_applies",
    "gluon_descriptor",
    "gluon_supported",
    "gluon_token_rows",
    "gluon_try_launch",
    "hook_compiles",
    "new_status",
    "prime_triton",
    "prime_triton_in_background",
    "ptxas_launch_options",
    "softcap_form",
    "status_names",
]
