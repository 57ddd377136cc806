"""The test helpers of ``tdreplay.core.testing`` that other packages' tests rely on."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from tdreplay.core.testing import _frozen, assert_same, id_rows, read_id_rows


class Row(NamedTuple):
    layout: int
    blob: torch.Tensor


def test_a_frozen_named_tuple_keeps_its_class_and_copies_its_tensors():
    # a storage's state may hold named tuples (a compressed storage's rows): the snapshot
    # rebuilds them from their fields, as copies a later write cannot change
    row = Row(3, torch.zeros(2))
    frozen = _frozen([row, (1, torch.ones(1))])
    row.blob[0] = 7.0
    assert type(frozen[0]) is Row and frozen[0].layout == 3
    assert frozen[0].blob.tolist() == [0.0, 0.0]
    assert_same(frozen[1], (1, torch.ones(1)))


def test_read_id_rows_finds_a_row_with_an_entry_of_another_write():
    rows = id_rows([5, 6, 7])
    assert read_id_rows(rows) == [5, 6, 7] and read_id_rows(id_rows([])[:0]) == []
    rows["next", "z"][2] = 60
    with pytest.raises(AssertionError, match=r"different writes: \[7\]"):
        read_id_rows(rows)
