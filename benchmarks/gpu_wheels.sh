#!/usr/bin/env bash
# Here, before the first call of the device tool: the wheels benchmarks/gpu_check.sh installs on
# the GPU machine (its image has torch, numba, numpy, pytest; not tensordict or TorchRL), for its
# Python 3.12, into .whl/ (ignored by git, carried with the call: carry [".whl"]).
# tdreplay and TorchRL need different tensordicts, so each gets a folder of its own.
# TorchRL's prioritized samplers run its compiled segment trees, which load only under the torch
# release TorchRL was built with: the lent image has torch 2.11 (seen 2026-11-27), built for by
# TorchRL 0.12.0 (0.14.1, built for torch 2.13, fails there with "SumSegmentTreeFp32 is not
# available"). Set TORCHRL and TORCHRL_TENSORDICT for an image with another torch.
# TorchRL's CUDA trees are in no wheel on PyPI: with TORCHRL_CSRC set to the torchrl/csrc
# folder of a pytorch/rl checkout at the 0.14 release (or later: torchrl/csrc has not changed
# since e479313ab, 2026-04-28, "Add CUDA support for prioritized replay sampling"),
# .whl/torchrl_cuda gets TorchRL 0.14.1's wheels and those sources, and gpu_check.sh builds the
# extension with CUDA on the GPU machine (benchmarks/torchrl_ext.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
download() {  # download FOLDER REQUIREMENT...
    rm -rf ".whl/$1"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d ".whl/$1" "${@:2}"
}
download tdreplay tensordict==0.15.3 pyvers==0.2.3
download torchrl "torchrl==${TORCHRL:-0.12.0}" "tensordict==${TORCHRL_TENSORDICT:-0.12.4}" \
    pyvers==0.2.3 cloudpickle orjson importlib_metadata
if [ -n "${TORCHRL_CSRC:-}" ]; then
    download torchrl_cuda torchrl==0.14.1 tensordict==0.14.3 pyvers==0.2.3 hoptorch cloudpickle \
        orjson importlib_metadata
    mkdir .whl/torchrl_cuda/csrc
    cp "$TORCHRL_CSRC"/*.cpp "$TORCHRL_CSRC"/*.cu "$TORCHRL_CSRC"/*.h .whl/torchrl_cuda/csrc/
fi
du -sh .whl/*
