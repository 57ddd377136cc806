"""Writes ``streaming_windows_torchrl.json``: seeded histories of writes and samples run through
TorchRL 0.14.1's ``StreamingSliceSampler``, with the windows it serves first at each sample and
those still queued after it (test_streaming_torchrl.py replays them on tdreplay).

Run with a Python that has TorchRL: ``python make_streaming_windows_fixture.py``. Fewer steps
than the buffer holds are written between two samples (tdreplay cuts writes at the next sample;
see ``StreamingSliceSampler``)."""

import json
import random
from pathlib import Path

import torch
from tensordict import TensorDict


def fresh_windows(sampler):
    versions = sampler._slot_versions
    return [w.tolist() for w, v in sampler._queued_slices
            if int(w.max()) < versions.numel() and torch.equal(versions[w], v)]


def history(seed):
    # (imported here: the test run collects this file and has no TorchRL)
    from torchrl.data import LazyTensorStorage, StreamingSliceSampler, TensorDictReplayBuffer

    rng = random.Random(seed)
    capacity, slice_len = rng.choice([(12, 3), (20, 4), (9, 2), (30, 5)])
    use_traj, use_init = rng.random() < 0.5, rng.random() < 0.3
    kwargs = {"slice_len": slice_len, "strict_length": False}
    if use_traj:
        kwargs["traj_key"] = "episode"
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity),
                                sampler=StreamingSliceSampler(**kwargs))
    ops, step, episode, since = [], 0, 0, 0
    for _ in range(30):
        if since and (rng.random() < 0.35 or since >= capacity // 2):
            n = rng.randint(1, 3)
            expected = fresh_windows(rb.sampler)
            first = expected[:n]
            index = rb.sample(n * slice_len)["index"][: len(first) * slice_len]
            assert index.view(-1, slice_len).tolist() == first
            ops.append({"op": "sample", "num_slices": n, "first": first,
                        "left": fresh_windows(rb.sampler)})
            since = 0
            continue
        count = rng.randint(1, capacity // 2 - since) if since < capacity // 2 else 1
        done, ids, init = [], [], []
        for _ in range(count):
            ids.append(episode)
            init.append(use_init and rng.random() < 0.1)
            d = rng.random() < 0.15
            done.append(d and not use_traj)
            if d:
                episode += 1
        data = {"value": list(range(step, step + count)), "done": done}
        if use_traj:
            data["episode"] = ids
        if use_init:
            data["is_init"] = init
        td = TensorDict({"value": torch.tensor(data["value"]),
                         ("next", "done"): torch.tensor(done).view(-1, 1)}, [count])
        if use_traj:
            td["episode"] = torch.tensor(ids)
        if use_init:
            td["is_init"] = torch.tensor(init).view(-1, 1)
        rb.extend(td)
        ops.append({"op": "extend", **data})
        step += count
        since += count
    return {"seed": seed, "capacity": capacity, "kwargs": kwargs, "ops": ops}


if __name__ == "__main__":
    out = [history(seed) for seed in range(40)]
    path = Path(__file__).with_name("streaming_windows_torchrl.json")
    path.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(path, sum(len(h["ops"]) for h in out), "ops")
