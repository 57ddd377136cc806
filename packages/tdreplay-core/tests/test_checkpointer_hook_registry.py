"""Core's checkpointer hooks: the registry on ``StorageCheckpointerBase``, the forwarding of
``Storage.register_save_hook`` / ``register_load_hook``, how hooks are called, and the base
``Storage.flatten``."""

from __future__ import annotations

import pytest
import torch

from tdreplay.core import ListStorage, ListStorageCheckpointer, ReplayBuffer
from tdreplay.core.checkpoint_hooks import HookList, call_hook


def test_call_hook_passes_only_declared_keywords():
    assert call_hook(lambda d: d * 2, 3, path="p", out=None) == 6
    assert call_hook(lambda d, path: (d, path), 3, path="p", out=None) == (3, "p")
    assert call_hook(lambda d, **kw: sorted(kw), 3, path="p", out=None) == ["out", "path"]
    assert call_hook(len, [1, 2], path="p") == 2  # a builtin: data alone


def test_hook_list_runs_in_order_and_refuses_non_callables():
    hooks = HookList()
    hooks.append(lambda d: d + [1])
    hooks.append(lambda d: d + [2])
    with pytest.raises(TypeError, match="hook must be callable"):
        hooks.append(object())
    assert hooks.run([]) == [1, 2] and len(hooks) == 2


def test_list_storage_hooks_live_on_its_checkpointer(tmp_path):
    storage = ListStorage(4)
    storage.register_save_hook(lambda items: [x * 3 for x in items])
    assert len(storage.checkpointer.save_hooks) == 1
    storage.set(torch.arange(2), [1, 2])
    storage.dumps(tmp_path)
    target = ListStorage(4)
    target.register_load_hook(lambda items: [x - 1 for x in items])
    target.loads(tmp_path)
    assert target[:] == [2, 5] and storage[:] == [1, 2]


def test_a_raising_list_load_hook_changes_nothing(tmp_path):
    storage = ListStorage(4)
    storage.set(torch.arange(2), [1, 2])
    storage.dumps(tmp_path)
    target = ListStorage(4)
    target.set(0, "kept")
    target.register_load_hook(lambda items: items[10])
    with pytest.raises(IndexError):
        target.loads(tmp_path)
    assert target[:] == ["kept"]


def test_buffer_save_hook_reaches_the_list_checkpointer_with_shift(tmp_path):
    class Hook:
        shift = is_full = None

        def __call__(self, items, path=None):
            self.path = path
            return items

    ckpt, hook = ListStorageCheckpointer(), Hook()
    rb = ReplayBuffer(storage=ListStorage(3, checkpointer=ckpt))
    rb.register_save_hook(hook)
    rb.extend([1, 2, 3, 4])
    rb.dumps(tmp_path)
    assert ckpt.save_hooks == (hook,)
    assert (hook.shift, hook.is_full) == (1, True)
    assert hook.path.name == "storage" and hook.path.parent.parent == tmp_path


def test_base_flatten():
    storage = ListStorage(3)
    assert storage.flatten() is storage
    storage.ndim = 3
    with pytest.raises(RuntimeError, match="ndim > 1"):
        storage.flatten()
