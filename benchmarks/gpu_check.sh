#!/usr/bin/env bash
# The GPU checks of issue 19 in one command, for a lent GPU machine (the device tool's `run`,
# carry [".whl"] after benchmarks/gpu_wheels.sh here; about 6 minutes on one H100):
#   1. the tests that need CUDA (the prioritized sampler's CUDA tests, CUDA trees and storages),
#   2. benchmarks/cuda_examples.py on tdreplay, then on TorchRL (the release that
#      benchmarks/gpu_wheels.sh fetched, with its own tensordict),
#   3. the two merged into cuda.json (TorchRL time over tdreplay time).
# Everything lands in $OUT (tests.log, cuda_tdreplay.json, cuda_torchrl.json, cuda.json,
# gpu.txt); a step that fails is logged and the next one still runs.
# Check it without a GPU: DEVICE=cpu SIZES=20000 BATCH=512 PY=python NO_WHEELS=1 OUT=/tmp/x
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
SIZES=${SIZES:-1000000 10000000}
BATCH=${BATCH:-65536}
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SRC=$(ls -d "$PWD"/packages/*/src | paste -sd:)

if [ -z "${NO_WHEELS:-}" ]; then
    for lib in tdreplay torchrl; do
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "/tmp/site-$lib" .whl/"$lib"/*.whl || echo "wheels for $lib: install failed"
    done
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available())'; } > "$OUT/gpu.txt"

TESTS="packages/tdreplay-samplers/tests/test_prioritized_cuda.py
       packages/tdreplay-samplers/tests/test_prioritized_sampler.py
       packages/tdreplay-samplers/tests/test_segment_trees.py
       packages/tdreplay-storages/tests/test_tensor_storage.py
       packages/tdreplay-core/tests/test_replay_buffer.py"
# shellcheck disable=SC2086
PYTHONPATH="/tmp/site-tdreplay:$SRC" timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
    --import-mode=importlib -o consider_namespace_packages=true -rs $TESTS \
    > "$OUT/tests.log" 2>&1
echo "tests: exit $? ($(tail -1 "$OUT/tests.log"))"

bench() {  # bench LIB PYTHONPATH
    # shellcheck disable=SC2086
    PYTHONPATH="$2" timeout 200 "$PY" benchmarks/cuda_examples.py --lib "$1" --device "$DEVICE" \
        --capacities $SIZES --batch "$BATCH" --out "$OUT/cuda_$1.json" || echo "bench $1: exit $?"
}
bench tdreplay "/tmp/site-tdreplay:$SRC"
bench torchrl "/tmp/site-torchrl"
PYTHONPATH="/tmp/site-tdreplay:$SRC" "$PY" benchmarks/cuda_examples.py merge \
    "$OUT/cuda_tdreplay.json" "$OUT/cuda_torchrl.json" --out "$OUT/cuda.json" \
    && echo "merged: $OUT/cuda.json"
