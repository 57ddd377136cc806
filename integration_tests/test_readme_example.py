"""The README's example runs as written and leaves a loadable checkpoint."""

import re
import runpy
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(script))
    rb = namespace["rb"]
    assert len(rb) == 1000 and namespace["batch"]["obs"].shape == (256, 4)
    from tdreplay.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

    restored = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
                                                 storage=LazyTensorStorage(100_000))
    restored.loads(tmp_path / "checkpoint")
    assert len(restored) == 1000
    assert (restored[:]["obs"] == rb[:]["obs"]).all()
