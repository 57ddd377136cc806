"""load_dataset / register_dataset: TorchRL's prefixed dataset ids (nothing is downloaded)."""

from __future__ import annotations

import sys
import threading

import pytest

import tdreplay.datasets
from tdreplay.datasets import MinariExperienceReplay, load_dataset, register_dataset, registry

CARTPOLE_ID = "cartpole/tiny-v0"  # the id the conftest's cartpole fixture builds
TORCHRL_ONLY = {
    "atari": "AtariDQNExperienceReplay", "atari_dqn": "AtariDQNExperienceReplay",
    "d4rl": "D4RLExperienceReplay", "gen_dgrl": "GenDGRLExperienceReplay",
    "lerobot": "LeRobotExperienceReplay", "openml": "OpenMLExperienceReplay",
    "openx": "OpenXExperienceReplay", "roboset": "RobosetExperienceReplay",
    "vd4rl": "VD4RLExperienceReplay",
}


#: the registry as the module builds it (before any test or doctest of the run registers more:
#: the doctests of registry.py register "toy" and "fractions" in the same process)
BUILT_IN = dict(registry._REGISTRY)


@pytest.fixture(autouse=True)
def restore_registry():
    """Each test starts from the built-in registry and registers what it needs; the
    process-global registry is put back as it was after it."""
    saved = dict(registry._REGISTRY)
    registry._REGISTRY.clear()
    registry._REGISTRY.update(BUILT_IN)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


class Recorder:
    """A dataset factory recording what it was called with."""

    def __init__(self, dataset_id, **kwargs):
        self.dataset_id = dataset_id
        self.kwargs = kwargs


def test_public_names():
    for name in ("load_dataset", "register_dataset"):
        assert name in tdreplay.datasets.__all__
    assert tdreplay.datasets.load_dataset is registry.load_dataset


def test_minari_prefix_builds_a_minari_dataset_with_the_kwargs(cartpole, root):
    data = load_dataset(f"minari:{CARTPOLE_ID}", batch_size=6, root=root,
                        load_from_local_minari=True)
    assert type(data) is MinariExperienceReplay
    assert data.dataset_id == CARTPOLE_ID and data.batch_size == 6
    assert data.root == root and data.data_path == root / CARTPOLE_ID
    assert data.sample()["observation"].shape == (6, 4)
    direct = MinariExperienceReplay(CARTPOLE_ID, 6, root=root, download=False)
    assert len(data) == len(direct) == data.metadata["total_steps"]
    # the prefix is case-insensitive; download=False uses the conversion under root
    again = load_dataset(f"  MINARI :{CARTPOLE_ID}", batch_size=2, root=root, download=False,
                         split_trajs=True)
    assert again.split_trajs and len(again) == again.metadata["total_episodes"] == 5


def test_minari_prefix_never_downloads_with_download_false(minari_dir, root):
    with pytest.raises(FileNotFoundError, match="is not converted under root"):
        load_dataset(f"minari:{CARTPOLE_ID}", batch_size=4, root=root, download=False)
    assert not root.exists()


def test_an_id_without_prefix_lists_the_supported_ones():
    with pytest.raises(ValueError, match="dataset_id must be prefixed") as err:
        load_dataset("hopper-expert-v2")
    message = str(err.value)
    assert "'hopper-expert-v2'" in message and "Supported prefixes: ('minari',)" in message
    assert "'d4rl'" in message and "no class for" in message
    register_dataset("toy", Recorder)
    with pytest.raises(ValueError, match=r"Supported prefixes: \('minari', 'toy'\)"):
        load_dataset("nothing")


def test_an_unknown_prefix_is_a_value_error_as_in_torchrl():
    with pytest.raises(ValueError, match="Unknown dataset source 'foo'") as err:
        load_dataset("Foo:bar")
    assert "Supported prefixes: ('minari',)" in str(err.value)
    assert "dataset_id='Foo:bar'" in str(err.value)
    with pytest.raises(ValueError, match="empty source prefix"):
        load_dataset(":bar")


@pytest.mark.parametrize("dataset_id", [None, 3, b"minari:x", ("minari", "x")])
def test_a_dataset_id_that_is_no_string_is_a_type_error(dataset_id):
    with pytest.raises(TypeError, match="dataset_id must be a str"):
        load_dataset(dataset_id)


def test_a_registered_factory_gets_the_name_and_the_kwargs():
    register_dataset("  Toy ", Recorder)
    data = load_dataset("TOY:a:b/c", batch_size=3, root="x")
    assert isinstance(data, Recorder)
    assert data.dataset_id == "a:b/c" and data.kwargs == {"batch_size": 3, "root": "x"}
    assert registry._REGISTRY["toy"] is Recorder


def test_registering_twice_needs_replace():
    register_dataset("toy", Recorder)

    def other(dataset_id, **kwargs):
        return ("other", dataset_id)

    with pytest.raises(KeyError, match="'toy' is already registered. Pass replace=True"):
        register_dataset("TOY", other)
    assert isinstance(load_dataset("toy:x"), Recorder)  # unchanged
    register_dataset("toy", other, replace=True)
    assert load_dataset("toy:x") == ("other", "x")
    with pytest.raises(KeyError, match="'minari' is already registered"):
        register_dataset("minari", other)
    assert registry._REGISTRY["minari"] == \
        "tdreplay.datasets.minari_data:MinariExperienceReplay"


@pytest.mark.parametrize("prefix, dataset, kwargs, error, match", [
    ("", Recorder, {}, ValueError, "non-empty strings without ':'"),
    ("   ", Recorder, {}, ValueError, "non-empty strings without ':'"),
    ("a:b", Recorder, {}, ValueError, "non-empty strings without ':'. Got 'a:b' \\(prefix\\)"),
    (None, Recorder, {}, TypeError, "prefix must be a str, got NoneType"),
    (7, Recorder, {}, TypeError, "prefix must be a str"),
    ("toy", 3, {}, TypeError, "dataset must be a callable dataset factory"),
    ("toy", None, {}, TypeError, "dataset must be a callable dataset factory"),
    ("toy", "nocolon", {}, ValueError, "'module:attribute' format; got dataset='nocolon'"),
    ("toy", ":Attr", {}, ValueError, "'module:attribute' format"),
    ("toy", "module:", {}, ValueError, "'module:attribute' format"),
    ("toy", Recorder, {"replace": 1}, TypeError, "replace must be a bool"),
])
def test_bad_registrations_name_the_argument_and_register_nothing(prefix, dataset, kwargs, error,
                                                                   match):
    before = dict(registry._REGISTRY)
    with pytest.raises(error, match=match):
        register_dataset(prefix, dataset, **kwargs)
    assert registry._REGISTRY == before


def test_a_string_factory_is_imported_when_the_prefix_is_loaded(tmp_path, monkeypatch):
    (tmp_path / "toy_datasets_mod.py").write_text(
        "IMPORTS = []\n"
        "IMPORTS.append(1)\n"
        "class Toy:\n"
        "    def __init__(self, dataset_id, **kwargs):\n"
        "        self.dataset_id, self.kwargs = dataset_id, kwargs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_datasets_mod", raising=False)
    register_dataset("lazy", "toy_datasets_mod:Toy")
    assert "toy_datasets_mod" not in sys.modules  # not imported by the registration
    data = load_dataset("lazy:abc", batch_size=2)
    module = sys.modules["toy_datasets_mod"]
    assert type(data) is module.Toy and data.dataset_id == "abc"
    assert data.kwargs == {"batch_size": 2} and module.IMPORTS == [1]


def test_a_string_factory_that_does_not_resolve_says_which_registration():
    register_dataset("nomod", "no_such_module_for_tdreplay:Thing")
    with pytest.raises(ModuleNotFoundError, match="'nomod' is registered as "
                                                  "'no_such_module_for_tdreplay:Thing'"):
        load_dataset("nomod:x")
    register_dataset("noattr", "math:NoSuchThing")
    with pytest.raises(AttributeError, match="module 'math' has no attribute 'NoSuchThing'"):
        load_dataset("noattr:x")
    register_dataset("notcallable", "math:pi")
    with pytest.raises(TypeError, match="which is a float, not a callable dataset factory"):
        load_dataset("notcallable:x")


@pytest.mark.parametrize("prefix", sorted(TORCHRL_ONLY))
def test_torchrl_prefixes_without_a_tdreplay_class_say_so(prefix):
    with pytest.raises(NotImplementedError) as err:
        load_dataset(f"{prefix}:some/dataset-v0", batch_size=4)
    message = str(err.value)
    assert f"tdreplay has no {TORCHRL_ONLY[prefix]}" in message
    assert f"'{prefix}:some/dataset-v0'" in message and "replace=True" in message
    assert "tdreplay's datasets: ('minari',)" in message
    # registered as in TorchRL: registering it again needs replace=True, which serves it
    with pytest.raises(KeyError, match="already registered"):
        register_dataset(prefix, Recorder)
    register_dataset(prefix, Recorder, replace=True)
    assert load_dataset(f"{prefix}:x").dataset_id == "x"


def test_registry_is_safe_across_threads():
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def worker(i):
        barrier.wait()
        register_dataset(f"mine{i}", Recorder)
        try:
            register_dataset("shared", lambda dataset_id, _i=i, **kw: _i)
            result = "registered"
        except KeyError:
            result = "refused"
        for _ in range(50):
            assert load_dataset(f"mine{i}:{i}").dataset_id == str(i)
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 7 + ["registered"]
    assert {f"mine{i}" for i in range(8)} <= set(registry._REGISTRY)
    assert load_dataset("shared:x") in range(8)

