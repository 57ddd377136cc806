"""Helpers the tests send to other processes: collector processes and an actor-side transform.

Importable by name (``tests/`` is on the path of buffer actors and spawned processes, see
``conftest.py``), so nothing here is pickled by value.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDict

ROW_KEYS = ("collector", "seq", "row", "obs", "sleep")


def retry_until(call, accept: tuple[type[BaseException], ...], timeout: float):
    """``call()`` once it stops raising ``accept`` (an actor restarting), retried every 0.2 s
    for ``timeout`` s; the last error after that."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except accept:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def until_dead(shard: Any, timeout: float = 60.0) -> None:
    """Wait until the actor of a killed ``shard`` (a buffer client) answers as dead."""
    from tdreplay.distributed import BufferActorDiedError

    def dead() -> None:
        try:
            len(shard)
        except BufferActorDiedError:
            return
        raise TimeoutError

    retry_until(dead, (TimeoutError,), timeout)


def make_batch(collector: int, seq: int, size: int, *, sleep: float = 0.0) -> TensorDict:
    """Batch ``seq`` of ``collector``: rows tagged with both and their row number.

    ``obs`` is derived from the tags, so a sampled row can be checked for integrity; ``sleep``
    makes :func:`sleep_on_read` pause when the row is read.
    """
    row = torch.arange(size)
    tag = collector * 1_000_000 + seq * 1_000 + row
    return TensorDict({
        "collector": torch.full((size,), collector),
        "seq": torch.full((size,), seq),
        "row": row,
        "obs": tag.double().unsqueeze(-1) * torch.tensor([1.0, -1.0, 0.5]),
        "sleep": torch.full((size,), float(sleep)),
    }, [size])


def rows_are_intact(data: TensorDict) -> bool:
    """Whether every row of ``data`` holds the ``obs`` its tags say it should."""
    tag = data["collector"] * 1_000_000 + data["seq"] * 1_000 + data["row"]
    expected = tag.double().unsqueeze(-1) * torch.tensor([1.0, -1.0, 0.5])
    return bool(torch.equal(data["obs"], expected))


def sleep_on_read(data: TensorDict) -> TensorDict:
    """Read-side transform: sleep for the largest ``sleep`` entry of the batch (a slow call)."""
    if "sleep" in data.keys():
        seconds = float(data["sleep"].max()) if data.numel() else 0.0
        if seconds > 0:
            time.sleep(seconds)
    return data


def run_collector(address: str, namespace: str, name: str, collector: int, batches: int,
                  size: int, acked, pause: float = 0.0) -> None:
    """A collector process: attach to the buffer ``name``, write ``batches`` batches.

    ``acked.value`` counts the batches whose ``extend`` returned (their rows are in the buffer).
    ``pause`` seconds pass between two batches.
    """
    import ray

    from tdreplay.distributed import RayReplayBuffer

    ray.init(address=address, namespace=namespace, log_to_driver=False)
    rb = RayReplayBuffer.attach(name)
    for seq in range(batches):
        rb.extend(make_batch(collector, seq, size))
        with acked.get_lock():
            acked.value = seq + 1
        if pause:
            time.sleep(pause)
    ray.shutdown()


class Worker:
    """A collector and a learner for a Ray actor: each call is handed a buffer (pickled into
    the call, as into a task), so one actor serves the tests of several buffers."""

    def collect(self, buffer, collector: int, batches: int, size: int) -> list[int]:
        """Write ``batches`` batches of ``size`` rows; the slots the last one went to."""
        slots = []
        for seq in range(batches):
            slots = buffer.extend(make_batch(collector, seq, size)).tolist()
        return slots

    def sample(self, buffer, batch_size: int) -> tuple[int, bool, list[int]]:
        """``(len, rows intact, collectors seen)`` of one sample."""
        data = buffer.sample(batch_size)
        return len(buffer), rows_are_intact(data), sorted(set(data["collector"].tolist()))


def extend_in_task(buffer, collector: int, size: int) -> list[int]:
    """A Ray task's body: write one batch to the buffer it was handed; its slots."""
    return buffer.extend(make_batch(collector, 0, size)).tolist()


def schema_batch(schema: str, size: int) -> TensorDict:
    """A batch of ``size`` rows of one of two layouts, each with a key the other lacks:
    ``"a"`` (``obs`` of 3 floats and an int64 ``act``) or ``"b"`` (``obs`` and a float
    ``rew``)."""
    if schema == "a":
        return TensorDict({"obs": torch.randn(size, 3), "act": torch.arange(size)}, [size])
    return TensorDict({"obs": torch.randn(size, 3), "rew": torch.zeros(size)}, [size])


class SchemaWriter:
    """A Ray actor's writer: ``write`` extends the buffer it is handed with ``batches``
    batches of one layout (:func:`schema_batch`); each outcome as ``("ok", first slot)`` or
    ``(error type, message)``."""

    def write(self, buffer, schema: str, batches: int, size: int) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for _ in range(batches):
            try:
                out.append(("ok", int(buffer.extend(schema_batch(schema, size))[0])))
            except Exception as err:  # noqa: BLE001 - reported to the test
                out.append((type(err).__name__, str(err)))
        return out
