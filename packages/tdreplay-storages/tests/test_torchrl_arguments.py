"""TorchRL's constructor arguments accepted by the storages (issue 16)."""

import gc
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from tensordict import TensorDict

from tdreplay.core import ListStorage, ReplayBuffer
from tdreplay.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    TensorStorage,
)

FACTORIES = {
    "list": lambda **kw: ListStorage(10, **kw),
    "tensor": lambda **kw: TensorStorage(TensorDict({"x": torch.zeros(10)}, [10]), **kw),
    "lazy_tensor": lambda **kw: LazyTensorStorage(10, **kw),
    "memmap": lambda **kw: LazyMemmapStorage(10, **kw),
    "lazy_stack": lambda **kw: LazyStackStorage(10, **kw),
    "compressed": lambda **kw: CompressedListStorage(10, **kw),
}


@pytest.mark.parametrize("kind", sorted(FACTORIES))
@pytest.mark.parametrize("compilable", [False, True])
def test_compilable_is_accepted_and_changes_nothing(kind, compilable):
    storage = FACTORIES[kind](compilable=compilable)
    assert storage.compilable is compilable
    rb = ReplayBuffer(storage=storage, batch_size=3)
    data = TensorDict({"x": torch.arange(12.0)}, [12])
    rb.extend(data)
    assert len(rb) == 10
    got = rb[:]
    rows = got["x"] if not isinstance(got, list) else torch.stack([r["x"] for r in got])
    # the round-robin writer wrapped: rows 0 and 1 hold items 10 and 11
    assert rows.tolist() == [10.0, 11.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_compilable_must_be_a_bool(kind):
    with pytest.raises(TypeError, match="compilable"):
        FACTORIES[kind](compilable="yes")


def test_lazy_stack_storage_without_max_size_is_unbounded():
    storage = LazyStackStorage()
    assert storage.max_size == 2**63 - 1
    rb = ReplayBuffer(storage=storage)
    for i in range(1500):  # past the 1000 of a ListStorage's default
        rb.add(TensorDict(a=torch.full((i % 3 + 1,), float(i))))
    assert len(rb) == 1500
    assert rb[1499]["a"].tolist() == [1499.0] * 3  # 1499 % 3 + 1 steps
    assert rb[0]["a"].tolist() == [0.0]


def test_list_storage_max_size_none_is_unbounded():
    assert ListStorage(None).max_size == 2**63 - 1
    # TorchRL 0.14's default: ListStorage() is unbounded, a bare buffer's storage holds 1000
    storage = ListStorage()
    assert storage.max_size == 2**63 - 1
    rb = ReplayBuffer(storage=storage)
    rb.extend(range(1500))  # nothing overwritten past 1000
    assert len(rb) == 1500 and rb[0] == 0 and rb[1499] == 1499
    assert ReplayBuffer().storage.max_size == 1000


# ---- LazyMemmapStorage(auto_cleanup=) ---------------------------------------------------------
def _written_memmap(**kw):
    storage = LazyMemmapStorage(20, **kw)
    ReplayBuffer(storage=storage).extend(TensorDict({"a": torch.arange(4.0)}, [4]))
    return storage


def test_auto_cleanup_defaults_as_torchrl(tmp_path):
    assert LazyMemmapStorage(10).auto_cleanup is True  # a temporary directory goes with it
    assert LazyMemmapStorage(10, scratch_dir=tmp_path / "a").auto_cleanup is False
    assert LazyMemmapStorage(10, scratch_dir=tmp_path / "b", auto_cleanup=True).auto_cleanup
    assert LazyMemmapStorage(10, auto_cleanup=False).auto_cleanup is False
    with pytest.raises(TypeError, match="auto_cleanup"):
        LazyMemmapStorage(10, auto_cleanup="yes")


def test_cleanup_removes_the_scratch_dir_once(tmp_path):
    storage = _written_memmap(scratch_dir=tmp_path / "s")
    assert (tmp_path / "s").is_dir()
    assert storage.cleanup() is True
    assert not (tmp_path / "s").exists()
    assert storage.cleanup() is False  # nothing left


def test_cleanup_of_a_never_written_or_vanished_storage_reports_nothing_removed(tmp_path):
    assert LazyMemmapStorage(10, auto_cleanup=True).cleanup() is False
    storage = _written_memmap(scratch_dir=tmp_path / "s")
    shutil.rmtree(tmp_path / "s")
    assert storage.cleanup() is False


def test_auto_cleanup_removes_a_given_dir_when_the_storage_goes(tmp_path):
    storage = _written_memmap(scratch_dir=tmp_path / "s", auto_cleanup=True)
    del storage
    gc.collect()
    assert not (tmp_path / "s").exists()


def test_a_given_dir_is_kept_by_default(tmp_path):
    storage = _written_memmap(scratch_dir=tmp_path / "s")
    del storage
    gc.collect()
    assert (tmp_path / "s").is_dir()
    reopened = LazyMemmapStorage(20, scratch_dir=tmp_path / "s", existsok=True)
    assert reopened[:]["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("how", ["exit", "sigint"])
def test_auto_cleanup_at_exit_and_on_ctrl_c(tmp_path, how):
    scratch = tmp_path / "s"
    # A shell started in the background (nohup, `cmd &`) hands its children SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler; a program run from a terminal has one.
    script = (
        "import signal, time, torch\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from tensordict import TensorDict\n"
        "from tdreplay.core import ReplayBuffer\n"
        "from tdreplay.storages import LazyMemmapStorage\n"
        f"s = LazyMemmapStorage(10, scratch_dir={str(scratch)!r}, auto_cleanup=True)\n"
        "ReplayBuffer(storage=s).extend(TensorDict(a=torch.zeros(3), batch_size=[3]))\n"
        "print('READY', flush=True)\n"
        + ("time.sleep(60)\n" if how == "sigint" else ""))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        if how == "sigint":
            assert scratch.is_dir()
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not scratch.exists()


def test_a_used_scratch_dir_is_refused_with_torchrls_error_type_too(tmp_path):
    from tdreplay.storages.memmap_storage import ScratchDirInUseError
    _written_memmap(scratch_dir=tmp_path / "s")
    for error in (ScratchDirInUseError, FileExistsError, RuntimeError):
        with pytest.raises(error, match="existsok"):
            LazyMemmapStorage(20, scratch_dir=tmp_path / "s")
    assert LazyMemmapStorage(20, scratch_dir=tmp_path / "s", existsok=True)[:]["a"].numel() == 4


def test_a_tensor_storage_without_data_or_max_size_raises_torchrls_message():
    from tdreplay.storages import TensorStorage
    with pytest.raises(ValueError, match="Expected storage to be non-null"):
        TensorStorage(None)


def test_a_list_of_items_of_different_shapes_is_refused_and_nothing_is_written():
    from tdreplay.core import ReplayBuffer
    rb = ReplayBuffer(storage=LazyMemmapStorage(10))
    rb.extend([torch.zeros(4), torch.ones(4)])
    with pytest.raises(RuntimeError, match="Stacking the elements of the list resulted in an error"):
        rb.extend([torch.zeros(4), torch.zeros(1)])
    assert len(rb) == 2
    assert torch.equal(rb[:], torch.stack([torch.zeros(4), torch.ones(4)]))


def test_a_max_size_that_contradicts_the_storage_passed_raises_torchrls_message():
    from tdreplay.storages import TensorStorage
    with pytest.raises(ValueError, match="The max-size and the storage shape mismatch"):
        TensorStorage(torch.randn(3), max_size=4)
    assert len(TensorStorage(torch.randn(3), max_size=3)) == 3
