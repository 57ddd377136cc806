"""The ``"distributed"`` transport: gloo channels between a buffer actor and its clients.

The channel and the actor's request handling are tested without Ray (two threads of this
process); the clients of a served buffer, with the session's Ray instance.
"""

from __future__ import annotations

import pickle
import threading
from datetime import timedelta
from functools import partial

import pytest
import torch
from tensordict import TensorDict
from torch.distributed import PrefixStore, TCPStore

from tdreplay.core import (
    ReplayBuffer,
    TensorDictReplayBuffer,
    service_backend,
    transport_backend,
)
from tdreplay.core.utils import ShapeMismatchError
from tdreplay.distributed import RayReplayBuffer, RemoteBufferError
from tdreplay.distributed._channel import Channel, ChannelClosedError, error_of
from tdreplay.distributed._channel_host import ChannelHost
from tdreplay.distributed.transport import DistributedBufferClient, check_transport
from tdreplay.samplers import PrioritizedSampler
from tdreplay.storages import LazyTensorStorage


def channel_pair(timeout: float = 10.0) -> tuple[Channel, Channel]:
    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout),
                     wait_for_workers=False)
    ends: list[Channel] = []
    joiner = threading.Thread(target=lambda: ends.append(
        Channel.join(PrefixStore("t", store), rank=0, timeout=timeout)))
    joiner.start()
    client = TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=timeout))
    mine = Channel.join(PrefixStore("t", client), rank=1, timeout=timeout)
    joiner.join()
    return ends[0], mine


# ---- the channel, without Ray ------------------------------------------------------------------
def test_every_dtype_and_shape_crosses_unchanged():
    actor, client = channel_pair()
    tensors = [torch.tensor([True, False, True]), torch.arange(6, dtype=torch.int8).reshape(2, 3),
               torch.randn(2, 2).to(torch.bfloat16), torch.randn(3, dtype=torch.complex64),
               torch.tensor(7.5, dtype=torch.float64), torch.empty(0, 4), torch.arange(10)[::3]]
    got: list = []
    reader = threading.Thread(target=lambda: got.append(actor.receive()))
    reader.start()  # a send completes once the other end receives
    client.send({"op": "x", "nested": {"a": [1, 2]}}, tensors)
    reader.join()
    description, received, kind = got[0]
    assert description == {"op": "x", "nested": {"a": [1, 2]}} and kind == 0
    for sent, got in zip(tensors, received, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert torch.equal(got, sent)


def test_a_silent_peer_times_out_and_a_closed_one_fails_at_once():
    actor, client = channel_pair(timeout=1.0)
    with pytest.raises(ChannelClosedError):
        actor.receive()  # nothing sent: waits the channel's timeout (1 s), then fails
    del client
    import gc

    gc.collect()  # the client's process group goes: its connection closes
    with pytest.raises(ChannelClosedError):
        actor.receive(first_wait=30.0)


def test_the_host_answers_with_the_buffer_and_returns_its_errors():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20), batch_size=3,
                                sampler=PrioritizedSampler(20, alpha=1.0, beta=1.0))
    host = ChannelHost(lambda: rb, "127.0.0.1")
    where = host.open(10.0)
    channel = Channel.connect(where, timeout=10.0)
    data = TensorDict({"obs": torch.arange(5.0), ("next", "done"): torch.zeros(5, dtype=bool)},
                      [5])
    channel.send({"op": "extend", "entries": [[["obs"], "torch.float32", [5]],
                                             [["next", "done"], "torch.bool", [5]]],
                  "batch_size": [5]}, [data["obs"], data["next", "done"]])
    _, (slots,), kind = channel.receive()
    assert kind == 0 and slots.tolist() == [0, 1, 2, 3, 4] and len(rb) == 5
    state = rb.sampler.state_dict()
    channel.send({"op": "priority", "entries": [[["index"], "torch.int64", [2]],
                                               [["td_error"], "torch.float32", [2]]],
                  "batch_size": [2]}, [torch.tensor([0, 1]), torch.tensor([1.0, float("nan")])])
    reply, _, kind = channel.receive()
    assert kind == 1 and reply["type"] == "ValueError"  # refused, and nothing changed
    assert torch.equal(rb.sampler.state_dict()["priorities"], state["priorities"])
    channel.send({"op": "sample", "batch_size": 4})
    reply, leaves, kind = channel.receive()
    assert kind == 0 and reply["batch_size"] == [4]
    sample = dict(zip((tuple(path) for path, _, _ in reply["entries"]), leaves, strict=True))
    assert torch.equal(sample[("obs",)], sample[("index",)].float())
    channel.send({"op": "close"})


def test_an_error_of_a_subclass_keeps_its_class_over_the_channel():
    # ShapeMismatchError (a ValueError) arrived as RuntimeError("ShapeMismatchError: ..."), which
    # an `except ValueError:` does not catch
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    rb.extend(TensorDict({"obs": torch.zeros(2, 3)}, [2]))
    host = ChannelHost(lambda: rb, "127.0.0.1")
    channel = Channel.connect(host.open(10.0), timeout=10.0)
    channel.send({"op": "extend", "entries": [[["obs"], "torch.float32", [2, 4]]],
                  "batch_size": [2]}, [torch.zeros(2, 4)])
    reply, _, kind = channel.receive()
    err = error_of(reply)
    assert kind == 1 and type(err) is ShapeMismatchError and isinstance(err, ValueError)
    assert "(2, 4)" in str(err) and len(rb) == 2
    channel.send({"op": "close"})
    assert issubclass(ChannelClosedError, RemoteBufferError)  # a remote call's failure


def test_a_request_that_is_not_one_ends_its_channel_only():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    host = ChannelHost(lambda: rb, "127.0.0.1")
    channels = []
    for _ in range(2):
        where = host.open(10.0)
        channels.append(Channel.connect(where, timeout=10.0))
    broken, healthy = channels
    broken._send_raw(torch.tensor([0, 5], dtype=torch.int64))  # a header, then no JSON
    broken._send_raw(torch.frombuffer(bytearray(b"{oops"), dtype=torch.uint8))
    with pytest.raises(ChannelClosedError):  # its thread has ended: the connection closes
        broken.receive(first_wait=30.0)
    healthy.send({"op": "stats"})
    reply, _, kind = healthy.receive()
    assert kind == 0 and reply["stats"]["size"] == 0


def test_transport_options_are_checked():
    assert check_transport("ray", None) == ("ray", {})
    assert check_transport("distributed", None) == ("distributed",
                                                    {"backend": "gloo", "timeout": 300.0})
    with pytest.raises(ValueError, match="transport must be one of"):
        check_transport("thread", None)
    with pytest.raises(ValueError, match="takes no transport_options"):
        check_transport("auto", {"timeout": 3})
    with pytest.raises(TypeError, match="unexpected transport_options"):
        check_transport("distributed", {"rank": 0})
    with pytest.raises(ValueError, match="backend must be 'gloo'"):
        check_transport("distributed", {"backend": "nccl"})
    for bad in (0, -1.0, True, "10"):
        with pytest.raises(ValueError, match="timeout"):
            check_transport("distributed", {"timeout": bad})


# ---- clients of a served buffer ----------------------------------------------------------------
@pytest.fixture(scope="module")
def served(ray_session):
    with service_backend("ray"), transport_backend("distributed"):
        rb = TensorDictReplayBuffer(storage=partial(LazyTensorStorage, 100), batch_size=4,
                                    service_backend_options={"remote_config": {"num_cpus": 0}},
                                    transport_options={"timeout": 30.0})
    yield rb
    rb.close()


def batch(start: int, n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n),
                       ("next", "r"): torch.arange(start, start + n, dtype=torch.float32)}, [n])


def test_a_client_writes_samples_and_counts_over_its_channel(served):
    assert served.transport_kind == "distributed"
    client = served.client()
    assert isinstance(client, DistributedBufferClient)
    assert not hasattr(client, "shutdown") and not hasattr(client, "close")
    before = served.write_count
    slots = client.extend(batch(100, 8), timeout=30.0)
    assert slots.shape == (8,) and client.write_count == before + 8 == served.write_count
    assert len(client) == len(served)
    sample = client.sample(timeout=30.0)
    assert sample.batch_size == torch.Size([4])
    assert torch.equal(sample["x"].float(), sample["next", "r"])
    assert torch.equal(served[sample["index"]]["x"], sample["x"])


def test_the_layout_is_fixed_by_the_first_calls_and_a_refusal_sends_nothing(served):
    client = served.client()
    client.extend(batch(0, 8))
    count = served.write_count
    with pytest.raises(ValueError, match="fixed extend layout"):
        client.extend(batch(0, 4))
    with pytest.raises(ValueError, match="fixed extend layout"):
        client.extend(TensorDict({"x": torch.arange(8)}, [8]))
    with pytest.raises(TypeError, match="TensorDicts"):
        client.extend(torch.arange(8))
    assert served.write_count == count
    assert client.sample().batch_size == torch.Size([4])
    with pytest.raises(ValueError, match="fixed sample layout"):
        client.sample(5)
    client.extend(batch(8, 8))  # the first layout still goes through
    assert served.write_count == count + 8


def test_errors_of_the_buffer_come_back_with_their_type(ray_session):
    rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 50),
                         sampler=partial(PrioritizedSampler, 50, alpha=1.0, beta=1.0),
                         replay_buffer_cls=TensorDictReplayBuffer, batch_size=3,
                         transport="distributed", transport_options={"timeout": 30.0})
    try:
        client = rb.client()
        client.extend(TensorDict({"x": torch.arange(6.0), "td_error": torch.ones(6)}, [6]))
        sample = client.sample()
        before = rb.state_dict()["_sampler"]["priorities"]
        sample["td_error"] = torch.full((3,), -1.0)
        with pytest.raises(ValueError, match="finite and >= 0"):
            client.update_tensordict_priority(sample)
        assert torch.equal(rb.state_dict()["_sampler"]["priorities"], before)
        sample["td_error"] = torch.full((3,), 4.0)
        client.update_tensordict_priority(sample)  # the channel still works after an error
        after = rb.state_dict()["_sampler"]["priorities"]
        assert after[sample["index"]].tolist() == pytest.approx([4.0] * 3)
    finally:
        rb.close()


def test_a_client_adds_one_item_and_reads_dim_extend_as_torchrls(served):
    # DistributedBufferClient had no add and no dim_extend (TorchRL's client has both)
    client = served.client()
    before = len(client)
    slot = client.add(batch(500, 1)[0])
    assert isinstance(slot, int) and len(client) == before + 1
    assert served[slot]["x"].item() == 500
    assert client.dim_extend == served.dim_extend == 0
    with pytest.raises(ValueError, match="fixed extend layout"):
        client.extend(batch(600, 3))  # (a client that adds writes batches of one)


def test_a_client_sent_to_a_ray_task_opens_its_own_channel(served, ray_session):
    client = served.client()
    client.extend(batch(0, 8))  # this process's channel is open

    @ray_session.remote
    def collect(handle: DistributedBufferClient) -> list[int]:
        return handle.extend(batch(200, 8)).tolist()

    count = served.write_count
    assert len(ray_session.get(collect.remote(client))) == 8
    assert served.write_count == count + 8
    copy = pickle.loads(pickle.dumps(client))  # a copy in this process: its own channel too
    assert copy.sample().batch_size == torch.Size([4])
    client.disconnect()
    assert client.sample().batch_size == torch.Size([4])  # a new channel


def test_the_plain_handle_and_ray_transport_are_unchanged(ray_session):
    rb = ReplayBuffer(storage=partial(LazyTensorStorage, 10), service_backend="ray")
    try:
        assert rb.transport_kind == "ray" and rb.transport_options == {}
        assert type(rb.client()).__name__ == "RayBufferClient"
    finally:
        rb.close()
