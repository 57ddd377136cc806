"""``service_backend=`` / ``transport=`` and the ``service_backend`` / ``transport_backend``
context managers (tdreplay.core.service_backends)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tdreplay.core import (
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
    register_service_backend,
    service_backend,
    transport_backend,
)
from tdreplay.core import service_backends as sb


class _Served:
    """What the fake backend returns: the arguments it was called with."""

    service_backend = "fake"

    def __init__(self, buffer_cls, options, transport, transport_options, kwargs):
        self.buffer_cls, self.options = buffer_cls, options
        self.transport, self.transport_options, self.kwargs = transport, transport_options, kwargs


@pytest.fixture(autouse=True)
def fake_backend():
    register_service_backend("fake", _Served)
    yield
    sb._registry.pop("fake", None)  # noqa: SLF001 - the test's own registration


def test_direct_is_the_default_and_builds_the_buffer() -> None:
    rb = ReplayBuffer(storage=ListStorage(4), service_backend="direct", transport="direct")
    assert type(rb) is ReplayBuffer and rb.service_backend == "direct"
    assert rb.extend([torch.tensor(1.0)]).tolist() == [0]


def test_a_backend_gets_the_class_and_arguments() -> None:
    storage = ListStorage(4)
    served = TensorDictReplayBuffer(storage=storage, batch_size=2, service_backend="fake",
                                    service_backend_options={"remote_config": {"num_cpus": 0}},
                                    transport="ray", transport_options={"timeout": 3.0})
    assert isinstance(served, _Served)
    assert served.buffer_cls is TensorDictReplayBuffer
    assert served.kwargs == {"storage": storage, "batch_size": 2}
    assert served.options == {"remote_config": {"num_cpus": 0}}
    assert (served.transport, served.transport_options) == ("ray", {"timeout": 3.0})


def test_contexts_set_defaults_explicit_arguments_win_and_they_are_restored() -> None:
    with service_backend("fake"), transport_backend("distributed"):
        served = ReplayBuffer(storage=ListStorage(4))
        direct = ReplayBuffer(storage=ListStorage(4), service_backend="direct",
                              transport="auto")
        assert served.transport == "distributed"
        with service_backend("direct"):
            assert type(ReplayBuffer(transport="auto")) is ReplayBuffer
            with pytest.raises(ValueError, match="selected by an enclosing transport_backend"):
                ReplayBuffer()
        assert isinstance(ReplayBuffer(), _Served)
    assert isinstance(served, _Served) and type(direct) is ReplayBuffer
    assert type(ReplayBuffer()) is ReplayBuffer  # restored on exit


def _build_in_child(queue):
    queue.put(type(ReplayBuffer(storage=ListStorage(2))).__name__)


def test_forked_child_does_not_inherit_the_context() -> None:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with service_backend("fake"):
        child = ctx.Process(target=_build_in_child, args=(queue,))
        child.start()
        child.join()
    assert queue.get(timeout=10) == "ReplayBuffer"


def test_a_backend_building_a_buffer_here_builds_a_direct_one() -> None:
    register_service_backend("local", lambda cls, o, t, to, kw: cls(**kw))
    try:
        with service_backend("local"):
            rb = ReplayBuffer(storage=ListStorage(3))
        assert type(rb) is ReplayBuffer and len(rb) == 0
    finally:
        sb._registry.pop("local", None)  # noqa: SLF001


def test_direct_buffers_refuse_remote_only_arguments() -> None:
    with pytest.raises(ValueError, match="only supports transport='auto' or 'direct'"):
        ReplayBuffer(transport="ray")
    with pytest.raises(ValueError, match="transport_options are only valid"):
        ReplayBuffer(transport_options={"timeout": 1.0})
    with pytest.raises(ValueError, match="service_backend_options are only valid"):
        ReplayBuffer(service_backend_options={"remote_config": {}})
    with pytest.raises(ValueError, match="Unsupported transport backend 'pigeon'"):
        ReplayBuffer(transport="pigeon")
    with pytest.raises(ValueError, match="Unsupported transport backend"), \
            transport_backend("pigeon"):
        pass
    with pytest.raises(TypeError, match="service_backend must be a non-empty str"):
        ReplayBuffer(service_backend=3)


def test_unknown_and_uninstalled_backends_say_what_to_do(monkeypatch) -> None:
    with pytest.raises(ValueError, match="Unsupported service backend 'nope'.*'direct'"):
        ReplayBuffer(service_backend="nope")
    # as if tdreplay-distributed were not installed: no entry point provides "ray"
    monkeypatch.setattr(sb.metadata, "entry_points", lambda group: [])
    monkeypatch.delitem(sb._registry, "ray", raising=False)  # noqa: SLF001
    with pytest.raises(ImportError, match=r'needs tdreplay-distributed.*pip install '
                                          r'"tdreplay\[distributed\]"'):
        ReplayBuffer(storage=ListStorage(4), service_backend="ray")


def test_entry_points_are_loaded_on_first_use(monkeypatch) -> None:
    class Entry:  # what importlib.metadata lists for an installed package's entry point
        name = "viaentry"
        loads = 0

        def load(self):
            Entry.loads += 1
            return _Served

    entry = Entry()
    monkeypatch.setattr(sb.metadata, "entry_points",
                        lambda group: [entry] if group == sb.ENTRY_POINT_GROUP else [])
    try:
        assert isinstance(ReplayBuffer(service_backend="viaentry"), _Served)
        assert isinstance(ReplayBuffer(service_backend="viaentry"), _Served)
        assert Entry.loads == 1  # loaded once, then registered
    finally:
        sb._registry.pop("viaentry", None)  # noqa: SLF001


def test_register_refuses_bad_backends() -> None:
    with pytest.raises(ValueError, match="direct"):
        register_service_backend("direct", _Served)
    with pytest.raises(TypeError, match="callable"):
        register_service_backend("x", 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        register_service_backend("", _Served)


def test_positional_arguments_go_to_the_backend_refused() -> None:
    with pytest.raises(TypeError, match="keyword arguments only"):
        ReplayBuffer(ListStorage(4), service_backend="fake")  # type: ignore[misc]


def test_direct_service_lifecycle_as_torchrl() -> None:
    rb = ReplayBuffer(storage=ListStorage(4), service_backend="direct")
    assert rb.client() is rb and rb.start() is rb and rb.is_alive
    rb.extend([torch.tensor(1.0)])
    rb.shutdown()
    rb.shutdown(timeout=1.0)  # twice is fine
    assert not rb.is_alive and len(rb) == 1
    with pytest.raises(RuntimeError, match="cannot be restarted"):
        rb.start()
