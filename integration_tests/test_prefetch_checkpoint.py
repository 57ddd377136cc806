"""A prefetching buffer over a tensor storage: ``dumps`` saves the batches it drew ahead as
tensors (``prefetch.pt``, loaded with ``weights_only=True``), and the restored buffer hands
them out first, as the saved one would have."""

import pytest
import torch
from tensordict import TensorDict

from tdreplay.data import (
    LazyMemmapStorage,
    LazyTensorStorage,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)


def rows(n: int) -> TensorDict:
    return TensorDict({"obs": torch.arange(n, dtype=torch.float32)[:, None].expand(n, 3),
                       "next": {"reward": torch.arange(n, dtype=torch.float32)}}, [n])


def make(kind: str, storage: type, prefetch: int) -> TensorDictReplayBuffer:
    if kind == "prioritized":
        return TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage(64),
                                                 batch_size=5, prefetch=prefetch)
    return TensorDictReplayBuffer(storage=storage(64), batch_size=5, prefetch=prefetch)


@pytest.mark.parametrize("storage", [LazyTensorStorage, LazyMemmapStorage])
@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_batches_drawn_ahead_are_saved_as_tensors_and_handed_out_first(tmp_path, kind,
                                                                       storage):
    torch.manual_seed(0)
    rb = make(kind, storage, prefetch=2)
    rb.extend(rows(40))
    rb.sample()  # two batches are now drawn ahead
    rb.dumps(tmp_path / "ckpt")
    saved = [p.name for p in (tmp_path / "ckpt").rglob("prefetch.*")]
    assert saved == ["prefetch.pt"]
    restored = make(kind, storage, prefetch=2)
    restored.loads(tmp_path / "ckpt")
    for _ in range(2):  # the two batches drawn ahead, in order
        mine, theirs = rb.sample(), restored.sample()
        assert torch.equal(mine["index"], theirs["index"])
        assert torch.equal(mine["obs"], theirs["obs"])
        assert torch.equal(mine["next", "reward"], theirs["next", "reward"])
        assert theirs["obs"][:, 0].tolist() == theirs["index"].float().tolist()
        if kind == "prioritized":
            assert torch.equal(mine["priority_weight"], theirs["priority_weight"])
