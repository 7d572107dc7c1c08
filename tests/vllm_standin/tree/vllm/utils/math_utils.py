"""Stand-in for ``vllm.utils.math_utils`` (tests only)."""

import math

RCP_LN2 = 1 / math.log(2)
