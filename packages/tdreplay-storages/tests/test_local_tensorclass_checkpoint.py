"""A tensorclass defined in a function is restored from a checkpoint in the same process."""

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.core import CheckpointError
from tdreplay.storages import LazyMemmapStorage, LazyTensorStorage


@pytest.mark.parametrize("storage_type", [LazyTensorStorage, LazyMemmapStorage])
def test_local_tensorclass_loads_into_a_fresh_storage(storage_type, tmp_path):
    @tensorclass
    class Local:
        x: torch.Tensor
        td: TensorDict

    data = Local(x=torch.arange(3), td=TensorDict({"c": torch.arange(3) * 10}, [3]),
                 batch_size=[3])
    saved = storage_type(10)
    saved.set(range(3), data)
    saved.dumps(tmp_path / "ck")
    fresh = storage_type(10)
    fresh.loads(tmp_path / "ck")
    out = fresh[:3]
    assert type(out) is Local
    assert out.x.tolist() == [0, 1, 2] and out.td["c"].tolist() == [0, 10, 20]


def test_unknown_local_tensorclass_still_refused(tmp_path):
    import json

    s = LazyTensorStorage(10)

    @tensorclass
    class Gone:
        x: torch.Tensor

    s.set(range(2), Gone(x=torch.arange(2), batch_size=[2]))
    s.write_files(tmp_path / "ck")  # (plain files: a manifest would refuse the edit below)
    meta_files = list((tmp_path / "ck").rglob("storage.json"))
    assert meta_files
    for f in meta_files:  # a checkpoint naming a local class no storage here ever held
        meta = json.loads(f.read_text())
        meta["tensorclass"] = meta["tensorclass"].replace("Gone", "NeverDefined")
        f.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="cannot be imported"):
        LazyTensorStorage(10).loads(tmp_path / "ck")
