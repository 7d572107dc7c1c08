"""Former home of the launcher, now :mod:`window_prefill.launch`: this name is that module itself (its
kernels, plan runner and state), for callers outside the package that still import it
(``tests/integration/test_vllm_plugin.py``, ``tests/prefill_runtime/test_runtime.py``). The public
functions live in :mod:`window_prefill.api`."""

import sys

from window_prefill import launch

sys.modules[__name__] = launch
