"""RenameTransform, SelectTransform, ExcludeTransform: values, nested keys, inverse, errors."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

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
        t = RenameTransform(["x"], ["y"], in_keys_inv=["obs"], out_keys_inv=["stored_obs"])
        td = sample_td()
        written = t.inv(td)
        assert "stored_obs" in written.keys() and "obs" not in written.keys()
        assert "obs" in td.keys() and "stored_obs" not in td.keys()  # caller's data untouched
        no_inv = RenameTransform(["obs"], ["o"])
        td2 = sample_td()
        assert no_inv.inv(td2) is td2

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

    def test_select_keeps_rewards_and_dones(self):
        out = SelectTransform("obs", ("some", "key"))(sample_td())
        assert leaf_keys(out) == {"obs", ("some", "key"), ("next", "reward"), ("next", "done"),
                                  "done"}
        out = SelectTransform("obs", keep_rewards=False, keep_dones=False)(sample_td())
        assert leaf_keys(out) == {"obs"}
        assert torch.equal(out["obs"], torch.arange(4.0))

    def test_select_missing_key(self):
        with pytest.raises(KeyError, match="nope"):
            SelectTransform("obs", "nope")(sample_td())
        out = SelectTransform("obs", "nope", strict=False, keep_rewards=False,
                              keep_dones=False)(sample_td())
        assert leaf_keys(out) == {"obs"}

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
