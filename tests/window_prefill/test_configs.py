"""window_prefill.configs: the static table is complete, every config fits its architecture's shared
memory (LDS on AMD) by the static estimate, and the lookup is cached and autotune-free."""

from __future__ import annotations

import pytest
import torch

from window_prefill import configs
from window_prefill.configs import (
    ARCHS,
    CONFIGS,
    DTYPE_CLASSES,
    HEAD_DIM_BUCKETS,
    SHARED_MEMORY_LIMIT,
    Config,
    get_config,
    shared_memory_bytes,
)

DTYPE_OF_CLASS = {"16bit": torch.bfloat16, "fp32": torch.float32}


def test_table_complete():
    for arch in ARCHS:
        for hd in HEAD_DIM_BUCKETS:
            for dc in DTYPE_CLASSES:
                for causal in (False, True):
                    cfg = CONFIGS[(arch, hd, dc, causal)]
                    assert isinstance(cfg, Config)
                    for tile in (cfg.block_m, cfg.block_n):
                        assert tile >= 16 and tile & (tile - 1) == 0, cfg
                    assert cfg.num_warps in (1, 2, 4, 8, 16) and cfg.num_stages >= 1


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_amd_configs_fit_lds(arch):
    limit = SHARED_MEMORY_LIMIT[arch]
    for (a, hd, dc, _causal), cfg in CONFIGS.items():
        if a != arch:
            continue
        assert cfg.num_stages in (1, 2), f"{arch} wants 1-2 stages: {cfg}"
        # the widest head dim of the bucket is the worst case
        need = shared_memory_bytes(cfg, hd, DTYPE_OF_CLASS[dc])
        assert need <= limit, f"{arch} hd<={hd} {dc}: {cfg} needs {need} B > {limit} B of LDS"


@pytest.mark.parametrize("arch", ["sm90", "sm80", "default"])
def test_nvidia_configs_fit_shared_memory(arch):
    for (a, hd, dc, _causal), cfg in CONFIGS.items():
        if a == arch:
            need = shared_memory_bytes(cfg, hd, DTYPE_OF_CLASS[dc])
            assert need <= SHARED_MEMORY_LIMIT[arch], f"{arch} hd<={hd} {dc}: {cfg} needs {need} B"


def test_shared_memory_estimate():
    cfg = Config(128, 64, 8, 3)
    # Q 128x128 + 3 stages of K and V 64x128, 2 bytes each
    assert shared_memory_bytes(cfg, 128, torch.float16) == 2 * 128 * (128 + 2 * 64 * 3)
    # non-power-of-two head dims are padded
    assert shared_memory_bytes(cfg, 80, torch.float16) == shared_memory_bytes(cfg, 128, torch.float16)
    assert shared_memory_bytes(Config(64, 32, 4, 1), 64, torch.float32) == 4 * 64 * (64 + 2 * 32)


def test_lookup():
    assert configs.head_dim_bucket(32) == 64 and configs.head_dim_bucket(80) == 128
    assert configs.head_dim_bucket(192) == 256
    with pytest.raises(ValueError, match="head_dim"):
        configs.head_dim_bucket(320)
    assert get_config(96, torch.float16, True, "sm90") == CONFIGS[("sm90", 128, "16bit", True)]
    assert get_config(96, torch.float16, True, "sm75") == CONFIGS[("default", 128, "16bit", True)]
    assert get_config(64, torch.float32, False, "interpreter").block_m == 16
    before = get_config.cache_info().hits
    get_config(96, torch.float16, True, "sm90")
    assert get_config.cache_info().hits == before + 1
    assert configs.detect_arch("cpu") == "interpreter"
    assert configs.block_d(80) == 128 and configs.block_d(8) == 16


def test_wide_offsets_change_only_their_class():
    """64-bit token offsets at head 256 on sm90 (16-bit) run 64 query rows; every other field, and every
    other class, keeps the table's entry (the Gluon flag included)."""
    for causal in (False, True):
        for head in (192, 256):
            base = get_config(head, torch.bfloat16, causal, "sm90")
            wide = configs.wide_offsets_config(base, head, torch.bfloat16, "sm90")
            assert wide == base._replace(block_m=64)
        for head, dtype, arch in ((128, torch.float16, "sm90"), (256, torch.float32, "sm90"),
                                  (256, torch.float16, "sm100"), (256, torch.float16, "sm80")):  # fmt: skip
            base = get_config(head, dtype, causal, arch)
            assert configs.wide_offsets_config(base, head, dtype, arch) == base
