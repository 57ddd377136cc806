"""Write the checkpoint fixtures read by ``tests/test_old_checkpoints.py``.

Run it with the tree whose checkpoints are wanted on ``PYTHONPATH`` (the fixtures next to this
file were written by commit 29fb400, 2026-11-23)::

    git worktree add -f /tmp/old 29fb400
    PYTHONPATH=$(ls -d /tmp/old/packages/*/src | paste -sd:) \\
        python make_fixtures.py packages/tdreplay/tests/data/checkpoints_29fb400

For every configuration of :data:`CONFIGS` it builds a tiny buffer, fills it (seeded), saves it
both ways users do (``rb.dumps(OUT/name/dumps)`` and ``torch.save(rb.state_dict(),
OUT/name/state_dict.pt)``) and then writes to ``OUT/name/expected.json`` what that process
observed right after saving (:func:`observe`): length, write count, contents, priorities, the
next seeded samples, one more write and the state after it.

The test imports this module (with today's code) for :data:`CONFIGS` and :func:`observe`, so a
configuration is built and observed the same way on both sides: the functions here must keep
working with the old tree and with today's. Nothing runs on import.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

import tdreplay.data as D

# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def td_rows(start: int, n: int) -> TensorDict:
    """``n`` rows whose entries say which row they are (``obs`` [n, 2] float, ``val`` int)."""
    base = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"obs": base[:, None] + torch.tensor([0.0, 0.5]), "val": base.long()}, [n])


def episodes(start: int, n: int, ep_len: int = 7) -> TensorDict:
    """Rows of consecutive episodes of ``ep_len`` steps (``episode`` is the trajectory key)."""
    steps = torch.arange(start, start + n)
    return TensorDict({"obs": steps.float(), "episode": steps // ep_len}, [n])


def seed(n: int) -> None:
    torch.manual_seed(n)
    np.random.seed(n)  # the prioritized samplers draw from NumPy's global generator on CPU


# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------


@dataclass
class Config:
    build: Callable[[str], Any]  # scratch directory -> fresh, empty buffer
    fill: Callable[[Any], None]  # seeded content and state (priorities, mid-epoch, statistics)
    more: Callable[[Any], None]  # one more write, done after loading (writer cursor / heap)
    batch_size: int = 4
    prioritized: bool = False
    ensemble: bool = False
    needs: tuple[str, ...] = ()  # modules a fresh buffer needs to load the checkpoint


CONFIGS: dict[str, Config] = {}


def config(name: str) -> Callable[[Callable[[], Config]], Callable[[], Config]]:
    def deco(fn: Callable[[], Config]) -> Callable[[], Config]:
        CONFIGS[name] = fn()
        return fn

    return deco


@config("list_storage")
def _list_storage() -> Config:
    def build(scratch: str) -> Any:
        return D.ReplayBuffer(storage=D.ListStorage(12), batch_size=4)

    def fill(rb: Any) -> None:
        rb.extend([torch.tensor([i, 2 * i]) for i in range(17)])  # 17 in 12: wraps

    def more(rb: Any) -> None:
        rb.extend([torch.tensor([100 + i, -1]) for i in range(3)])

    return Config(build, fill, more)


@config("tensor_storage_wrapped")
def _tensor_storage_wrapped() -> Config:
    def build(scratch: str) -> Any:
        return D.TensorDictReplayBuffer(storage=D.LazyTensorStorage(16), batch_size=4)

    def fill(rb: Any) -> None:
        rb.extend(td_rows(0, 15))
        rb.extend(td_rows(15, 8))  # 23 in 16: wraps

    def more(rb: Any) -> None:
        rb.extend(td_rows(100, 3))

    return Config(build, fill, more)


@config("tensor_storage_ndim2")
def _tensor_storage_ndim2() -> Config:
    def build(scratch: str) -> Any:
        return D.TensorDictReplayBuffer(storage=D.LazyTensorStorage(20, ndim=2), batch_size=4)

    def fill(rb: Any) -> None:
        rb.extend(td_rows(0, 16).reshape(4, 4))  # [envs, time]: storage [4, 5]
        rb.extend(td_rows(16, 12).reshape(4, 3))  # 7 steps in 5: wraps

    def more(rb: Any) -> None:
        rb.extend(td_rows(100, 4).reshape(4, 1))

    return Config(build, fill, more)


@config("memmap_storage")
def _memmap_storage() -> Config:
    def build(scratch: str) -> Any:
        storage = D.LazyMemmapStorage(16, scratch_dir=tempfile.mkdtemp(dir=scratch))
        return D.TensorDictReplayBuffer(storage=storage, batch_size=4)

    def fill(rb: Any) -> None:
        rb.extend(td_rows(0, 22))  # wraps

    def more(rb: Any) -> None:
        rb.extend(td_rows(100, 3))

    return Config(build, fill, more)


def _compressed(zlib: bool) -> Config:
    # The zlib fixture stands for a checkpoint written where zstandard was not installed (zlib
    # is the default codec there); it was written with the old tree's default codec switched
    # to zlib. Today a storage on the default codec reads either built-in codec's rows, so
    # both configurations build the storage the same way.
    def build(scratch: str) -> Any:
        return D.TensorDictReplayBuffer(storage=D.CompressedListStorage(12), batch_size=4)

    def fill(rb: Any) -> None:
        rb.extend(td_rows(0, 17))  # wraps

    def more(rb: Any) -> None:
        rb.extend(td_rows(100, 3))

    # the default codec with zstandard installed is zstd: a zstd checkpoint needs it to load
    return Config(build, fill, more, needs=() if zlib else ("zstandard",))


config("compressed_list_storage")(lambda: _compressed(zlib=False))
config("compressed_list_storage_zlib")(lambda: _compressed(zlib=True))


@config("prioritized_numba")
def _prioritized_numba() -> Config:
    def build(scratch: str) -> Any:
        return D.TensorDictPrioritizedReplayBuffer(
            alpha=0.6, beta=0.4, storage=D.LazyTensorStorage(16), priority_key="td_error",
            batch_size=4,
        )

    def fill(rb: Any) -> None:
        td = td_rows(0, 22)
        td["td_error"] = (torch.arange(22.0) % 5) / 3 + 0.05
        rb.extend(td)  # wraps
        seed(11)
        sample = rb.sample()
        sample["td_error"] = torch.arange(4.0) * 2 + 7
        rb.update_tensordict_priority(sample)
        rb.update_priority(torch.tensor([1, 5, 9]), torch.tensor([0.3, 4.0, 11.0]))

    def more(rb: Any) -> None:
        td = td_rows(100, 3)
        td["td_error"] = torch.full((3,), 3.0)
        rb.extend(td)

    return Config(build, fill, more, prioritized=True)


@config("without_replacement_mid_epoch")
def _without_replacement_mid_epoch() -> Config:
    def build(scratch: str) -> Any:
        return D.TensorDictReplayBuffer(
            storage=D.LazyTensorStorage(30), sampler=D.SamplerWithoutReplacement(), batch_size=4
        )

    def fill(rb: Any) -> None:
        rb.extend(td_rows(0, 20))
        seed(3)
        for _ in range(3):  # 12 of 20 drawn
            rb.sample()

    def more(rb: Any) -> None:
        rb.extend(td_rows(100, 3))

    return Config(build, fill, more)


@config("slice_sampler")
def _slice_sampler() -> Config:
    def build(scratch: str) -> Any:
        sampler = D.SliceSampler(num_slices=2, traj_key="episode")
        return D.TensorDictReplayBuffer(storage=D.LazyTensorStorage(30), sampler=sampler,
                                        batch_size=8)

    def fill(rb: Any) -> None:
        rb.extend(episodes(0, 40))  # wraps mid-episode
        seed(4)
        rb.sample()

    def more(rb: Any) -> None:
        rb.extend(episodes(100, 7))

    return Config(build, fill, more, batch_size=8)


@config("slice_without_replacement_mid_epoch")
def _slice_without_replacement_mid_epoch() -> Config:
    def build(scratch: str) -> Any:
        sampler = D.SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode")
        return D.TensorDictReplayBuffer(storage=D.LazyTensorStorage(30), sampler=sampler,
                                        batch_size=8)

    def fill(rb: Any) -> None:
        rb.extend(episodes(0, 35))  # 5 episodes, wraps
        seed(5)
        rb.sample()  # 2 of them drawn

    def more(rb: Any) -> None:
        rb.extend(episodes(100, 7))

    return Config(build, fill, more, batch_size=8)


@config("max_value_writer")
def _max_value_writer() -> Config:
    def build(scratch: str) -> Any:
        return D.TensorDictReplayBuffer(
            storage=D.LazyTensorStorage(12), writer=D.TensorDictMaxValueWriter(rank_key="reward"),
            batch_size=4,
        )

    def fill(rb: Any) -> None:
        td = td_rows(0, 30)
        td["reward"] = torch.randperm(30, generator=torch.Generator().manual_seed(7)).float()
        rb.extend(td)

    def more(rb: Any) -> None:
        td = td_rows(100, 4)
        td["reward"] = torch.tensor([50.0, 0.5, 21.5, 17.5])
        rb.extend(td)

    return Config(build, fill, more)


@config("vecnorm_transform")
def _vecnorm_transform() -> Config:
    from tdreplay.transforms import VecNorm

    def build(scratch: str) -> Any:
        return D.TensorDictReplayBuffer(
            storage=D.LazyTensorStorage(30), transform=VecNorm(in_keys=["obs"], decay=0.9),
            batch_size=4,
        )

    def fill(rb: Any) -> None:
        obs = torch.randn(24, 3, generator=torch.Generator().manual_seed(10)) * 3 + 1
        rb.extend(TensorDict({"obs": obs}, [24]))
        seed(10)
        for _ in range(3):  # the statistics are updated by the samples
            rb.sample()

    def more(rb: Any) -> None:
        rb.extend(TensorDict({"obs": torch.ones(3, 3)}, [3]))

    return Config(build, fill, more)


@config("ensemble")
def _ensemble() -> Config:
    def build(scratch: str) -> Any:
        first = D.TensorDictReplayBuffer(storage=D.LazyTensorStorage(12))
        second = D.TensorDictReplayBuffer(storage=D.ListStorage(10))
        return D.ReplayBufferEnsemble(first, second, sample_from_all=True, batch_size=4)

    def fill(rb: Any) -> None:
        rb[0].extend(td_rows(0, 17))  # wraps
        rb[1].extend(td_rows(50, 8))

    def more(rb: Any) -> None:
        rb[0].extend(td_rows(100, 3))
        rb[1].extend(td_rows(200, 3))  # wraps

    return Config(build, fill, more, ensemble=True)


# --------------------------------------------------------------------------------------------
# Observation
# --------------------------------------------------------------------------------------------


def to_json(x: Any) -> Any:
    """Plain JSON of what a buffer returns (tensors keep dtype and shape; exact values)."""
    if isinstance(x, TensorDictBase):
        leaves = x.items(include_nested=True, leaves_only=True)
        return {"__td__": {"/".join((k,) if isinstance(k, str) else k): to_json(v)
                           for k, v in sorted(leaves, key=lambda kv: str(kv[0]))},
                "batch_size": list(x.batch_size)}
    if isinstance(x, np.ndarray):
        x = torch.as_tensor(x)
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return {"__tensor__": x.tolist(), "dtype": str(x.dtype), "shape": list(x.shape)}
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json(v) for v in x]
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    raise TypeError(f"cannot record {type(x).__name__}")


def _state(cfg: Config, rb: Any) -> dict[str, Any]:
    members = [rb[0], rb[1]] if cfg.ensemble else [rb]
    out: dict[str, Any] = {
        "len": [len(m) for m in members],
        "write_count": [m.write_count for m in members],
        "content": [to_json(m[:]) for m in members],
    }
    if cfg.prioritized:
        n = len(rb)
        out["priorities"] = to_json(rb.sampler.state_dict()["priorities"][:n])
        out["max_priority"] = rb.sampler.max_priority
        out["total_priority"] = rb.sampler.total_priority
    return out


def _samples(cfg: Config, rb: Any, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        data, info = rb.sample(cfg.batch_size, return_info=True)
        out.append({"data": to_json(data), "index": to_json(info.get("index"))})
    return out


def observe(cfg: Config, rb: Any) -> dict[str, Any]:
    """The state of ``rb`` and what it does next: what the test compares after loading."""
    out: dict[str, Any] = {"saved": _state(cfg, rb)}
    seed(0)
    out["samples"] = _samples(cfg, rb, 2)
    cfg.more(rb)
    out["after_more"] = _state(cfg, rb)
    seed(1)
    out["samples_after_more"] = _samples(cfg, rb, 1)
    return out


# --------------------------------------------------------------------------------------------
# Writing the fixtures
# --------------------------------------------------------------------------------------------


def write(out_root: str, names: list[str]) -> None:
    scratch = tempfile.mkdtemp(prefix="tdreplay-fixtures-")
    try:
        for name in names:
            cfg = CONFIGS[name]
            out = os.path.join(out_root, name)
            if os.path.exists(out):
                shutil.rmtree(out)
            os.makedirs(out)
            rb = cfg.build(scratch)
            seed(123)
            cfg.fill(rb)
            rb.dumps(os.path.join(out, "dumps"))
            torch.save(rb.state_dict(), os.path.join(out, "state_dict.pt"))
            record = {
                "config": name,
                "written_by": {"tdreplay": D.__version__, "torch": torch.__version__},
                "observed": observe(cfg, rb),
            }
            if cfg.prioritized:
                record["backend"] = rb.sampler.backend
            if isinstance(rb, D.TensorDictReplayBuffer) and hasattr(rb.storage, "codec"):
                record["codec"] = rb.storage.codec.name
            with open(os.path.join(out, "expected.json"), "w") as f:
                json.dump(record, f, indent=1, sort_keys=True)
                f.write("\n")
            print(name, "written")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: make_fixtures.py OUTDIR [config ...]")
    write(sys.argv[1], sys.argv[2:] or list(CONFIGS))
