"""Saving a prefetching buffer under ``rb.locked()`` while another thread samples: the save
returns (it hung for good: the sampling thread waited for its batch holding the prefetch
queue's lock, the batch's draw waited for the buffer's lock, and the save, holding that one,
waited for the queue's)."""

from __future__ import annotations

import copy
import pickle
import threading
import time

import pytest
import torch

from tdreplay.core import ReplayBuffer
from tdreplay.storages import LazyTensorStorage


@pytest.mark.parametrize("save", ["state_dict", "pickle", "deepcopy", "dumps"])
def test_a_save_under_the_lock_returns_while_a_sample_waits(save, tmp_path):
    rb = ReplayBuffer(storage=LazyTensorStorage(100), batch_size=4, prefetch=1)
    rb.extend(torch.arange(100.0))
    saves = {"state_dict": rb.state_dict, "pickle": lambda: pickle.dumps(rb),
             "deepcopy": lambda: copy.deepcopy(rb), "dumps": lambda: rb.dumps(tmp_path / "ckpt")}
    sampled, saved = [], []

    def scenario():  # (in a thread of its own: the test fails instead of hanging)
        with rb.locked():
            sampler = threading.Thread(target=lambda: sampled.append(rb.sample()), daemon=True)
            sampler.start()
            time.sleep(0.3)  # the sampler is waiting for its batch
            saves[save]()
            saved.append(True)
        sampler.join(20)

    thread = threading.Thread(target=scenario, daemon=True)
    thread.start()
    thread.join(30)
    assert saved == [True], f"{save} under the lock did not return"
    assert sampled and sampled[0].shape == (4,)
