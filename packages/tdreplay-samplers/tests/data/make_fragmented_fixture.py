"""Writes ``fragmented_torchrl.json``: seeded histories of interleaved writes (1-3 collectors,
skipped steps, wrap-around overwrites) and samples run through TorchRL 0.14.1's
``SliceSampler(fragmented=True)``, with the slots and info of every sample (or the type of the
error it raised). test_slice_fragmented_torchrl.py replays them on tdreplay, seeding torch's
global generator as here before each sample.

Run with a Python that has TorchRL: ``python make_fragmented_fixture.py``."""

import json
import random
from pathlib import Path


def history(seed):
    # (imported here: the test run collects this file and has no TorchRL)
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, SliceSampler

    rng = random.Random(seed)
    capacity = rng.randint(8, 40)
    kwargs = {"strict_length": rng.random() < 0.5}
    if not kwargs["strict_length"] and rng.random() < 0.5:
        kwargs["pad_output"] = True
    if rng.random() < 0.5:
        kwargs["slice_len"] = rng.randint(1, 4)
    else:
        kwargs["num_slices"] = rng.randint(1, 3)
    kwargs["init_key"] = rng.choice(["is_init", None, "reset"])
    traj_key = rng.choice(["episode", ["collector", "traj_ids"], None])
    if traj_key is not None:
        kwargs["traj_key"] = traj_key
    stored_key = tuple(traj_key) if isinstance(traj_key, list) else traj_key or "episode"
    sampler = SliceSampler(fragmented=True, **{k: tuple(v) if isinstance(v, list) else v
                                              for k, v in kwargs.items()})
    storage = LazyTensorStorage(capacity)
    collectors = [[c * 100, 0] for c in range(rng.randint(1, 3))]
    ops, cursor = [], 0
    for _ in range(rng.randint(2, 7)):
        rows = []
        for _ in range(rng.randint(1, 12)):
            state = collectors[rng.randrange(len(collectors))]
            rows.append(list(state))
            r = rng.random()
            state[:] = [state[0] + 1, 0] if r < 0.15 else [state[0], state[1] + (2 if r < 0.25
                                                                                   else 1)]
        done = [rng.random() < 0.2 for _ in rows]
        n = len(rows)
        step = torch.tensor([r[1] for r in rows])
        storage.set((torch.arange(n) + cursor) % capacity, TensorDict({
            stored_key: torch.tensor([r[0] for r in rows]), "step_count": step,
            "is_init": (step == 0).unsqueeze(-1), "reset": (step == 1).unsqueeze(-1),
            ("next", "done"): torch.tensor(done).unsqueeze(-1),
            ("next", "terminated"): torch.tensor(done).unsqueeze(-1)}, [n]))
        cursor = (cursor + n) % capacity
        ops.append({"op": "extend", "rows": rows, "done": done})
        batch_size = (kwargs.get("slice_len") or kwargs.get("num_slices")) * rng.randint(1, 3)
        sample_seed = rng.randrange(2 ** 31)
        torch.manual_seed(sample_seed)
        op = {"op": "sample", "seed": sample_seed, "batch_size": batch_size}
        try:
            index, info = sampler.sample(storage, batch_size)
        except Exception as err:
            op["error"] = type(err).__name__
        else:
            op["index"] = index[0].reshape(-1).tolist()
            op["info"] = {json.dumps(k): v.reshape(-1).tolist() for k, v in info.items()}
        ops.append(op)
    return {"capacity": capacity, "kwargs": kwargs, "stored_key": stored_key, "ops": ops}


if __name__ == "__main__":
    out = Path(__file__).parent / "fragmented_torchrl.json"
    out.write_text(json.dumps([history(seed) for seed in range(50)], separators=(",", ":")))
