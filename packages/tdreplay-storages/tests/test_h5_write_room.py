"""``H5StorageCheckpointer`` checks the room for its file before HDF5 writes it: the HDF5
library crashes the process (SIGSEGV) on some failed writes, where ``dumps`` now raises the
``OSError`` naming the file and the previous checkpoint stays. The failure is a file-size limit
set in a child process (``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored: writes past it fail with
``EFBIG``, as they fail with ``ENOSPC`` on a full disk)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("h5py")
pytest.importorskip("resource")

CHILD = textwrap.dedent("""
    import json, resource, signal, sys, torch
    from tensordict import TensorDict
    from tdreplay.core import TensorDictReplayBuffer
    from tdreplay.storages import H5StorageCheckpointer, LazyTensorStorage

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(
        1000, checkpointer=H5StorageCheckpointer()))
    rb.extend(TensorDict({"obs": torch.arange(1000.0)[:, None].expand(1000, 8).clone()},
                         [1000]))
    if sys.argv[2] == "limit":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        rb.extend(TensorDict({"obs": torch.full((10, 8), -1.0)}, [10]))
    try:
        rb.dumps(sys.argv[1])
        out = {"raised": None}
    except BaseException as err:
        out = {"raised": type(err).__name__, "oserror": isinstance(err, OSError),
               "errno": getattr(err, "errno", None), "message": str(err)}
    print(json.dumps(out))
""")


def _run(path, mode):
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # (-11: SIGSEGV)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_file_without_room_raises_oserror_and_keeps_the_previous_checkpoint(tmp_path):
    from tdreplay.core import TensorDictReplayBuffer
    from tdreplay.storages import H5StorageCheckpointer, LazyTensorStorage

    path = tmp_path / "ckpt"
    assert _run(path, "plain") == {"raised": None}
    out = _run(path, "limit")
    assert out["oserror"] and out["errno"] == errno.EFBIG, out
    assert "checkpoint.h5" in out["message"]
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(
        1000, checkpointer=H5StorageCheckpointer()))
    rb.loads(path)
    assert torch.equal(rb[:]["obs"][:, 0], torch.arange(1000.0))
