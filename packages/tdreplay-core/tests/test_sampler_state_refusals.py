"""A bad SamplerWithoutReplacement state is refused before a buffer loads any part: the
storage and the writer stay as they were (before, the storage was replaced, then the sampler's
own load raised)."""

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer, SamplerWithoutReplacement
from tdreplay.core.checkpoint import CheckpointError


def make() -> ReplayBuffer:
    return ReplayBuffer(storage=ListStorage(10), sampler=SamplerWithoutReplacement(),
                        batch_size=2)


def saved_state() -> dict:
    src = make()
    src.extend(list(range(8)))
    src.sample()
    return src.state_dict()


BAD = {
    "pos below the epoch": ("pos", -1),
    "pos past the epoch": ("pos", 99),
    "pos not an int": ("pos", 1.5),
    "perm not a tensor": ("perm", None),
    "perm of floats": ("perm", torch.arange(8.0)),
    "perm of two dims": ("perm", torch.arange(8).reshape(2, 4)),
    "perm naming a slot past its epoch": ("perm", torch.tensor([0, 1, 2, 3, 4, 5, 6, 10**6])),
    "perm naming a negative slot": ("perm", torch.tensor([0, 1, 2, 3, 4, 5, 6, -3])),
    "perm repeating a slot": ("perm", torch.tensor([0, 1, 2, 3, 4, 5, 6, 6])),
    "flag not a bool": ("ran_out", "no"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_load_state_dict_refuses_before_anything_changes(case):
    key, value = BAD[case]
    state = saved_state()
    state["_sampler"][key] = value
    rb = make()
    rb.extend([-1, -2, -3])
    with pytest.raises(ValueError, match=f"SamplerWithoutReplacement state_dict '{key}'"):
        rb.load_state_dict(state)
    assert rb[:] == [-1, -2, -3] and len(rb) == 3 and rb.write_count == 3


def test_loads_refuses_a_checkpoint_with_a_bad_sampler_state(tmp_path, monkeypatch):
    src = make()
    src.extend(list(range(8)))
    src.sample()
    good = src.sampler.state_dict
    monkeypatch.setattr(src.sampler, "state_dict", lambda: {**good(), "pos": 99})
    src.dumps(tmp_path)  # a consistent checkpoint (CRCs match) holding a bad sampler state
    rb = make()
    rb.extend([-1, -2, -3])
    with pytest.raises(CheckpointError, match="'pos'=99"):
        rb.loads(tmp_path)
    assert rb[:] == [-1, -2, -3] and rb.write_count == 3


def test_a_good_state_still_loads():
    state = saved_state()
    rb = make()
    rb.load_state_dict(state)
    assert len(rb) == 8 and rb.sampler.state_dict()["pos"] == state["_sampler"]["pos"]
