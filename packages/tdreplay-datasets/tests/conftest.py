"""Small Minari datasets built locally from gymnasium environments; the network is off."""

from __future__ import annotations

import socket
import warnings
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
from gymnasium import spaces
from minari.data_collector import EpisodeBuffer

CARTPOLE_ID = "cartpole/tiny-v0"
DICT_ID = "dictenv/tiny-v0"
DICT_ENV_ID = "tdreplay-test/DictEnv-v0"


class DictEnv(gym.Env):
    """A point moving towards a goal: a Dict observation (with a text entry) and an info dict
    (numbers, a nested ``state`` and a text entry)."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Dict({
            "position": spaces.Box(-10.0, 10.0, (2,), np.float32),
            "goal": spaces.Discrete(4),
            "label": spaces.Text(max_length=6),
        })
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self._goals = np.array([[2, 2], [-2, 2], [-2, -2], [2, -2]], np.float32)

    def _obs(self) -> dict:
        return {"position": self._pos.copy(), "goal": int(self._goal),
                "label": f"g{int(self._goal)}"}

    def _info(self, phase: str) -> dict:
        distance = float(np.linalg.norm(self._pos - self._goals[self._goal]))
        return {"distance": np.float64(distance), "success": bool(distance < 1.0),
                "state": {"qpos": np.array([*self._pos, distance])}, "phase": phase}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self._goal = int(self.np_random.integers(4))
        return self._obs(), self._info("reset")

    def step(self, action):
        self._pos = np.clip(self._pos + np.asarray(action, np.float32), -10, 10).astype(np.float32)
        obs, info = self._obs(), self._info("step")
        return obs, -info["distance"], bool(info["success"]), False, info


gym.register(DICT_ENV_ID, entry_point=DictEnv, max_episode_steps=6)


def _stack(items: list):
    """Per-step values (dicts of arrays, numbers or strings) stacked along a new first axis."""
    if isinstance(items[0], dict):
        return {key: _stack([item[key] for item in items]) for key in items[0]}
    if isinstance(items[0], str):
        return list(items)
    return np.stack([np.asarray(item) for item in items])


def collect(env: gym.Env, seeds: list[int], policy) -> list[EpisodeBuffer]:
    """Run one episode per seed with ``policy(env, seed)``; Minari episode buffers (ids 0, 1...)."""
    episodes = []
    for episode_id, seed in enumerate(seeds):
        obs, info = env.reset(seed=seed)
        env.action_space.seed(seed)
        observations, infos, actions, rewards, terminations, truncations = [obs], [info], [], [], [], []
        done = False
        while not done:
            action = policy(env, seed)
            obs, reward, terminated, truncated, info = env.step(action)
            observations.append(obs)
            infos.append(info)
            actions.append(action)
            rewards.append(reward)
            terminations.append(terminated)
            truncations.append(truncated)
            done = terminated or truncated
        episodes.append(EpisodeBuffer(
            id=episode_id, observations=_stack(observations), actions=np.stack(actions),
            rewards=np.array(rewards, np.float64), terminations=np.array(terminations),
            truncations=np.array(truncations), infos=_stack(infos) if info else {}))
    return episodes


def make_cartpole(dataset_id: str = CARTPOLE_ID, seeds: tuple[int, ...] = (0, 1, 2, 3, 4)):
    """CartPole episodes of at most 12 steps: even seeds push left (the pole falls:
    terminated), odd ones act at random (mostly truncated)."""
    env = gym.make("CartPole-v1", max_episode_steps=12)

    def policy(env, seed):
        return 0 if seed % 2 == 0 else int(env.action_space.sample())

    episodes = collect(env, list(seeds), policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # minari's advice on authorship metadata
        # spaces rather than env=: gymnasium cannot serialise a class entry point to JSON
        return minari.create_dataset_from_buffers(
            dataset_id, episodes, observation_space=env.observation_space,
            action_space=env.action_space, algorithm_name="scripted")


def make_dict(dataset_id: str = DICT_ID, seeds: tuple[int, ...] = (0, 1, 2, 3)):
    env = gym.make(DICT_ENV_ID)

    def policy(env, seed):
        goal = env.unwrapped._goals[env.unwrapped._goal]
        return np.clip(goal - env.unwrapped._pos, -0.35, 0.35).astype(np.float32)

    episodes = collect(env, list(seeds), policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # spaces rather than env=: gymnasium cannot serialise a class entry point to JSON
        return minari.create_dataset_from_buffers(
            dataset_id, episodes, observation_space=env.observation_space,
            action_space=env.action_space, algorithm_name="scripted")


_real_connect = socket.socket.connect


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to reach the network fails at once (local unix sockets still work)."""

    def connect(self, address):
        if self.family == socket.AF_UNIX:
            return _real_connect(self, address)
        raise ConnectionRefusedError(f"the tests never use the network (connect to {address!r})")

    def getaddrinfo(*args, **kwargs):
        raise socket.gaierror(f"the tests never use the network (lookup of {args[:2]!r})")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def minari_dir(tmp_path, monkeypatch) -> Path:
    """An empty local Minari cache (``MINARI_DATASETS_PATH``)."""
    path = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path


@pytest.fixture
def root(tmp_path) -> Path:
    """Where converted datasets go."""
    return tmp_path / "converted"


@pytest.fixture
def cartpole_maker():
    """``make_cartpole(dataset_id=CARTPOLE_ID, seeds=(0, ..., 4))``, for tests that build
    datasets themselves (test modules cannot import this conftest: importlib import mode)."""
    return make_cartpole


@pytest.fixture
def cartpole(minari_dir) -> str:
    make_cartpole()
    return CARTPOLE_ID


@pytest.fixture
def dict_dataset(minari_dir) -> str:
    make_dict()
    return DICT_ID


@pytest.fixture
def count_conversions(monkeypatch) -> list[str]:
    """The dataset id of every conversion from Minari data that runs."""
    from tdreplay.datasets import minari_data

    calls: list[str] = []
    convert = minari_data._convert

    def counting(dataset, dataset_id, dest, *args):
        calls.append(dataset_id)
        return convert(dataset, dataset_id, dest, *args)

    monkeypatch.setattr(minari_data, "_convert", counting)
    return calls
