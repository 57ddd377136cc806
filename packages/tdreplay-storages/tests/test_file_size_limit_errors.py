"""A file that may not grow (``EFBIG``: a file-size limit, FAT32's 4 GiB; ``ENOSPC``: a full
disk) raises an ``OSError`` with that errno naming the file, and loses nothing committed:
``dumps`` of a tensor storage (torch's ``RuntimeError`` "unable to resize file" before), of a
``CompressedListStorage`` (an ``OSError`` naming no file before), and the first write of a
``LazyMemmapStorage`` (a ``MemoryError`` before). The previous checkpoint stays loadable and
the storage unchanged. The limit is set in a child process (``RLIMIT_FSIZE``, ``SIGXFSZ``
ignored: writes past it fail with ``EFBIG``)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tensordict import TensorDict

resource = pytest.importorskip("resource")  # (POSIX)
if not hasattr(resource, "setrlimit") or not hasattr(resource, "RLIMIT_FSIZE"):
    pytest.skip("setrlimit(RLIMIT_FSIZE) is unavailable", allow_module_level=True)

from tdreplay.core import TensorDictReplayBuffer  # noqa: E402
from tdreplay.storages import (  # noqa: E402
    CompressedListStorage,
    FlatStorageCheckpointer,
    LazyMemmapStorage,
    LazyTensorStorage,
    NestedStorageCheckpointer,
)

LIMIT = 100_000  # bytes a file may hold in the child; a dump of the rows takes 512 kB

CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys, torch
    from tensordict import TensorDict
    from tdreplay.core import TensorDictReplayBuffer
    from tdreplay.storages import LazyMemmapStorage

    root, limit, tests = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sys.path.insert(0, tests)
    from test_file_size_limit_errors import BUILDERS  # (the storages the tests check)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def rows(n, start):
        return TensorDict({"obs": torch.arange(start, start + n * 64, dtype=torch.float32)
                           .reshape(n, 64), "v": torch.arange(start, start + n)}, [n])

    def limited(call):
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        try:
            call()
            return {"raised": None}
        except BaseException as err:
            return {"raised": type(err).__name__, "oserror": isinstance(err, OSError),
                    "errno": getattr(err, "errno", None),
                    "filename": getattr(err, "filename", None), "message": str(err)}
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,
                                                       resource.RLIM_INFINITY))

    out = {}
    for name, build in BUILDERS.items():
        rb = TensorDictReplayBuffer(storage=build())
        rb.extend(rows(10, 0))
        path = os.path.join(root, name)
        rb.dumps(path)                       # the good checkpoint (10 rows)
        rb.extend(rows(2000, 1000))          # 2010 rows: more than a file may hold
        before = rb[:]["obs"].clone()
        out[name] = limited(lambda: rb.dumps(path))
        out[name]["unchanged"] = len(rb) == 2010 and bool((rb[:]["obs"] == before).all())
        out[name]["left"] = sorted(os.listdir(path))

    # the first write of a memory-mapped storage lays out files of max_size rows
    scratch = os.path.join(root, "scratch")
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(4000, scratch_dir=scratch))
    out["first_write"] = limited(lambda: rb.extend(rows(10, 0)))
    out["first_write"]["len"] = len(rb)
    out["first_write"]["left"] = sorted(p for p in os.listdir(scratch)
                                        if p.endswith(".memmap"))
    rb.extend(rows(10, 0))                   # the limit lifted: the write goes through
    out["first_write"]["after"] = rb[:]["v"].tolist()
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def limited_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsize")
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), str(LIMIT),
                           os.path.dirname(os.path.abspath(__file__))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    return root, json.loads(done.stdout.strip().splitlines()[-1])


BUILDERS = {
    "tensor": lambda: LazyTensorStorage(4000),
    "flat": lambda: LazyTensorStorage(4000, checkpointer=FlatStorageCheckpointer()),
    "nested": lambda: LazyTensorStorage(4000, checkpointer=NestedStorageCheckpointer()),
    "memmap": lambda: LazyMemmapStorage(4000),
    "compressed": lambda: CompressedListStorage(4000),
}
FILES = {"tensor": "obs.memmap", "flat": "obs.bin", "nested": "obs.memmap",
         "memmap": "obs.memmap", "compressed": "blobs.bin"}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_dumps_past_a_file_size_limit_raises_oserror_naming_the_file(limited_run, name):
    root, out = limited_run
    found = out[name]
    assert found["raised"] is not None and found["oserror"], found
    assert found["errno"] == errno.EFBIG, found
    assert found["filename"] and found["filename"].endswith(FILES[name]), found
    assert FILES[name] in found["message"]
    assert found["unchanged"]  # the storage is as it was


@pytest.mark.parametrize("name", list(BUILDERS))
def test_the_previous_checkpoint_still_loads_after_a_dumps_past_the_limit(limited_run, name):
    root, out = limited_run
    assert len(out[name]["left"]) == 3  # pointer, lock, the good snapshot: no half-written one
    rb = TensorDictReplayBuffer(storage=BUILDERS[name]())
    rb.loads(root / name)
    assert len(rb) == 10
    assert rb[:]["v"].tolist() == list(range(10))
    assert torch.equal(rb[:]["obs"], torch.arange(640, dtype=torch.float32).reshape(10, 64))


def test_a_first_memmap_write_past_the_limit_raises_oserror_and_changes_nothing(limited_run):
    root, out = limited_run
    found = out["first_write"]
    assert found["raised"] is not None and found["oserror"], found
    assert found["errno"] == errno.EFBIG, found
    assert found["filename"] == str((root / "scratch" / "obs.memmap").resolve()), found
    assert "obs.memmap" in found["message"]
    assert found["len"] == 0 and found["left"] == []  # no file of its left behind
    assert found["after"] == list(range(10))  # and the next write lays it out


def test_an_unrelated_torch_error_is_not_taken_for_a_file_error():
    from tdreplay.core.file_room import torch_file_error

    assert torch_file_error(RuntimeError("unable to mmap 8 bytes from file <x>: Cannot "
                                         "allocate memory (12)"), "w") is None
    found = torch_file_error(RuntimeError("unable to resize file </a/b.memmap> to the right "
                                          f"size: No space left on device ({errno.ENOSPC})"),
                             "w")
    assert isinstance(found, OSError) and found.errno == errno.ENOSPC
    assert found.filename == "/a/b.memmap"


def test_the_memmap_first_write_still_works_without_a_limit(tmp_path):
    rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(10, scratch_dir=tmp_path / "s"))
    rb.extend(TensorDict({"obs": torch.ones(3, 2)}, [3]))
    assert len(rb) == 3
