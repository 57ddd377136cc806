"""StoreStorage against fakeredis: round trips of every kind of data, buffers and samplers,
state_dict / checkpoints, refusals that leave the storage as it was."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from tensordict import TensorDict, tensorclass

fakeredis = pytest.importorskip("fakeredis")
pytest.importorskip("lupa")  # fakeredis runs tensordict.store's Lua scripts with it
pytest.importorskip("redis")
from fakeredis.aioredis import FakeRedis  # noqa: E402

from tdreplay.core import (  # noqa: E402
    CheckpointError,
    RandomSampler,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from tdreplay.core.checkpoint import verify_checkpoint  # noqa: E402
from tdreplay.core.utils import DataKindMismatchError  # noqa: E402
from tdreplay.samplers import (  # noqa: E402
    PrioritizedSampler,
    SamplerWithoutReplacement,
    SliceSampler,
)
from tdreplay.storages import StoreStorage, StoreStorageCheckpointer  # noqa: E402
from tdreplay.storages import store_storage as store_module  # noqa: E402


@tensorclass
class Step:
    obs: torch.Tensor
    note: str


@tensorclass
class Pos:
    xy: torch.Tensor


@pytest.fixture
def server():
    return fakeredis.FakeServer()


@pytest.fixture
def make(server):
    """``make(max_size, **kwargs)``: a StoreStorage on the test's fake server."""

    def build(max_size: int = 10, **kwargs):
        return StoreStorage(max_size, client=FakeRedis(server=server), **kwargs)

    return build


def rows(n: int, start: int = 0) -> TensorDict:
    td = TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32),
                     ("nested", "act"): torch.arange(2 * n).reshape(n, 2) + 10 * start},
                    [n])
    td["name"] = [f"s{start + i}" for i in range(n)]
    return td


# ---- values written and read back ------------------------------------------------------------
def test_tensor_rows_round_trip(make):
    s = make(8)
    assert not s.initialized and len(s) == 0 and s.store is None
    data = torch.arange(12, dtype=torch.int16).reshape(4, 3)
    s.set(torch.arange(4), data)
    s.set(4, torch.tensor([7, 8, 9], dtype=torch.int16))
    assert s.initialized and len(s) == 5 and s.last_written_row == 4
    out = s.get(torch.tensor([3, 0, 4]))
    assert out.dtype is torch.int16
    assert out.tolist() == [[9, 10, 11], [0, 1, 2], [7, 8, 9]]
    assert s.get(1).tolist() == [3, 4, 5]
    assert s.get(torch.tensor([[0, 1], [4, 4]])).shape == (2, 2, 3)
    assert s[-1].tolist() == [7, 8, 9]
    assert s[1:3].tolist() == [[3, 4, 5], [6, 7, 8]]
    assert s[:].shape == (5, 3)
    assert s.get(torch.tensor([True, False, False, False, True])).tolist() == \
        [[0, 1, 2], [7, 8, 9]]


def test_nested_tensordict_and_non_tensor_entries(make):
    s = make(10)
    s.set(slice(0, 4), rows(4))
    out = s.get(torch.tensor([2, 0]))
    assert isinstance(out, TensorDict) and out.batch_size == (2,)
    assert out["obs"].tolist() == [2.0, 0.0]
    assert out["nested", "act"].tolist() == [[4, 5], [0, 1]]
    assert out["name"] == ["s2", "s0"]
    one = s.get(3)
    assert one.batch_size == () and one["name"] == "s3" and one["obs"].item() == 3.0
    assert s[:]["name"] == ["s0", "s1", "s2", "s3"]


def test_tensorclass_round_trip(make):
    s = make(6)
    s.set(slice(0, 3), Step(obs=torch.arange(6.0).reshape(3, 2), note=["a", "b", "c"],
                            batch_size=[3]))
    out = s.get(torch.tensor([2, 1]))
    assert isinstance(out, Step)
    assert out.obs.tolist() == [[4.0, 5.0], [2.0, 3.0]]
    assert list(out.note) == ["c", "b"]
    assert isinstance(s[0], Step) and s[0].note == "a"


def test_nested_tensorclass_reads_back_as_its_class(make):
    s = make(6)
    td = TensorDict(pos=Pos(xy=torch.ones(3, 2), batch_size=[3]), r=torch.arange(3.0),
                    batch_size=[3])
    s.set(slice(0, 3), td)
    out = s.get(torch.tensor([1]))
    assert isinstance(out["pos"], Pos) and out["pos"].xy.tolist() == [[1.0, 1.0]]


def test_rows_with_batch_dims_of_their_own(make):
    s = make(5)
    s.set(slice(0, 3), TensorDict({"a": torch.arange(12.0).reshape(3, 4)}, [3, 4]))
    out = s.get(torch.tensor([2, 0]))
    assert out.batch_size == (2, 4)
    assert out["a"].tolist() == [[8.0, 9.0, 10.0, 11.0], [0.0, 1.0, 2.0, 3.0]]
    assert s.get(1).batch_size == (4,)


def test_list_of_items_is_stacked(make):
    s = make(5)
    s.set(torch.tensor([0, 1]), [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])])
    assert s[:].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_new_entry_is_added_zero_filled(make):
    s = make(6)
    s.set(slice(0, 2), TensorDict(a=torch.ones(2), batch_size=[2]))
    s.set(slice(2, 4), TensorDict(a=torch.ones(2) * 2, b=torch.full((2,), 5), batch_size=[2]))
    out = s[:]
    assert out["a"].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert out["b"].tolist() == [0, 0, 5, 5]


def test_dtype_cast_on_write(make):
    s = make(4)
    s.set(slice(0, 2), TensorDict(a=torch.zeros(2), batch_size=[2]))
    s.set(slice(2, 4), TensorDict(a=torch.tensor([3, 4]), batch_size=[2]))  # int64 -> float32
    assert s[:]["a"].dtype is torch.float32 and s[:]["a"].tolist() == [0.0, 0.0, 3.0, 4.0]


def test_two_storages_see_one_store(make, server):
    s = make(4)
    s.set(slice(0, 2), torch.tensor([5, 6]))
    from tensordict.store import TensorDictStore

    # (from_store reads the metadata through a connection of its own, which fakeredis has not)
    reader = TensorDictStore(td_id=s.td_id, client=FakeRedis(server=server), batch_size=[4])
    assert reader[slice(0, 2)]["_tensor"].tolist() == [5, 6]
    reader.close()


# ---- buffers and samplers ----------------------------------------------------------------------
def test_wrap_around_through_a_buffer(make):
    rb = ReplayBuffer(storage=make(5), batch_size=3)
    for i in range(3):
        rb.extend(torch.arange(4) + 10 * i)
    assert len(rb) == 5 and rb.write_count == 12
    # rows 0, 1 hold the 11th and 12th items, rows 2-4 the 8th to 10th
    assert rb[:].tolist() == [22, 23, 13, 20, 21]
    assert rb.storage.last_written_row == 1


@pytest.mark.parametrize("sampler", ["random", "without_replacement", "prioritized"])
def test_samplers_draw_written_rows(make, sampler):
    samplers = {"random": lambda: RandomSampler(),
                "without_replacement": lambda: SamplerWithoutReplacement(),
                "prioritized": lambda: PrioritizedSampler(8, alpha=1.0, beta=1.0)}
    rb = TensorDictReplayBuffer(storage=make(8), sampler=samplers[sampler](), batch_size=3)
    data = TensorDict(obs=torch.arange(6.0) * 10, batch_size=[6])
    data["tag"] = [f"t{i}" for i in range(6)]
    rb.extend(data)
    seen = set()
    for _ in range(2):
        batch = rb.sample()
        index = batch["index"]
        assert batch["obs"].tolist() == (index.float() * 10).tolist()
        assert list(batch["tag"]) == [f"t{i}" for i in index.tolist()]
        seen.update(index.tolist())
    assert seen <= set(range(6))
    if sampler == "without_replacement":
        assert seen == set(range(6))  # one epoch covers every row once
    if sampler == "prioritized":
        rb.update_priority(torch.arange(6), torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0]))
        assert set(rb.sample()["index"].tolist()) == {4}


def test_slice_sampler_draws_whole_steps_of_one_episode(make):
    rb = TensorDictReplayBuffer(storage=make(40),
                                sampler=SliceSampler(slice_len=4, traj_key="episode"),
                                batch_size=12)
    episode = torch.arange(30) // 10
    rb.extend(TensorDict(episode=episode, step=torch.arange(30), batch_size=[30]))
    batch = rb.sample()
    for piece in batch.reshape(3, 4).unbind(0):
        assert piece["episode"].unique().numel() == 1
        assert (piece["step"].diff() == 1).all()


# ---- state_dict, dumps / loads -----------------------------------------------------------------
def test_state_dict_names_the_store_and_reconnects(make):
    s = make(10)
    s.set(slice(0, 4), rows(4))
    state = s.state_dict()
    assert state["_td_id"] == s.td_id and state["_len"] == 4 and state["initialized"]
    assert "client" not in state["_store_kwargs"]
    json.dumps(state)  # plain values only
    t = make(10)
    t.load_state_dict(state)
    assert t.td_id == s.td_id and len(t) == 4
    out = t.get(torch.tensor([3, 1]))
    assert out["obs"].tolist() == [3.0, 1.0] and out["name"] == ["s3", "s1"]
    with pytest.raises(KeyError, match="lacks the entries"):  # the schema came with the state
        t.set(4, TensorDict(obs=torch.tensor(1.0), batch_size=[]))


def test_state_dict_round_trip_in_place(make):
    s = make(10)
    s.set(slice(0, 3), torch.arange(3))
    state = s.state_dict()
    s.empty()
    assert len(s) == 0
    s.load_state_dict(state)
    assert len(s) == 3 and s[:].tolist() == [0, 1, 2]


def test_tensor_kind_survives_state_dict(make):
    s = make(5)
    s.set(slice(0, 2), torch.tensor([1.5, 2.5]))
    t = make(5)
    t.load_state_dict(s.state_dict())
    assert isinstance(t[:], torch.Tensor) and t[:].tolist() == [1.5, 2.5]


def test_torchrl_state_without_schema_reads_the_structure_from_the_store(make):
    s = make(5)
    s.set(slice(0, 2), torch.tensor([[1, 2], [3, 4]]))
    state = {k: v for k, v in s.state_dict().items() if k not in ("schema", "max_size")}
    t = make(5)
    t.load_state_dict(state)
    assert t[:].tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="row shape"):
        t.set(slice(2, 3), torch.zeros(1, 3, dtype=torch.int64))


def test_load_state_dict_refusals_leave_the_storage_unchanged(make):
    s = make(10)
    s.set(slice(0, 2), torch.arange(2))
    t = make(10)
    t.set(slice(0, 3), torch.arange(3) + 100)
    before = (t.td_id, len(t), t[:].tolist())
    bad_size = make(4)
    with pytest.raises(ValueError, match="max_size"):
        bad_size.load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match=r"state_dict\['_len'\]"):
        t.load_state_dict({**s.state_dict(), "_len": 11})
    with pytest.raises(ValueError, match="does not hold"):
        t.load_state_dict({**s.state_dict(), "_td_id": "no-such-store"})
    assert (t.td_id, len(t), t[:].tolist()) == before
    assert bad_size.store is None and len(bad_size) == 0


def test_buffer_state_dict_round_trip(make):
    rb = ReplayBuffer(storage=make(6), sampler=SamplerWithoutReplacement(), batch_size=2)
    rb.extend(torch.arange(8))
    restored = ReplayBuffer(storage=make(6), sampler=SamplerWithoutReplacement(), batch_size=2)
    restored.load_state_dict(rb.state_dict())
    assert restored[:].tolist() == rb[:].tolist() == [6, 7, 2, 3, 4, 5]
    assert restored.write_count == 8


def test_storage_dumps_loads_saves_the_rows(tmp_path, make):
    s = make(10)
    s.set(slice(0, 4), rows(4))
    s.dumps(tmp_path / "ckpt")
    snapshot = verify_checkpoint(tmp_path / "ckpt")  # (committed with every file's CRC)
    assert (snapshot / "data").is_dir()
    meta = json.loads((snapshot / "storage.json").read_text())
    assert meta["checkpointer"] == "StoreStorageCheckpointer" and meta["len"] == 4
    # another server: the checkpoint holds the data, not a reference to the first server
    t = StoreStorage(10, client=FakeRedis(server=fakeredis.FakeServer()))
    t.loads(tmp_path / "ckpt")
    assert len(t) == 4 and t.td_id != s.td_id
    out = t[:]
    assert out["obs"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert out["nested", "act"].tolist() == rows(4)["nested", "act"].tolist()
    assert out["name"] == ["s0", "s1", "s2", "s3"]


def test_tensorclass_checkpoint(tmp_path, make):
    s = make(5)
    s.set(slice(0, 2), Step(obs=torch.ones(2, 3), note=["x", "y"], batch_size=[2]))
    s.dumps(tmp_path)
    t = make(5)
    t.loads(tmp_path)
    out = t[:]
    assert isinstance(out, Step) and list(out.note) == ["x", "y"]
    assert out.obs.tolist() == [[1.0] * 3] * 2


def test_buffer_dumps_loads_round_trip(tmp_path, make):
    rb = TensorDictReplayBuffer(storage=make(6), sampler=SamplerWithoutReplacement(),
                                batch_size=2)
    rb.extend(rows(8))
    rb.sample()
    rb.dumps(tmp_path)
    restored = TensorDictReplayBuffer(storage=make(6), sampler=SamplerWithoutReplacement(),
                                      batch_size=2)
    restored.loads(tmp_path)
    assert restored.write_count == 8 and len(restored) == 6
    assert restored[:]["obs"].tolist() == rb[:]["obs"].tolist()
    assert restored[:]["name"] == rb[:]["name"]
    torch.manual_seed(0)
    a = rb.sample()["index"].tolist()
    torch.manual_seed(0)
    b = restored.sample()["index"].tolist()
    assert a == b  # the sampler's epoch was restored with the rows


def test_damaged_checkpoint_is_refused_and_changes_nothing(tmp_path, make):
    s = make(5)
    s.set(slice(0, 3), torch.arange(3.0))
    s.dumps(tmp_path)
    t = make(5)
    t.set(slice(0, 1), torch.tensor([9.0]))
    data_file = next((verify_checkpoint(tmp_path) / "data").rglob("*.memmap"))
    data_file.write_bytes(data_file.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="bytes"):
        t.loads(tmp_path)
    assert len(t) == 1 and t[:].tolist() == [9.0]
    s.dumps(tmp_path)  # whole again
    with pytest.raises(CheckpointError, match="max_size"):
        make(6).loads(tmp_path)


def test_checkpoint_of_other_rows_is_refused(tmp_path, make):
    s = make(5)
    s.set(slice(0, 2), torch.zeros(2, 3))
    s.dumps(tmp_path)
    t = make(5)
    t.set(slice(0, 2), torch.zeros(2, 4))
    with pytest.raises(CheckpointError, match="row shape"):
        t.loads(tmp_path)
    assert len(t) == 2 and t[:].shape == (2, 4)


def test_empty_and_unwritten_checkpoints(tmp_path, make):
    s = make(5)
    s.dumps(tmp_path / "a")
    t = make(5)
    t.set(slice(0, 2), torch.arange(2))
    t.loads(tmp_path / "a")
    assert len(t) == 0


def test_checkpointer_is_default_and_hooks_run(tmp_path, make):
    s = make(5)
    assert isinstance(s.checkpointer, StoreStorageCheckpointer)
    s.register_save_hook(lambda td: td.apply(lambda x: x * 2))
    s.set(slice(0, 2), torch.tensor([1.0, 2.0]))
    s.dumps(tmp_path)
    t = make(5)
    t.loads(tmp_path)
    assert t[:].tolist() == [2.0, 4.0] and s[:].tolist() == [1.0, 2.0]


# ---- empty ------------------------------------------------------------------------------------
def test_empty_forgets_the_rows(make):
    rb = ReplayBuffer(storage=make(5), batch_size=2)
    rb.extend(torch.arange(4))
    revision = rb.storage.revision
    rb.empty()
    assert len(rb) == 0 and rb.storage.revision != revision
    with pytest.raises(IndexError):
        rb.storage.get(torch.tensor([0]))
    rb.extend(torch.tensor([7, 8]))
    assert rb[:].tolist() == [7, 8]


# ---- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("rows_arg", "data", "error", "match"), [
    (slice(2, 4), "text", TypeError, "data is a str"),
    (slice(2, 4), {"obs": torch.zeros(2)}, TypeError, "data is a dict"),
    # (also a ValueError / RuntimeError, as TorchRL raises)
    (slice(2, 4), torch.zeros(2), DataKindMismatchError, "holds tensordict data; data is tensor"),
    (torch.tensor([2, 11]), rows(2), IndexError, "rows must lie in"),
    (torch.tensor([-1, 2]), rows(2), IndexError, "rows must lie in"),
    (12, rows(1)[0], IndexError, "rows 12 is out of range"),
    (torch.tensor([2, 3, 4]), rows(2), ValueError, "rows selects 3 rows but data holds 2"),
    (slice(2, 4), rows(2).exclude("name"), KeyError, "lacks the entries"),
    (slice(2, 4), TensorDict(obs=torch.zeros(2, 3), nested=TensorDict(
        act=torch.zeros(2, 2, dtype=torch.int64), batch_size=[2]), name=["a", "b"],
        batch_size=[2]), ValueError, "entry 'obs' of data has row shape"),
    (slice(2, 4), rows(2).set("obs", torch.tensor([0.5, 1.5], dtype=torch.float64))
     .set(("nested", "act"), torch.full((2, 2), 0.5)), TypeError, "fractional"),
    (slice(2, 4), rows(2).set("name", torch.zeros(2)), TypeError,
     "entry 'name' of data is tensor data"),
])
def test_bad_writes_are_refused_and_change_nothing(make, rows_arg, data, error, match):
    s = make(10)
    s.set(slice(0, 2), rows(2))
    snapshot = (len(s), s[:]["obs"].tolist(), s[:]["name"])
    with pytest.raises(error, match=match):
        s.set(rows_arg, data)
    assert (len(s), s[:]["obs"].tolist(), s[:]["name"]) == snapshot
    assert s.get(torch.arange(2))["nested", "act"].tolist() == [[0, 1], [2, 3]]


def test_refused_first_write_creates_no_store(make):
    s = make(4)
    with pytest.raises(TypeError, match="data is a str"):
        s.set(slice(0, 2), "ab")
    with pytest.raises(IndexError, match="rows"):
        s.set(torch.tensor([3, 4]), torch.zeros(2))
    assert s.store is None and not s.initialized and len(s) == 0


def test_reads_of_unwritten_slots_are_refused(make):
    s = make(5)
    with pytest.raises(RuntimeError, match="never written"):
        s.get(torch.tensor([0]))
    s.set(slice(0, 2), torch.arange(2))
    with pytest.raises(IndexError, match="written"):
        s.get(torch.tensor([1, 2]))
    with pytest.raises(IndexError, match="not written"):
        s.get(3)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"port": "6379"}, ValueError, "port"),
    ({"port": 0}, ValueError, "port"),
    ({"db": -1}, ValueError, "db"),
    ({"host": 1}, TypeError, "host"),
    ({"backend": None}, TypeError, "backend"),
    ({"batch_size": [3]}, ValueError, "batch_size"),
    ({"compilable": 1}, TypeError, "compilable"),
])
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        StoreStorage(4, **kwargs)


def test_bad_max_size():
    with pytest.raises(ValueError, match="max_size"):
        StoreStorage(0)


def test_missing_redis_names_the_extra(monkeypatch):
    find_spec = store_module.importlib.util.find_spec
    monkeypatch.setattr(store_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == "redis" else find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r'pip install "tdreplay-storages\[store\]"'):
        StoreStorage(4)


def test_package_imports_without_redis():
    code = textwrap.dedent("""
        import sys
        sys.modules["redis"] = None  # as if redis were not installed
        import tdreplay.storages
        from tdreplay.storages import StoreStorage
        try:
            StoreStorage(4)
        except ModuleNotFoundError as err:
            print("refused:", err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": ":".join(sys.path)},
                         check=True)
    assert 'refused: StoreStorage needs the redis client' in out.stdout
    assert 'pip install "tdreplay-storages[store]"' in out.stdout
