"""BurnInTransform: recurrent states refreshed from the first steps of sampled sequences."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import BurnInTransform


class _RunningSum(torch.nn.Module):
    """next hidden[t] = hidden[0] + obs[0] + ... + obs[t] (a recurrence easy to check)."""

    def __init__(self, with_parameter: bool = False) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(())) if with_parameter else None

    def forward(self, obs: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        out = hidden[..., :1, :] + obs.cumsum(-2)
        return out if self.scale is None else out * self.scale


def _module(with_parameter: bool = False) -> TensorDictModule:
    return TensorDictModule(_RunningSum(with_parameter), in_keys=["obs", "hidden"],
                            out_keys=[("next", "hidden")])


def _sequences(batch: int = 2, steps: int = 6) -> TensorDict:
    obs = torch.arange(batch * steps, dtype=torch.float32).reshape(batch, steps, 1)
    return TensorDict({"obs": obs, "hidden": torch.full((batch, steps, 1), -1.0),
                       "step": torch.arange(steps).expand(batch, steps)}, [batch, steps])


def test_the_rest_of_each_sequence_starts_from_the_burnt_in_state():
    td = _sequences()
    out = BurnInTransform(_module(), burn_in=4)(td)
    assert out.batch_size == (2, 2)
    assert out["step"].tolist() == [[4, 5], [4, 5]]
    # row b: -1 + obs[b, 0..3]; the later step keeps its stored state
    assert out["hidden"].squeeze(-1).tolist() == [[-1 + 0 + 1 + 2 + 3, -1],
                                                  [-1 + 6 + 7 + 8 + 9, -1]]
    assert td["hidden"].unique().tolist() == [-1.0]  # the input is not changed in place


def test_a_single_sequence_and_burn_in_zero():
    td = _sequences(1, 5)[0]  # [5]: one sequence along its only batch dim
    out = BurnInTransform(_module(), burn_in=2)(td)
    assert out.batch_size == (3,) and out["hidden"].squeeze(-1).tolist() == [0.0, -1, -1]
    assert BurnInTransform(_module(), burn_in=0)(td) is td


def test_a_state_not_stored_is_created_zero_past_the_first_step():
    td = _sequences().exclude("hidden")
    module = TensorDictModule(lambda obs: obs.cumsum(-2), in_keys=["obs"],
                              out_keys=[("next", "memory")])
    out = BurnInTransform(module, burn_in=3)(td)
    assert out["memory"].squeeze(-1).tolist() == [[3.0, 0.0, 0.0], [6 + 7 + 8.0, 0.0, 0.0]]


def test_out_keys_default_to_the_modules_next_entries_and_next_is_stripped_with_a_warning():
    assert BurnInTransform(_module(), burn_in=1).out_keys == ["hidden"]
    with pytest.warns(UserWarning, match="read as 'hidden'"):
        t = BurnInTransform(_module(), burn_in=1, out_keys=[("next", "hidden")])
    assert t.out_keys == ["hidden"] and t.in_keys == ["obs", "hidden"]


def test_modules_run_without_gradients():
    out = BurnInTransform(_module(with_parameter=True), burn_in=3)(_sequences())
    assert not out["hidden"].requires_grad


def test_in_a_buffer_samples_of_sequences_are_burnt_in():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), batch_size=3)
    rb.append_transform(BurnInTransform(_module(), burn_in=4))
    rb.extend(_sequences(4, 6))
    sample = rb.sample()
    assert sample.batch_size == (3, 2)
    first = sample["index"][:, 0]  # the item each sequence came from
    expected = -1 + 4 * (6 * first.float()) + (0 + 1 + 2 + 3)
    torch.testing.assert_close(sample["hidden"][:, 0, 0], expected)
    stored = rb.storage.get(torch.arange(4))  # (rb[:] runs the buffer's transforms too)
    assert stored["hidden"].unique().tolist() == [-1.0]  # the storage keeps its values


def test_sequences_not_longer_than_burn_in_are_refused():
    with pytest.raises(ValueError, match="burn_in=6"):
        BurnInTransform(_module(), burn_in=6)(_sequences(2, 6))


@pytest.mark.parametrize("modules", [[], torch.nn.Linear(2, 2), [lambda td: td], "gru"])
def test_modules_must_be_tensordict_modules(modules):
    with pytest.raises(TypeError, match="modules") as info:
        BurnInTransform(modules, burn_in=1)
    assert isinstance(info.value, ValueError)  # what TorchRL raises


@pytest.mark.parametrize("burn_in", [-1, 1.5, True, "2"])
def test_burn_in_must_be_a_non_negative_int(burn_in):
    with pytest.raises(ValueError, match="burn_in"):
        BurnInTransform(_module(), burn_in=burn_in)


def test_a_module_that_writes_no_next_state_is_named():
    t = BurnInTransform(_module(), burn_in=2, out_keys=["memory"])
    with pytest.raises(KeyError, match="memory"):
        t(_sequences())
