"""StalenessAwareSampler: freshness weighting, the staleness gate, state and bad input."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer, TensorDictReplayBuffer
from tdreplay.samplers import StalenessAwareSampler
from tdreplay.storages import LazyTensorStorage


def _rb(sampler: StalenessAwareSampler, versions: list[int], size: int = 100,
        per_version: int = 10) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(size), sampler=sampler, batch_size=8)
    rb.set_rng(torch.Generator().manual_seed(0))
    for v in versions:
        rb.extend(TensorDict({"obs": torch.full((per_version,), float(v)),
                              "policy_version": torch.full((per_version,), v)}, [per_version]))
    return rb


def test_gate_and_info() -> None:
    s = StalenessAwareSampler(max_staleness=1)
    rb = _rb(s, [0, 1, 2, 3])
    s.consumer_version = 3
    for _ in range(10):
        batch = rb.sample()
        assert set(batch["policy_version"].tolist()) <= {2, 3}
        assert torch.equal(batch["staleness"], 3.0 - batch["policy_version"].float())
    index, info = s.sample(rb.storage, 20)   # all 20 fresh items, each once
    assert sorted(index.tolist()) == list(range(20, 40))
    assert info["staleness"].dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_large_versions_gate_exactly(dtype: torch.dtype) -> None:
    # versions above 2**24 (a frame counter): float32 rounded 10**8 + k to 10**8, so every item
    # had staleness 0 and the cutoff let all of them through
    base = 10**8
    s = StalenessAwareSampler(max_staleness=2)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=s, batch_size=6)
    rb.extend(TensorDict({"policy_version": torch.arange(base, base + 8, dtype=dtype)}, [8]))
    s.consumer_version = base + 7
    assert s.versions(rb.storage).tolist() == list(range(base, base + 8))
    index, info = s.sample(rb.storage, 3)  # the three fresh items, each once
    assert sorted(index.tolist()) == [5, 6, 7]
    assert sorted(info["staleness"].tolist()) == [0.0, 1.0, 2.0]
    assert info["staleness"].dtype == torch.float32


def test_weighting_prefers_fresh() -> None:
    s = StalenessAwareSampler(staleness_weight_fn=lambda st: (st == 0).float() * 9 + 1)
    rb = _rb(s, [0, 5], size=20)
    s.consumer_version = 5
    fresh = sum(int((rb.sample()["policy_version"] == 5).sum()) for _ in range(50))
    assert fresh > 0.7 * 50 * 8


def test_more_draws_than_items_with_replacement() -> None:
    s = StalenessAwareSampler()
    rb = _rb(s, [0], per_version=3)
    index, _ = s.sample(rb.storage, 10)
    assert index.shape == (10,) and set(index.tolist()) <= {0, 1, 2}


def test_zero_weight_items_are_never_drawn() -> None:
    # 3 of 10 fresh-enough items have a positive weight: with a batch of 2, distinct items
    # among them; with a batch of 8, repeats of them (never an item of weight 0)
    s = StalenessAwareSampler(max_staleness=2, staleness_weight_fn=lambda st: (st == 1).float())
    rb = _rb(s, [0, 1, 2], per_version=3)
    s.consumer_version = 2  # staleness 2, 1, 0: only version 1 (slots 3-5) weighs
    for _ in range(20):
        index, info = s.sample(rb.storage, 2)
        assert set(index.tolist()) <= {3, 4, 5} and index.unique().numel() == 2
        index, info = s.sample(rb.storage, 8)
        assert set(index.tolist()) <= {3, 4, 5} and (info["staleness"] == 1).all()


def test_all_zero_weights_name_the_cause() -> None:
    s = StalenessAwareSampler(max_staleness=1, staleness_weight_fn=lambda st: st * 0.0)
    rb = _rb(s, [0, 1, 2])
    s.consumer_version = 2
    with pytest.raises(ValueError, match=r"weight 0 to every one of the 20 items .*max_staleness=1"):
        rb.sample()
    assert (s.consumer_version, s.max_staleness) == (2, 1)  # nothing changed


def test_list_storage_works() -> None:
    s = StalenessAwareSampler()
    rb = ReplayBuffer(storage=ListStorage(10), sampler=s)
    rb.extend(TensorDict({"policy_version": torch.tensor([1, 2, 3])}, [3]))
    s.consumer_version = 3
    assert s.sample(rb.storage, 2)[1]["staleness"].tolist() in ([0.0, 1.0], [1.0, 0.0],
                                                                 [2.0, 0.0], [0.0, 2.0],
                                                                 [1.0, 2.0], [2.0, 1.0])


def test_errors() -> None:
    s = StalenessAwareSampler(max_staleness=0)
    rb = _rb(s, [0])
    s.consumer_version = 5
    with pytest.raises(RuntimeError, match="max_staleness=0"):
        rb.sample()
    no_key = TensorDictReplayBuffer(storage=LazyTensorStorage(10),
                                    sampler=StalenessAwareSampler(), batch_size=2)
    no_key.extend(TensorDict({"obs": torch.zeros(3)}, [3]))
    with pytest.raises(KeyError, match="policy_version"):
        no_key.sample()
    bad_fn = StalenessAwareSampler(staleness_weight_fn=lambda st: -torch.ones_like(st))
    with pytest.raises(ValueError, match="staleness_weight_fn"):
        _rb(bad_fn, [0]).sample()
    with pytest.raises(TypeError, match="staleness_weight_fn"):
        StalenessAwareSampler(staleness_weight_fn=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessAwareSampler(max_staleness=-2)
    with pytest.raises(TypeError, match="consumer_version"):
        s.consumer_version = 1.5  # type: ignore[assignment]
    assert s.consumer_version == 5


def test_state_round_trip(tmp_path: Path) -> None:
    s = StalenessAwareSampler(max_staleness=7)
    rb = _rb(s, [0, 1])
    s.consumer_version = 4
    s.increment_consumer_version()
    state = s.state_dict()
    assert state == {"consumer_version": 5, "max_staleness": 7}
    other = StalenessAwareSampler()
    other.load_state_dict(state)
    assert (other.consumer_version, other.max_staleness) == (5, 7)
    for bad in ({"consumer_version": -1, "max_staleness": 1}, {"consumer_version": 1},
                {"consumer_version": "x", "max_staleness": 1}):
        with pytest.raises(ValueError):
            other.load_state_dict(bad)
    assert (other.consumer_version, other.max_staleness) == (5, 7)
    rb.dumps(tmp_path)
    restored = _rb(StalenessAwareSampler(), [])
    restored.loads(tmp_path)
    assert restored.sampler.state_dict() == state and len(restored) == 20


def test_threads_sample_while_version_moves() -> None:
    s = StalenessAwareSampler(max_staleness=100)
    rb = _rb(s, [0, 1, 2])
    errors: list[BaseException] = []

    def learner() -> None:
        try:
            for _ in range(50):
                rb.sample()
                with rb.locked():
                    s.increment_consumer_version()
        except BaseException as err:  # pragma: no cover
            errors.append(err)

    def collector() -> None:
        for v in range(3, 30):
            rb.extend(TensorDict({"obs": torch.zeros(2), "policy_version": torch.full((2,), v)},
                                 [2]))

    threads = [threading.Thread(target=learner), threading.Thread(target=collector)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and s.consumer_version == 50
