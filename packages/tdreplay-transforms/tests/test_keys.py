"""RenameTransform, SelectTransform, ExcludeTransform: values, nested keys, inverse, errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.core.testing import assert_same, buffer_snapshot
from tdreplay.samplers import SamplerWithoutReplacement
from tdreplay.storages import LazyTensorStorage
from tdreplay.transforms import ExcludeTransform, RenameTransform, SelectTransform


def sample_td() -> TensorDict:
    return TensorDict({
        "obs": torch.arange(4.0),
        ("some", "key"): torch.arange(4.0) * 10,
        "another_key": torch.ones(4),
        ("next", "obs"): torch.arange(1.0, 5.0),
        ("next", "reward"): torch.ones(4, 1),
        ("next", "done"): torch.zeros(4, 1, dtype=torch.bool),
        "done": torch.zeros(4, 1, dtype=torch.bool),
    }, [4])


def leaf_keys(td) -> set:
    return set(td.keys(True, True))


class TestRename:
    def test_nested_to_root_and_back(self):
        td = sample_td()
        expected = td["some", "key"].clone()
        out = RenameTransform([("some", "key")], ["renamed"])(td)
        assert torch.equal(out["renamed"], expected)
        assert ("some", "key") not in leaf_keys(out)
        out = RenameTransform(["renamed"], [("deep", "er", "key")])(out)
        assert torch.equal(out["deep", "er", "key"], expected)

    def test_swap_names(self):
        td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
        out = RenameTransform(["a", "b"], ["b", "a"])(td)
        assert out["a"].tolist() == [1.0, 1.0] and out["b"].tolist() == [0.0, 0.0]

    def test_create_copy_keeps_original(self):
        out = RenameTransform(["obs"], ["obs_copy"], create_copy=True)(sample_td())
        assert torch.equal(out["obs"], out["obs_copy"])

    def test_inverse_renames_on_the_write_side_only(self):
        # TorchRL's direction: out_keys_inv (the name in the extended data) -> in_keys_inv
        t = RenameTransform(["x"], ["y"], in_keys_inv=["stored_obs"], out_keys_inv=["obs"])
        td = sample_td()
        written = t.inv(td)
        assert "stored_obs" in written.keys() and "obs" not in written.keys()
        assert torch.equal(written["stored_obs"], torch.arange(4.0))
        assert "obs" in td.keys() and "stored_obs" not in td.keys()  # caller's data untouched
        no_inv = RenameTransform(["obs"], ["o"])
        td2 = sample_td()
        assert no_inv.inv(td2) is td2

    def test_a_rename_on_extend_only_as_torchrl(self):
        # it was refused ("needs at least one key to rename") though in_keys_inv names one
        t = RenameTransform(in_keys=[], out_keys=[], in_keys_inv=["stored"], out_keys_inv=["obs"])
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4), transform=t)
        rb.extend(sample_td())
        stored = rb.storage[:]
        assert "stored" in stored.keys() and "obs" not in stored.keys()
        assert torch.equal(stored["stored"], torch.arange(4.0))
        assert "obs" not in rb.sample(2).keys()  # (no rename on sample)

    def test_no_key_to_rename_is_a_no_op_as_torchrl(self):
        # it was refused ("needs at least one key to rename"); TorchRL's renames nothing
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(4),
                                    transform=RenameTransform(in_keys=[], out_keys=[]))
        rb.extend(sample_td())
        assert sorted(rb.storage[:].keys()) == sorted(sample_td().keys())
        assert sorted(rb.sample(2).keys()) == sorted([*sample_td().keys(), "index"])

    def test_missing_key_names_it_and_changes_nothing(self):
        td = sample_td()
        before = leaf_keys(td)
        with pytest.raises(KeyError, match="missing_key"):
            RenameTransform(["obs", "missing_key"], ["o", "m"])(td)
        assert leaf_keys(td) == before

    def test_mismatched_key_lists(self):
        with pytest.raises(ValueError, match="same length"):
            RenameTransform(["a", "b"], ["c"])
        with pytest.raises(ValueError, match="same length"):
            RenameTransform(["a"], ["b"], in_keys_inv=["c", "d"], out_keys_inv=["e"])
        with pytest.raises(ValueError, match="out_keys_inv"):
            RenameTransform(["a"], ["b"], in_keys_inv=["c"])

    def test_inverse_in_a_buffer_as_torchrl(self):
        t = RenameTransform(["obs"], ["observation"], in_keys_inv=["action"],
                            out_keys_inv=["action_env"])
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), transform=t, batch_size=2,
                                    sampler=SamplerWithoutReplacement(shuffle=False))
        # data as TorchRL expects it: only the extend-side name
        rb.extend(TensorDict({"obs": torch.zeros(2), "action_env": torch.tensor([7.0, 8.0])},
                             [2]))
        stored = rb.storage[:]
        assert leaf_keys(stored.exclude("index")) == {"obs", "action"}
        assert stored["action"].tolist() == [7.0, 8.0]
        s = rb.sample()
        assert leaf_keys(s.exclude("index")) == {"observation", "action"}
        # both names present: the extend-side entry replaces the other, as in TorchRL
        rb.extend(TensorDict({"obs": torch.zeros(2), "action": torch.tensor([1.0, 2.0]),
                              "action_env": torch.tensor([3.0, 4.0])}, [2]))
        assert rb.storage[:]["action"].tolist() == [7.0, 8.0, 3.0, 4.0]
        assert "action_env" not in rb.storage[:].keys()

    def test_inverse_missing_key_refused_buffer_unchanged(self):
        t = RenameTransform(["obs"], ["o"], in_keys_inv=["action"], out_keys_inv=["action_env"])
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), transform=t)
        rb.extend(TensorDict({"obs": torch.zeros(2), "action_env": torch.ones(2)}, [2]))
        before = buffer_snapshot(rb)
        data = TensorDict({"obs": torch.zeros(2), "action": torch.ones(2)}, [2])
        with pytest.raises(KeyError, match="action_env"):
            rb.extend(data)
        assert_same(buffer_snapshot(rb), before, "buffer state")
        assert set(data.keys()) == {"obs", "action"}

    def test_inverse_create_copy_keeps_the_extend_side_name(self):
        t = RenameTransform(["obs"], ["o"], in_keys_inv=["action"], out_keys_inv=["action_env"],
                            create_copy=True)
        written = t.inv(TensorDict({"action_env": torch.tensor([5.0, 6.0])}, [2]))
        assert written["action"].tolist() == [5.0, 6.0]
        assert written["action_env"].tolist() == [5.0, 6.0]

    def test_not_a_tensordict(self):
        with pytest.raises(TypeError, match="RenameTransform"):
            RenameTransform(["a"], ["b"])(torch.zeros(2))


class TestSelectExclude:
    def test_exclude_nested_and_missing(self):
        out = ExcludeTransform(("next", "obs"), "another_key", "not_there")(sample_td())
        assert ("next", "obs") not in leaf_keys(out) and "another_key" not in out.keys()
        assert ("next", "reward") in leaf_keys(out) and "obs" in out.keys()

    def test_exclude_list_argument_and_subtree(self):
        out = ExcludeTransform(["next", "some"])(sample_td())
        assert leaf_keys(out) == {"obs", "another_key", "done"}

    def test_select_keeps_root_reward_and_done_only(self):
        # TorchRL (no parent env) keeps the selected keys plus root "reward" and "done"
        td = sample_td()
        td["reward"] = torch.full((4, 1), 2.0)
        td["terminated"] = torch.zeros(4, 1, dtype=torch.bool)
        td["next", "truncated"] = torch.zeros(4, 1, dtype=torch.bool)
        out = SelectTransform("obs", ("some", "key"))(td.clone())
        assert leaf_keys(out) == {"obs", ("some", "key"), "reward", "done"}
        assert torch.equal(out["reward"], torch.full((4, 1), 2.0))
        out = SelectTransform("obs", keep_dones=False)(td.clone())
        assert leaf_keys(out) == {"obs", "reward"}
        out = SelectTransform("obs", keep_rewards=False)(td.clone())
        assert leaf_keys(out) == {"obs", "done"}
        out = SelectTransform("obs", keep_rewards=False, keep_dones=False)(td.clone())
        assert leaf_keys(out) == {"obs"}
        assert torch.equal(out["obs"], torch.arange(4.0))
        # "next" entries are kept when named (a sub-TensorDict as a whole)
        out = SelectTransform(("next", "reward"))(td.clone())
        assert leaf_keys(out) == {("next", "reward"), "reward", "done"}
        out = SelectTransform("next")(td.clone())
        assert leaf_keys(out) == {("next", "obs"), ("next", "reward"), ("next", "done"),
                                  ("next", "truncated"), "reward", "done"}

    def test_select_missing_key(self):
        # TorchRL selects non-strictly: a missing selected key is ignored
        out = SelectTransform("obs", "nope")(sample_td())
        assert leaf_keys(out) == {"obs", "done"}
        assert torch.equal(out["obs"], torch.arange(4.0))
        td = sample_td()
        before = leaf_keys(td)
        with pytest.raises(KeyError, match="nope"):
            SelectTransform("obs", "nope", strict=True)(td)
        assert leaf_keys(td) == before
        assert SelectTransform("obs").strict is False

    def test_select_in_a_buffer(self):
        td = TensorDict({"obs": torch.arange(4.0), "act": torch.zeros(4),
                         "terminated": torch.zeros(4, 1, dtype=torch.bool),
                         ("next", "obs"): torch.ones(4), ("next", "reward"): torch.ones(4, 1),
                         ("next", "done"): torch.zeros(4, 1, dtype=torch.bool),
                         ("next", "terminated"): torch.zeros(4, 1, dtype=torch.bool)}, [4])
        for t in (SelectTransform("obs"), SelectTransform("obs", "value")):
            rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), transform=t,
                                        sampler=SamplerWithoutReplacement(shuffle=False),
                                        batch_size=4)
            rb.extend(td)
            s = rb.sample()
            assert leaf_keys(s.exclude("index")) == {"obs"}
            assert s["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
            assert leaf_keys(rb.storage[:].exclude("index")) == leaf_keys(td)  # stored whole
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2,
                                    transform=SelectTransform("obs", "value", strict=True))
        rb.extend(td)
        with pytest.raises(KeyError, match="value"):
            rb.sample()

    @pytest.mark.parametrize("cls", [SelectTransform, ExcludeTransform])
    def test_inverse_flag_moves_filtering_to_the_write_side(self, cls):
        t = cls("obs", inverse=True)
        td = sample_td()
        assert t(td) is td
        filtered = t.inv(sample_td())
        assert ("obs" in filtered.keys()) == (cls is SelectTransform)
        assert len(leaf_keys(filtered)) < len(leaf_keys(td))
        plain = cls("obs")
        assert plain.inv(td) is td

    def test_needs_keys(self):
        with pytest.raises(ValueError, match="at least one key"):
            SelectTransform()
        with pytest.raises(ValueError, match="at least one key"):
            ExcludeTransform()
