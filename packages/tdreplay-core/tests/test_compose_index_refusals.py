"""``Compose[i]`` with a bad index: ``IndexError`` naming the index and the number of
transforms, or ``TypeError`` naming what ``Compose`` takes; ints and slices work as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdreplay.core import Compose


def compose() -> Compose:
    return Compose(lambda x: x + 1, lambda x: x * 2)


@pytest.mark.parametrize("index", [2, 5, -3, -4, np.int64(7)])
def test_index_out_of_range(index: int) -> None:
    with pytest.raises(IndexError, match=rf"index {int(index)} .* has 2 transforms"):
        compose()[index]


@pytest.mark.parametrize("index", [(0, 1), 1.0, "0", None, [0, 1], True, False,
                                   torch.tensor([0]), torch.tensor(0.0)])
def test_index_of_a_wrong_type(index: object) -> None:
    with pytest.raises(TypeError, match="Compose takes an int or a slice"):
        compose()[index]  # type: ignore[call-overload]


def test_good_indices_still_work() -> None:
    c = compose()
    assert c[0] is c.transforms[0] and c[-1] is c.transforms[1]
    assert c[np.int64(1)] is c.transforms[1] and c[torch.tensor(0)] is c.transforms[0]
    tail = c[1:]
    assert isinstance(tail, Compose) and len(tail) == 1 and tail(torch.tensor(3)).item() == 6
    assert len(c[5:]) == 0
