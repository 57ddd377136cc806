"""Differential / model-based tests of ``SamplerWithoutReplacement``.

Seeded random histories of extends (smaller and larger than the buffer), samples of varying
batch sizes (``drop_last`` and ``shuffle`` on and off), samples refused by a read-side
transform, ``empty()`` and restores (``state_dict`` / ``load_state_dict``, ``dumps`` /
``loads``, pickle, deepcopy) mid-epoch are applied to buffers over a ``ListStorage`` (core
has no other storage), driven in lockstep with the restored copies. After every sample the
batch is compared with a model of the documented epochs (sampling guide, "Without
replacement: epochs"):

* an epoch covers the slots written when it began; a sample that finds the storage holding
  another number of items starts a new epoch over all of them (TorchRL's rule: with a full
  ring, overwritten slots do not start one);
* within an epoch every slot is drawn exactly once, a batch holds ``min(batch, remaining)``
  distinct slots (``drop_last``: exactly ``batch``, the short remainder dropped), in storage
  order with ``shuffle=False``; ``ran_out`` turns True with the batch that ends the epoch;
* a sample refused by a transform draws nothing: the next sample draws the same items;
* every restored buffer draws the same items as the original, and the rows read are the ones
  the model stored in the drawn slots.

The draws themselves are compared with TorchRL 0.14.1: for the same seeded histories its
``SamplerWithoutReplacement`` returned the items recorded below. No history found a
divergence, so every test here is a guard.
"""

from __future__ import annotations

import random

import pytest
import torch

from tdreplay.core import ListStorage, ReplayBuffer, SamplerWithoutReplacement
from tdreplay.core.testing import restored


class _Flaky:
    """A read-side transform that refuses the next batch when told to."""

    def __init__(self) -> None:
        self.fail_next = False
        self.seen: torch.Tensor | None = None

    def __call__(self, batch):
        self.seen = batch
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the transform refused this batch")
        return batch


def _make(cfg: dict, seed: int) -> ReplayBuffer:
    flaky = _Flaky()
    rb = ReplayBuffer(storage=ListStorage(cfg["N"]), batch_size=cfg["bs"],
                      sampler=SamplerWithoutReplacement(drop_last=cfg["drop_last"],
                                                        shuffle=cfg["shuffle"]),
                      generator=torch.Generator().manual_seed(seed), transform=flaky)
    rb.flaky = flaky  # (copies of the buffer copy it with their transform)
    return rb


def _flaky(rb: ReplayBuffer) -> _Flaky:
    return rb.flaky


def _restore(rb: ReplayBuffer, how: str, cfg: dict) -> ReplayBuffer:
    def make():
        new = _make(cfg, 4242)
        new.extend(torch.arange(-3, 0))  # a used buffer, mid-epoch
        new.sample(1)
        return new

    return restored(rb, make, how)


def _run_history(cfg: dict, seed: int) -> int:
    r = random.Random(seed)
    rbs = [_make(cfg, seed)]
    n_cap = cfg["N"]
    uid = 0
    slot_uid: dict[int, int] = {}
    cursor = n_slots = 0
    epoch_n: int | None = None
    drawn: set[int] = set()
    ran_out_before = True
    checked = 0
    for _ in range(cfg["steps"]):
        op = r.random()
        if op < 0.25 or n_slots == 0:
            k = r.choice(cfg["write_sizes"])
            for j in range(k):
                slot_uid[cursor] = uid + j
                cursor = (cursor + 1) % n_cap
            n_slots = min(n_slots + k, n_cap)
            for rb in rbs:
                rb.extend(torch.arange(uid, uid + k))
            uid += k
        elif op < 0.3 and len(rbs) < 3:
            rbs.append(_restore(rbs[0], r.choice(["pickle", "deepcopy", "state_dict", "dumps"]),
                                cfg))
        elif op < 0.33 and cfg["empty"]:
            for rb in rbs:
                rb.empty()
            slot_uid.clear()
            cursor = n_slots = 0
            epoch_n, drawn, ran_out_before = None, set(), True
        else:
            bs = cfg["bs"] if cfg["drop_last"] else r.choice([cfg["bs"], 1, 3])
            if cfg["drop_last"] and n_slots < bs:
                for rb in rbs:
                    with pytest.raises(ValueError, match="batch size"):
                        rb.sample(bs)
                continue
            # what the model says this sample does
            new_epoch = ran_out_before or epoch_n != n_slots or (
                cfg["drop_last"] and epoch_n - len(drawn) < bs)
            starts_by_size = epoch_n != n_slots or (
                cfg["drop_last"] and not ran_out_before and epoch_n - len(drawn) < bs)
            refused = []
            if r.random() < 0.15:
                for rb in rbs:
                    _flaky(rb).fail_next = True
                    with pytest.raises(RuntimeError, match="refused"):
                        rb.sample(bs)
                    refused.append(_flaky(rb).seen.tolist())
            outs = [rb.sample(bs, return_info=True) for rb in rbs]
            values = outs[0][0].tolist()
            idx = outs[0][1]["index"].tolist()
            for other, info in outs[1:]:
                assert other.tolist() == values and info["index"].tolist() == idx
            assert all(rb.sampler.ran_out == rbs[0].sampler.ran_out for rb in rbs[1:])
            if not starts_by_size:  # (a new epoch drawn again gets new random numbers)
                assert all(batch == values for batch in refused), "refused items skipped"
            assert [slot_uid[s] for s in idx] == values
            if new_epoch:
                epoch_n, drawn = n_slots, set()
            remaining = epoch_n - len(drawn)
            assert len(idx) == min(bs, remaining)
            assert len(set(idx)) == len(idx) and not set(idx) & drawn, "an item twice"
            assert all(0 <= s < n_slots for s in idx)
            if not cfg["shuffle"]:
                assert idx == list(range(len(drawn), len(drawn) + len(idx)))
            drawn |= set(idx)
            remaining = epoch_n - len(drawn)
            ran_out = remaining == 0 or (cfg["drop_last"] and remaining < bs)
            assert rbs[0].sampler.ran_out == ran_out
            if ran_out:
                assert len(drawn) > epoch_n - (bs if cfg["drop_last"] else 1)
            ran_out_before = ran_out
            checked += 1
    return checked


def _config(seed: int) -> dict:
    r = random.Random(seed)
    return dict(N=r.randint(2, 16), drop_last=r.random() < 0.4, shuffle=r.random() < 0.7,
                bs=r.randint(1, 6), write_sizes=r.choice([[1, 2], [1, 5, 17]]),
                empty=r.random() < 0.3, steps=r.randint(20, 50))


@pytest.mark.parametrize("seed", range(24))
def test_history_matches_epoch_model_and_restores(seed):
    assert _run_history(_config(seed), seed) > 0


def test_epochs_by_iteration_cover_every_item_once_across_restores():
    rb = _make(dict(N=50, bs=4, drop_last=False, shuffle=True), 3)
    rb.extend(torch.arange(50))
    for epoch in range(3):
        seen = []
        for i, batch in enumerate(rb):
            seen += batch.tolist()
            if i == 5 and epoch == 1:  # restored mid-epoch: the epoch goes on there
                restored = _restore(rb, "dumps", dict(N=50, bs=4, drop_last=False,
                                                      shuffle=True))
                rest = [x for b in restored for x in b.tolist()]
                assert sorted(seen + rest) == list(range(50))
        assert sorted(seen) == list(range(50))


# Items TorchRL 0.14.1's SamplerWithoutReplacement returned (ReplayBuffer over a
# LazyTensorStorage, generator seeded with the history's seed), and its ran_out after each.
_TORCHRL = {
    0: ([[4], [3], [7, 6, 2], [11], [9], [10, 15, 12], [5, 13, 8], [14], [5, 11, 10],
         [8, 12, 16], [21, 27, 20], [28, 18, 31], [29, 23], [43, 45, 39], [40, 47, 46], [37],
         [42, 48, 50], [49], [55]], "0000000100001000000"),
    2: ([[3, 2], [2, 4], [8, 6], [6, 8], [8, 6], [6, 8], [8, 6], [6, 8], [7, 8], [8, 7],
         [7, 6], [7, 8], [7, 6], [7, 6], [6, 8], [8, 7], [14, 15], [15, 16], [20, 18], [20, 19],
         [18, 19], [19, 20]], "1111111111111111111111"),
    8: ([[0, 1], [7, 12], [4, 6], [19, 17], [23, 20], [22, 23], [24, 18], [20, 17], [19, 21],
         [18, 24], [22, 20], [19, 17], [25, 21], [25, 24], [23, 26], [22, 20], [18, 21],
         [22, 18], [23, 19], [39, 34]], "10001000100010001000"),
    16: ([[6, 3, 13], [15, 11, 8], [23], [14, 25, 22], [18], [17, 20], [14, 16], [15], [20],
          [19, 26], [18], [17], [25, 21], [24, 23], [22], [20], [26, 24], [19, 23, 17], [18],
          [22], [29, 38], [28, 40, 34]], "0000010000000010000001"),
}


@pytest.mark.parametrize("seed", sorted(_TORCHRL))
def test_draws_match_torchrl(seed):
    r = random.Random(seed)
    n = r.randint(2, 20)
    drop_last, shuffle, bs = r.random() < 0.4, r.random() < 0.7, r.randint(1, 6)
    rb = ReplayBuffer(storage=ListStorage(n), batch_size=bs,
                      sampler=SamplerWithoutReplacement(drop_last=drop_last, shuffle=shuffle),
                      generator=torch.Generator().manual_seed(seed))
    batches, ran_out, v = [], "", 0
    for _ in range(30):
        if r.random() < 0.3 or len(rb) == 0:
            k = r.choice([1, 2, 3, n + 1])
            rb.extend(torch.arange(v, v + k))
            v += k
        else:
            batches.append(rb.sample(bs if drop_last else r.choice([bs, 1, 3])).tolist())
            ran_out += str(int(rb.sampler.ran_out))
    assert (batches, ran_out) == _TORCHRL[seed]
