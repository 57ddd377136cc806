"""The meta-package pins every component with == at the version the component declares."""

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
