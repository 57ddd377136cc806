"""An ensemble across ``os.fork`` (tdreplay.core.fork_safety): forked while other threads
sample it and write its members, the child gets it between two calls, its locks free."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import TensorDictReplayBuffer, fork_safety
from tdreplay.core.fork_safety import LeftLockedByFork
from tdreplay.core.testing import in_forked_child
from tdreplay.ensembles import ReplayBufferEnsemble
from tdreplay.storages import LazyTensorStorage

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def td(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict({"obs": ids.float(), "copy": ids.float()}, [n])


def ensemble(prefetch: int = 0) -> ReplayBufferEnsemble:
    members = [TensorDictReplayBuffer(storage=LazyTensorStorage(1000)) for _ in range(2)]
    for rb in members:
        rb.extend(td(100))
    return ReplayBufferEnsemble(*members, batch_size=8, sample_from_all=True,
                                prefetch=prefetch)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_fork_while_threads_sample_and_extend_gives_a_working_child(prefetch: int) -> None:
    ens = ensemble(prefetch)
    stop = threading.Event()

    def sample_forever() -> None:
        while not stop.is_set():
            ens.sample()

    def extend_forever() -> None:
        start = 100
        while not stop.is_set():
            ens[0].extend(td(10, start % 900))
            start += 10

    threads = [threading.Thread(target=sample_forever), threading.Thread(target=extend_forever)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(5):
            def child() -> tuple[tuple[int, ...], bool, int]:
                batch = ens.sample()
                whole = bool((batch["obs"] == batch["copy"]).all())
                return tuple(batch.shape), whole, len(ens[0]) % 10
            assert in_forked_child(child) == ((2, 4), True, 0)
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_an_ensemble_lock_kept_past_the_wait_refuses_in_the_child(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_safety, "FORK_WAIT_S", 0.1)
    ens = ensemble()
    inside, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with ens.locked():
            inside.set()
            let_go.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(10)

    def child() -> list[str]:
        seen = []
        for call in (ens.sample, ens[1].sample):
            try:
                call(4)
                seen.append("sampled")
            except LeftLockedByFork as exc:
                seen.append(str(exc).split(" was ")[0])
        return seen

    try:
        assert in_forked_child(child) == ["This replay buffer ensemble", "This replay buffer"]
    finally:
        let_go.set()
        holder.join()
    assert ens.sample().shape == (2, 4)
