"""Faults of a buffer actor: calls that time out, an actor that dies, respawning from dumps."""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch
from distributed_workers import make_batch, rows_are_intact, sleep_on_read

from tdreplay.core import TensorDictReplayBuffer
from tdreplay.distributed import (
    BufferActorDiedError,
    RayReplayBuffer,
    RemoteBufferError,
    RemoteCallTimeoutError,
)
from tdreplay.storages import LazyTensorStorage

NAME = "fault-buffer"


@pytest.fixture(scope="module")
def fault_rb(ray_session):
    """A named buffer whose reads sleep for the ``sleep`` entry of the rows read."""
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 100),
                         replay_buffer_cls=TensorDictReplayBuffer, transform=sleep_on_read,
                         batch_size=8, name=NAME)
    yield rb
    rb.shutdown()


@pytest.fixture
def fresh(fault_rb):
    fault_rb.call_timeout = 60.0
    fault_rb.empty()
    return fault_rb


def test_a_call_without_answer_times_out_and_the_actor_goes_on(fresh):
    fresh.extend(make_batch(0, 0, 3))
    fresh.extend(make_batch(0, 1, 1, sleep=2.0))  # reading this row takes 2 s
    fresh.call_timeout = 0.3
    with pytest.raises(RemoteCallTimeoutError, match=f"'{NAME}'.*0.3 s") as err:
        fresh[:]
    assert isinstance(err.value, TimeoutError) and isinstance(err.value, RemoteBufferError)
    assert NAME in err.value.actor
    fresh.call_timeout = 60.0
    assert len(fresh) == 4  # answered once the slow read is done
    assert fresh[:3]["row"].tolist() == [0, 1, 2]


def test_a_dead_actor_gives_a_clear_error_and_respawn_restores_its_checkpoint(
        fresh, ray_session, tmp_path):
    fresh.extend(make_batch(0, 0, 5))
    fresh.dumps(tmp_path / "ckpt")
    saved = fresh[:]
    fresh.extend(make_batch(0, 1, 2, sleep=5.0))  # written after the checkpoint: lost
    other = RayReplayBuffer.attach(NAME)

    # a call in flight when the actor dies fails too
    outcome = {}

    def slow_read():
        try:
            outcome["value"] = fresh[:]
        except BaseException as err:  # noqa: BLE001 - inspected below
            outcome["error"] = err

    reader = threading.Thread(target=slow_read)
    reader.start()
    other.call_timeout = 60.0
    ray_session.kill(fresh.actor)
    reader.join(timeout=60)
    assert isinstance(outcome.get("error"), BufferActorDiedError)

    for client in (fresh, other):
        with pytest.raises(BufferActorDiedError, match=f"'{NAME}'.*dead.*respawn") as err:
            client.extend(make_batch(1, 0, 1))
        assert NAME in err.value.actor
        with pytest.raises(BufferActorDiedError):
            len(client)

    fresh.respawn(tmp_path / "ckpt")
    assert len(fresh) == 5 and fresh.write_count == 5
    assert torch.equal(fresh[:]["obs"], saved["obs"])
    other.reconnect()  # the attached client finds the new actor by name
    assert len(other) == 5
    other.extend(make_batch(2, 0, 3))
    data = fresh.sample(64)
    assert rows_are_intact(data) and set(data["collector"].tolist()) <= {0, 2}


def test_respawn_needs_the_creating_client(fresh):
    with pytest.raises(RuntimeError, match="only the client that created"):
        RayReplayBuffer.attach(NAME).respawn()
