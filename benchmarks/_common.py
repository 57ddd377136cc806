"""Shared helpers of the benchmark scripts: timing loops and JSON-lines output."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator

import torch
from tensordict import TensorDict


def transition_batch(n: int, obs_dim: int = 32, action_dim: int = 4) -> TensorDict:
    """Rows {obs[32], action[4], next.obs[32], next.reward[1], next.done[1] bool}."""
    return TensorDict(
        {
            "obs": torch.randn(n, obs_dim),
            "action": torch.randn(n, action_dim),
            "next": {
                "obs": torch.randn(n, obs_dim),
                "reward": torch.randn(n, 1),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def transition_batches(n: int, count: int = 4) -> Iterator[TensorDict]:
    """``count`` different ``transition_batch(n)``, served in turn forever: timed ``extend``
    calls neither write the same tensors every time nor pay for making them."""
    return itertools.cycle([transition_batch(n) for _ in range(count)])


def rate(fn: Callable[[], object], *, min_time: float = 1.0, warmup: int = 3) -> float:
    """Calls per second of ``fn``, timed over at least ``min_time`` seconds."""
    for _ in range(warmup):
        fn()
    calls = 0
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return calls / elapsed


def report(name: str, value: float, unit: str, **extra: object) -> None:
    """Print one result as a JSON line (collected by run_all.py)."""
    print(json.dumps({"name": name, "value": round(value, 3), "unit": unit, **extra}), flush=True)


def median_ms(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> float:
    """Median wall time of ``fn`` in milliseconds over ``reps`` calls, after 3 warm-ups, the
    device synchronized before and after each call (the CUDA scripts' figures)."""
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def device_sync(device: str) -> Callable[[], None]:
    """What waits for ``device``'s queued work: ``torch.cuda.synchronize`` on ``"cuda"``, else
    nothing (host work is done when its call returns)."""
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def device_name(device: str) -> str:
    """The GPU's name for ``device="cuda"``, else ``"cpu"`` (the CUDA scripts' rows)."""
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
