"""Device functions (``@triton.jit``) shared by the prefill kernels."""

import triton
import triton.language as tl


@triton.jit
def tanh(x, FAST: tl.constexpr = False):
    """tanh of a float32 tile. ``FAST`` (NVIDIA GPUs of compute capability 7.5+ only; see
    :func:`prefill_runtime.softcap_form`): the hardware ``tanh.approx.f32`` (one MUFU op; relative
    error ~2**-11, what FlashAttention's and FlashInfer's soft-capping use). Otherwise through exp2
    (every backend and the interpreter have it): 1 - 2 / (e^(2x) + 1), two MUFU ops (exp2 and the
    divide's reciprocal) and a few FMAs; +-inf at the ends give exactly +-1, a NaN stays NaN."""
    if FAST:
        return tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)  # 2 * log2(e)
