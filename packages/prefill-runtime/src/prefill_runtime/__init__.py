"""prefill-runtime: what the prefill kernel packages (window-prefill, prefix-prefill) share at run time.

Host side: :func:`prime_triton` (Triton's one-time process setup, side by side, before a first
launch; :func:`prime_triton_in_background`: the same started early by an engine, opt-in),
:func:`ptxas_launch_options` (a ptxas flag for one kernel's launches), :func:`hook_compiles`
(a kernel's cold compile with its launcher built alongside; ``free_waits_flag``: the PTX without
the barriers Triton puts before a Gluon consumer's waits, :func:`drop_wait_barriers`;
``desc_fix_flag``: no-swizzle wgmma descriptors without a base offset,
:func:`clear_noswizzle_base_offsets`),
:class:`CompileTiers` (a quick-compiling form of a kernel for first calls, the full form compiled
in the background),
:func:`softcap_form` (which soft-capping form a kernel compiles for a device),
:func:`check_lse` (the softmax log-sum-exp buffer of a ``return_lse=True`` call), and for the Gluon
kernels :func:`gluon_token_rows` / :func:`gluon_descriptor` (TMA descriptors; Gluon imported on first
use) and :func:`gluon_try_launch` (a launch that falls back on failure). Device side
(``@triton.jit``, import from :mod:`prefill_runtime.device`): ``tanh`` (hardware or exp2 form). Gluon
(Triton >= 3.5, sm90, import from :mod:`prefill_runtime.gluon`): ``consumer`` (the compute warpgroup of
both packages' warp-specialised kernels), ``softmax_step``, ``zero_v_rows``, ``free_wait``.

Versioned on its own: the kernel packages pin ``prefill-runtime>=0.4,<1``.
"""

__version__ = "0.10.0"

from prefill_runtime.host import (
    CompileTiers,
    check_lse,
    clear_noswizzle_base_offsets,
    drop_wait_barriers,
    gluon_applies,
    gluon_descriptor,
    gluon_token_rows,
    gluon_try_launch,
    hook_compiles,
    prime_triton,
    prime_triton_in_background,
    ptxas_launch_options,
    softcap_form,
)
from prefill_runtime.plan import LaunchPlan

__all__ = [
    "CompileTiers",
    "LaunchPlan",
    "__version__",
    "check_lse",
    "clear_noswizzle_base_offsets",
    "drop_wait_barriers",
    "gluon_applies",
    "gluon_descriptor",
    "gluon_token_rows",
    "gluon_try_launch",
    "hook_compiles",
    "prime_triton",
    "prime_triton_in_background",
    "ptxas_launch_options",
    "softcap_form",
]
