"""The meta-package pins every component with == at the version the component declares
(dependencies and extras), and every range between siblings admits the sibling's version."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _check_pins():
    spec = importlib.util.spec_from_file_location("check_pins", ROOT / "tools" / "check_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_component_pinned_at_its_version():
    assert _check_pins().check(ROOT) == []


def test_wrong_pin_is_reported(tmp_path):
    check_pins = _check_pins()
    for name, version in [("tdreplay-core", "0.1.0"), ("tdreplay-writers", "0.2.0")]:
        pkg = tmp_path / "packages" / name
        (pkg / "src").mkdir(parents=True)
        (pkg / "src" / "v.py").write_text(f'__version__ = "{version}"\n')
        (pkg / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\ndynamic = ["version"]\n'
            '[tool.hatch.version]\npath = "src/v.py"\n'
        )
    meta = tmp_path / "packages" / "tdreplay"
    meta.mkdir()
    (meta / "pyproject.toml").write_text(
        '[project]\nname = "tdreplay"\nversion = "0.1.0"\n'
        'dependencies = ["tdreplay-writers==0.1.0", "numpy"]\n'
    )
    problems = check_pins.check(tmp_path)
    assert len(problems) == 2
    assert any("tdreplay-core" in p and "not pinned" in p for p in problems)
    assert any("tdreplay-writers==0.1.0" in p and "'0.2.0'" in p for p in problems)


def test_version_matches_distribution_metadata():
    from importlib.metadata import version

    import tdreplay.data

    assert version("tdreplay") == tdreplay.data.__version__


def _repo(tmp_path, packages, meta_deps, meta_extras=None):
    """A fake repository: ``packages`` maps a name to (version, dependencies, extras)."""
    for name, (version, deps, extras) in packages.items():
        pkg = tmp_path / "packages" / name
        (pkg / "src").mkdir(parents=True)
        (pkg / "src" / "v.py").write_text(f'__version__ = "{version}"\n')
        optional = "".join(f"{extra} = {reqs!r}\n" for extra, reqs in (extras or {}).items())
        (pkg / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\ndynamic = ["version"]\ndependencies = {deps!r}\n'
            f"[project.optional-dependencies]\n{optional}"
            '[tool.hatch.version]\npath = "src/v.py"\n'
        )
    meta = tmp_path / "packages" / "tdreplay"
    meta.mkdir()
    optional = "".join(f"{extra} = {reqs!r}\n" for extra, reqs in (meta_extras or {}).items())
    (meta / "pyproject.toml").write_text(
        f'[project]\nname = "tdreplay"\nversion = "0.1.0"\ndependencies = {meta_deps!r}\n'
        f"[project.optional-dependencies]\n{optional}"
    )
    return tmp_path


def test_pins_in_extras_count_and_are_checked(tmp_path):
    check_pins = _check_pins()
    root = _repo(
        tmp_path,
        {"tdreplay-core": ("0.1.0", [], {}),
         "tdreplay-distributed": ("0.1.0", ["tdreplay-core>=0.1,<0.2"], {}),
         "tdreplay-datasets": ("0.2.0", ["tdreplay-core>=0.1,<0.2"], {})},
        ["tdreplay-core==0.1.0"],
        {"distributed": ["tdreplay-distributed==0.1.0"],
         "datasets": ["tdreplay-datasets>=0.1"],
         "all": ["tdreplay-distributed==0.1.0", "tdreplay-datasets==0.1.0"]},
    )
    problems = check_pins.check(root)
    assert len(problems) == 2, problems
    # a range instead of a pin, in an extra
    assert any("tdreplay-datasets>=0.1 (extra [datasets])" in p and "exactly ==0.2.0" in p
               for p in problems)
    # a stale pin in [all]
    assert any("tdreplay-datasets==0.1.0 (extra [all])" in p and "'0.2.0'" in p
               for p in problems)


def test_optional_component_missing_from_all_extra(tmp_path):
    check_pins = _check_pins()
    root = _repo(
        tmp_path,
        {"tdreplay-core": ("0.1.0", [], {}),
         "tdreplay-distributed": ("0.1.0", ["tdreplay-core>=0.1,<0.2"], {})},
        ["tdreplay-core==0.1.0"],
        {"distributed": ["tdreplay-distributed==0.1.0"], "all": []},
    )
    assert check_pins.check(root) == [
        "tdreplay-distributed: in an extra of tdreplay but not in its [all] extra"]


def test_version_bump_outside_a_dependent_range_is_refused(tmp_path):
    check_pins = _check_pins()
    root = _repo(
        tmp_path,
        {"tdreplay-core": ("0.2.0", ["torch>=2.5"], {}),
         "tdreplay-writers": ("0.1.0", ["tdreplay-core>=0.1,<0.2"], {}),
         "tdreplay-samplers": ("0.1.0", ["tdreplay-core>=0.1,<0.3", "numba"],
                               {"test": ["tdreplay-writers>=0.2,<0.3"]})},
        ["tdreplay-core==0.2.0", "tdreplay-writers==0.1.0", "tdreplay-samplers==0.1.0"],
    )
    assert check_pins.check(root) == []  # the meta-package pins are right
    problems = check_pins.check_ranges(root)
    assert len(problems) == 2, problems
    core, writers = sorted(problems)
    # names the bumped package, its new version, the dependent and its range
    assert core.startswith("tdreplay-core 0.2.0 is not admitted by tdreplay-writers, which "
                           "requires tdreplay-core<0.2,>=0.1 (dependencies of "
                           "packages/tdreplay-writers/pyproject.toml)")
    # test extras count too
    assert writers.startswith("tdreplay-writers 0.1.0 is not admitted by tdreplay-samplers")
    assert "(extra [test] of packages/tdreplay-samplers/pyproject.toml)" in writers
    # the command line fails and prints both
    assert check_pins.main(["check_pins.py", str(root)]) == 1


def test_ranges_of_the_repository_admit_every_version(capsys):
    check_pins = _check_pins()
    assert check_pins.check_ranges(ROOT) == []
    assert check_pins.main(["check_pins.py", str(ROOT)]) == 0
    assert "every requirement between packages admits" in capsys.readouterr().out
