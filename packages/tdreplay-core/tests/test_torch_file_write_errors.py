"""A checkpoint file written with ``torch.save`` that cannot be written (a full disk, a
file-size limit) raises the ``OSError`` it is, naming the file, not torch's ``RuntimeError``
("unexpected pos"); the previous checkpoint still loads. The limit is set in a child process
(``RLIMIT_FSIZE``, ``SIGXFSZ`` ignored: writes past it fail with ``EFBIG``)."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap

import pytest
import torch

resource = pytest.importorskip("resource")  # (POSIX)

CHILD = textwrap.dedent("""
    import json, resource, signal, sys, torch
    from tdreplay.core import ListStorage, ReplayBuffer

    class Big:  # a registered part whose state is a 400 kB tensor
        def __init__(self, value): self.x = torch.full((100_000,), float(value))
        def state_dict(self): return {"x": self.x}
        def check_state_dict(self, state): pass
        def load_state_dict(self, state): self.x = state["x"]

    path = sys.argv[1]
    rb = ReplayBuffer(storage=ListStorage(8))
    big = Big(1)
    rb.register_stateful("big", big)
    rb.extend([1, 2])
    rb.dumps(path)                      # the good checkpoint
    rb.extend([3])
    big.x.fill_(2.0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
    try:
        rb.dumps(path)
        out = {"raised": None}
    except BaseException as err:
        out = {"raised": type(err).__name__, "oserror": isinstance(err, OSError),
               "errno": getattr(err, "errno", None), "message": str(err)}
    print(json.dumps(out))
""")


def test_a_failed_torch_file_write_raises_oserror_naming_the_file(tmp_path):
    path = tmp_path / "ckpt"
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["raised"] is not None and out["oserror"], out
    assert out["errno"] == errno.EFBIG
    assert "big.pt" in out["message"]
    # the previous checkpoint is the one that loads
    from tdreplay.core import ListStorage, ReplayBuffer

    class Big:
        def __init__(self):
            self.x = None

        def state_dict(self):
            return {"x": self.x}

        def check_state_dict(self, state):
            pass

        def load_state_dict(self, state):
            self.x = state["x"]

    rb = ReplayBuffer(storage=ListStorage(8))
    part = Big()
    rb.register_stateful("big", part)
    rb.loads(path)
    assert rb[:] == [1, 2]
    assert torch.equal(part.x, torch.ones(100_000))


SMALL_CHILD = textwrap.dedent("""
    import json, resource, signal, sys, torch
    from tdreplay.core.checkpoint import save_torch_file

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))
    try:  # a state small enough to stay in the file's buffer until it is closed
        save_torch_file({"x": torch.arange(100)}, sys.argv[1])
        out = {"raised": None}
    except OSError as err:
        out = {"raised": type(err).__name__, "errno": err.errno, "filename": err.filename}
    print(json.dumps(out))
""")


def test_a_failure_when_the_buffered_bytes_are_written_names_the_file(tmp_path):
    path = tmp_path / "state.pt"
    done = subprocess.run([sys.executable, "-c", SMALL_CHILD, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"raised": "OSError", "errno": errno.EFBIG, "filename": str(path)}
