"""Build TorchRL's compiled extension (``torchrl._torchrl``: its segment trees, with the CUDA
trees when ``--cuda``) from TorchRL's sources, against the torch in use, into an unpacked TorchRL.

TorchRL's wheels on PyPI carry an extension built for one torch release and without CUDA, so
its CUDA prioritized sampler ("CUDA prioritized replay buffers require a TorchRL CUDA wheel")
cannot be measured from PyPI. ``benchmarks/gpu_check.sh`` runs this on the GPU machine, with
the ``torchrl/csrc`` folder of the pytorch/rl release whose wheel is unpacked in ``--site``,
then times that TorchRL with ``benchmarks/cuda_examples.py``. The build follows TorchRL's
``setup.py`` (``-O3``, ``-DWITH_CUDA``, every ``*.cpp``, and ``*.cu`` with CUDA) through
``torch.utils.cpp_extension``.

    python benchmarks/torchrl_ext.py --csrc .whl/torchrl_cuda/csrc --site /tmp/site --cuda
"""

from __future__ import annotations

import argparse
import shutil
import sysconfig
import tempfile
from pathlib import Path


def build(csrc: Path, site: Path, cuda: bool) -> Path:
    """Compile ``csrc`` into ``site/torchrl/_torchrl<EXT_SUFFIX>`` (replacing the wheel's) and
    return that path."""
    from torch.utils.cpp_extension import load

    package = site / "torchrl"
    if not package.is_dir():
        raise FileNotFoundError(f"--site holds no unpacked torchrl: {package} is missing")
    sources = sorted(csrc.glob("*.cpp")) + (sorted(csrc.glob("*.cu")) if cuda else [])
    if not sources:
        raise FileNotFoundError(f"--csrc holds no TorchRL sources: no *.cpp in {csrc}")
    flags = ["-O3"] + (["-DWITH_CUDA"] if cuda else [])
    with tempfile.TemporaryDirectory() as build_dir:
        load(name="_torchrl", sources=[str(s) for s in sources], extra_cflags=flags,
             extra_cuda_cflags=flags, extra_include_paths=[str(csrc)], with_cuda=cuda,
             build_directory=build_dir, verbose=False)
        for old in package.glob("_torchrl*.so"):
            old.unlink()
        target = package / f"_torchrl{sysconfig.get_config_var('EXT_SUFFIX')}"
        shutil.copyfile(Path(build_dir) / "_torchrl.so", target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csrc", type=Path, required=True, help="TorchRL's torchrl/csrc")
    parser.add_argument("--site", type=Path, required=True,
                        help="the folder TorchRL's wheel was installed into (--target)")
    parser.add_argument("--cuda", action="store_true", help="also build the CUDA trees")
    args = parser.parse_args()
    print(build(args.csrc, args.site, args.cuda))


if __name__ == "__main__":
    main()
