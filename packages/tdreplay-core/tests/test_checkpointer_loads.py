"""``StorageCheckpointerBase.loads(storage, path)``: TorchRL's entry point on tdreplay's
checkpointers, and checkpointers written for TorchRL (``dumps`` + ``loads``) on tdreplay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tdreplay.core import (
    CheckpointError,
    ListStorage,
    ListStorageCheckpointer,
    ReplayBuffer,
    StorageCheckpointerBase,
)
from tdreplay.core.checkpoint import POINTER_NAME, verify_checkpoint


def test_loads_on_the_checkpointer_restores_the_storage(tmp_path: Path) -> None:
    saved = ListStorage(4)
    saved.set(torch.arange(3), ["a", "b", "c"])
    saved.dumps(tmp_path)
    target = ListStorage(4)
    before = target.revision
    ListStorageCheckpointer().loads(target, str(tmp_path))
    assert target.get(torch.arange(3)) == ["a", "b", "c"]
    assert target.revision != before


def test_loads_of_a_damaged_checkpoint_changes_nothing(tmp_path: Path) -> None:
    saved = ListStorage(4)
    saved.set(torch.arange(2), [1, 2])
    saved.dumps(tmp_path)
    (verify_checkpoint(tmp_path) / "items.pt").write_bytes(b"not a torch file")
    target = ListStorage(4)
    target.set(0, "kept")
    with pytest.raises(CheckpointError):
        ListStorageCheckpointer().loads(target, tmp_path)
    assert target.items() == ["kept"]


class _TorchRLStyle(StorageCheckpointerBase):
    """A checkpointer as written for TorchRL: ``dumps`` and ``loads`` only."""

    def __init__(self) -> None:
        self.loaded: list[Path] = []

    def dumps(self, storage: Any, path: Path) -> None:
        (Path(path) / "items.txt").write_text(",".join(str(x) for x in storage.items()))

    def loads(self, storage: Any, path: Any) -> None:
        self.loaded.append(Path(path))
        items = [int(x) for x in (Path(path) / "items.txt").read_text().split(",")]
        storage.replace_items(items)


def test_a_torchrl_style_checkpointer_saves_and_restores_a_buffer(tmp_path: Path) -> None:
    rb = ReplayBuffer(storage=ListStorage(8, checkpointer=_TorchRLStyle()))
    rb.extend([3, 4, 5])
    rb.dumps(tmp_path / "ckpt")
    checkpointer = _TorchRLStyle()
    restored = ReplayBuffer(storage=ListStorage(8, checkpointer=checkpointer))
    restored.loads(tmp_path / "ckpt")
    assert restored[:] == [3, 4, 5]
    assert len(checkpointer.loaded) == 1
    assert restored.writer.cursor == 3  # the writer's part of the checkpoint came back too


def test_a_checkpointer_without_either_load_method_says_so(tmp_path: Path) -> None:
    class DumpsOnly(StorageCheckpointerBase):
        def dumps(self, storage: Any, path: Path) -> None:
            (Path(path) / "x").write_text("x")

    storage = ListStorage(4, checkpointer=DumpsOnly())
    storage.set(0, 1)
    storage.dumps(tmp_path)
    with pytest.raises(NotImplementedError, match="DumpsOnly implements neither"):
        storage.loads(tmp_path)
    assert storage.items() == [1]


def test_rows_of_one_batch_are_saved_once_and_share_it_again(tmp_path):
    # (each row pickled the whole batch it is a view of: 32 KB of rows made a 64.7 MB
    # checkpoint at 2,000 rows, and every loaded row held a copy of the batch)
    from tensordict import TensorDict

    n = 2000
    batch = TensorDict({"obs": torch.randn(n, 4)}, [n])  # 32 KB
    saved = ListStorage(n)
    saved.set(torch.arange(n), list(batch.unbind(0)))
    saved.dumps(tmp_path)
    assert (verify_checkpoint(tmp_path) / "items.pt").stat().st_size < 2_000_000
    target = ListStorage(n)
    target.loads(tmp_path)
    rows = target.get(torch.arange(n))
    assert torch.equal(torch.stack([row["obs"] for row in rows]), batch["obs"])
    bases = {row["obs"].untyped_storage().data_ptr() for row in rows}
    assert len(bases) == 1  # one batch behind the rows, as saved


def test_a_checkpoint_of_0_4_0_pickled_items_loads(tmp_path):
    import pickle

    from tdreplay.core.checkpoint import write_json

    # the layout ListStorageCheckpointer wrote in 0.4.0: items.pkl and storage.json
    with open(tmp_path / "items.pkl", "wb") as f:
        pickle.dump(["a", torch.arange(3)], f)
    write_json(tmp_path / "storage.json", {"class": "ListStorage", "max_size": 4, "len": 2})
    target = ListStorage(4)
    target.checkpointer.prepare_load(target, tmp_path)()
    first, second = target.get(torch.arange(2))
    assert first == "a" and torch.equal(second, torch.arange(3))


# ---- storage.dumps / storage.loads: one atomic, checked checkpoint --------------------------
def test_a_failed_storage_dumps_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    import tdreplay.core.storage_checkpointer as storage_checkpointer

    old = ListStorage(4)
    old.set(torch.arange(2), [1, 2])
    old.dumps(tmp_path)
    new = ListStorage(4)
    new.set(torch.arange(3), [7, 8, 9])

    def full_disk(path, obj):  # items.pt is written, then storage.json fails
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(storage_checkpointer, "write_json", full_disk)
    with pytest.raises(OSError, match="No space left"):
        new.dumps(tmp_path)
    monkeypatch.undo()
    target = ListStorage(4)
    target.loads(tmp_path)
    assert target.items() == [1, 2]


def test_a_failed_first_save_over_files_of_an_earlier_version_keeps_them(tmp_path):
    old = ListStorage(4)
    old.set(torch.arange(2), [1, 2])
    old.write_files(tmp_path)  # the layout of earlier versions: the files in the path itself
    new = ListStorage(4)
    new.set(torch.arange(3), [7, 8, 9])
    new.register_save_hook(lambda items: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        new.dumps(tmp_path)
    target = ListStorage(4)
    target.loads(tmp_path)
    assert target.items() == [1, 2]


def test_storage_loads_refuses_a_damaged_file_by_name(tmp_path):
    saved = ListStorage(4)
    saved.set(torch.arange(3), [torch.arange(5), torch.ones(5), "x"])
    saved.dumps(tmp_path)
    items = verify_checkpoint(tmp_path) / "items.pt"
    data = bytearray(items.read_bytes())
    data[len(data) // 2] ^= 0x01
    items.write_bytes(bytes(data))
    target = ListStorage(4)
    target.set(0, "kept")
    with pytest.raises(CheckpointError, match=r"items\.pt' is corrupted \(CRC-32 mismatch\)"):
        target.loads(tmp_path)
    assert target.items() == ["kept"]


def test_a_storage_saved_inside_a_buffer_checkpoint_writes_plainly(tmp_path):
    from tdreplay.core.checkpoint import POINTER_NAME

    rb = ReplayBuffer(storage=ListStorage(4))
    rb.extend([1, 2])
    rb.dumps(tmp_path)
    storage_dir = verify_checkpoint(tmp_path) / "storage"
    assert sorted(p.name for p in storage_dir.iterdir()) == ["items.pt", "seam.json",
                                                            "storage.json"]
    assert not (storage_dir / POINTER_NAME).exists()


def test_a_checkpoint_of_another_storage_class_names_it(tmp_path):
    from tdreplay.core import Storage

    class Rows(Storage):  # a storage of one's own: StateDictCheckpointer records its class
        def __init__(self, max_size):
            super().__init__(max_size)
            self.rows = {}

        def set(self, cursor, data, *, set_cursor=True):
            self.rows.update(zip(torch.as_tensor(cursor).reshape(-1).tolist(), data))

        def get(self, index):
            return [self.rows[i] for i in torch.as_tensor(index).reshape(-1).tolist()]

        def __len__(self):
            return len(self.rows)

        def empty(self):
            self.rows = {}

        def state_dict(self):
            return {"rows": dict(self.rows)}

        def load_state_dict(self, state_dict):
            self.rows = dict(state_dict["rows"])

    saved = Rows(4)
    saved.set(torch.arange(2), ["a", "b"])
    saved.dumps(tmp_path)
    target = ListStorage(4)
    target.set(0, "kept")
    with pytest.raises(CheckpointError, match="written by a Rows; load it into a Rows"):
        target.loads(tmp_path)
    assert target.items() == ["kept"]


def test_a_checkpointer_with_a_loads_of_its_own_gets_its_files_in_the_path(tmp_path):
    # storage.dumps wrote them into a snapshot of the path, where the checkpointer's own
    # loads(storage, path), written TorchRL's way, did not find them (FileNotFoundError)
    class Squares(StorageCheckpointerBase):
        def dumps(self, storage, path):
            (Path(path) / "n.txt").write_text(str(len(storage)))

        def loads(self, storage, path):
            n = int((Path(path) / "n.txt").read_text())
            storage.set(torch.arange(n), [i * i for i in range(n)])

    saved = ListStorage(8, checkpointer=Squares())
    saved.set(torch.arange(3), [0, 0, 0])
    saved.dumps(tmp_path)
    assert (tmp_path / "n.txt").read_text() == "3"
    restored = ListStorage(8, checkpointer=Squares())
    restored.checkpointer.loads(restored, tmp_path)
    assert restored[:] == [0, 1, 4]


def test_a_first_save_that_did_not_finish_is_named_not_a_missing_storage_json(tmp_path):
    # it said "checkpoint file '.../storage.json' is missing"
    storage = ListStorage(4)
    storage.set(torch.arange(2), ["a", "b"])
    storage.dumps(tmp_path)
    (tmp_path / POINTER_NAME).unlink()  # as a save killed before its first commit leaves it
    target = ListStorage(4)
    with pytest.raises(CheckpointError, match=POINTER_NAME + " is missing"):
        target.loads(tmp_path)
    assert len(target) == 0


def test_plain_files_of_an_earlier_version_are_not_loaded_once_a_snapshot_lost_its_pointer(
        tmp_path):
    # it loaded the older plain files silently: [1, 2] instead of the saved [7, 8, 9]
    old = ListStorage(4)
    old.set(torch.arange(2), [1, 2])
    old.write_files(tmp_path)
    new = ListStorage(4)
    new.set(torch.arange(3), [7, 8, 9])
    new.dumps(tmp_path)
    (tmp_path / POINTER_NAME).unlink()
    target = ListStorage(4)
    target.set(0, "kept")
    with pytest.raises(CheckpointError, match=POINTER_NAME + " is missing"):
        target.loads(tmp_path)
    with pytest.raises(CheckpointError, match=POINTER_NAME + " is missing"):
        ListStorageCheckpointer().loads(target, tmp_path)
    assert target.items() == ["kept"]
