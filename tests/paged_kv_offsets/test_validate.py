"""Host-side block-table validator: dtype, rank, width, entries in range; names the first bad entry."""

import pytest
import torch

from paged_kv_offsets import validate_block_table


def test_accepts_valid_table_and_ignores_unused_entries():
    table = torch.tensor([[3, 1, -7], [0, 99, 99]], dtype=torch.int32)
    validate_block_table(table, torch.tensor([20, 16]), page_size=16, num_blocks=4)  # needs 2 and 1 pages


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16])
def test_rejects_dtype(dtype):
    with pytest.raises(TypeError, match="block_table"):
        validate_block_table(torch.zeros(1, 1, dtype=dtype), torch.tensor([1]), 16, 4)


def test_rejects_rank():
    with pytest.raises(ValueError, match="2-D"):
        validate_block_table(torch.zeros(4, dtype=torch.int32), torch.tensor([1]), 16, 4)


def test_rejects_too_narrow():
    with pytest.raises(ValueError, match=r"sequence 1 .* 3 pages"):
        validate_block_table(torch.zeros(2, 2, dtype=torch.int32), torch.tensor([5, 33]), 16, 4)


def test_rejects_out_of_range_entry():
    table = torch.tensor([[0, 1], [2, 4]], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 4 is outside \[0, 4\)"):
        validate_block_table(table, torch.tensor([32, 17]), 16, 4)
    table[1, 1] = -1
    with pytest.raises(ValueError, match=r"\[1, 1\] = -1"):
        validate_block_table(table, torch.tensor([32, 17]), 16, 4)


def test_rejects_too_few_rows_and_negative_lengths():
    with pytest.raises(ValueError, match="rows"):
        validate_block_table(torch.zeros(1, 4, dtype=torch.int32), torch.tensor([1, 1]), 16, 4)
    with pytest.raises(ValueError, match="negative"):
        validate_block_table(torch.zeros(2, 4, dtype=torch.int32), torch.tensor([1, -1]), 16, 4)
