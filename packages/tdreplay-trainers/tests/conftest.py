"""Shared fixtures: collected batches and a tiny regression problem to train on."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn


def _batches(n_batches: int, frames: int = 4, *, start: int = 0) -> list[TensorDict]:
    """Batches of ``frames`` frames; ``frame`` numbers every frame across batches."""
    out = []
    for b in range(n_batches):
        frame = torch.arange(frames) + start + b * frames
        x = (frame.float() / 10).unsqueeze(-1)
        out.append(TensorDict({"x": x, "y": 2 * x + 1, "frame": frame}, [frames]))
    return out


@pytest.fixture
def batches():
    """``batches(n, frames=4)`` -> list of TensorDict batches with entries x, y, frame."""
    return _batches


class SquaredError(nn.Module):
    """Linear regression loss: ``loss_mse`` and a per-sample ``td_error``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)

    def forward(self, batch: TensorDict) -> TensorDict:
        err = self.linear(batch["x"]).squeeze(-1) - batch["y"].squeeze(-1)
        return TensorDict({"loss_mse": (err**2).mean(), "td_error": err.detach().abs()}, [])


def _make_loss(seed: int = 0) -> SquaredError:
    torch.manual_seed(seed)
    return SquaredError()


@pytest.fixture
def make_loss():
    """``make_loss(seed)`` -> a freshly initialised :class:`SquaredError`."""
    return _make_loss


@pytest.fixture
def loss_module():
    return _make_loss(0)


class WatchedLoss(nn.Module):
    """A loss module that calls ``watch(sub_batch, losses)`` after each forward of ``inner``."""

    def __init__(self, inner: nn.Module, watch) -> None:
        super().__init__()
        self.inner = inner
        self.watch = watch

    def forward(self, batch: TensorDict) -> TensorDict:
        out = self.inner(batch)
        self.watch(batch, out)
        return out


@pytest.fixture
def watched_loss():
    """``watched_loss(inner, watch)`` -> a :class:`WatchedLoss`."""
    return WatchedLoss
