"""Property: round-robin writes go to ``(cursor + arange(n)) % cap`` and keep the last ``cap`` items."""

from __future__ import annotations

import collections

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdreplay.core import ListStorage, ReplayBuffer


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1, 12),
    ops=st.lists(st.tuples(st.sampled_from(["extend", "add"]), st.integers(0, 30)),
                 min_size=1, max_size=12),
)
def test_round_robin_slots_and_contents_match_a_deque(cap, ops):
    rb = ReplayBuffer(storage=ListStorage(cap))
    model: collections.deque[int] = collections.deque(maxlen=cap)  # the last `cap` items
    cursor = 0
    written = 0
    for op, n in ops:
        items = list(range(written, written + (n if op == "extend" else 1)))
        if op == "extend":
            slots = rb.extend(items)
            assert slots.dtype == torch.long
            assert slots.tolist() == ((cursor + torch.arange(len(items))) % cap).tolist()
        else:
            assert rb.add(items[0]) == cursor % cap
        model.extend(items)
        written += len(items)
        cursor = (cursor + len(items)) % cap
        assert rb.write_count == written and rb.writer.cursor == cursor
        assert len(rb) == len(model)
        # item k lives at slot k % cap; reading slots in order gives the deque rotated
        assert rb[:] == sorted(model, key=lambda k: k % cap)
