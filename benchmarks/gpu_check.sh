#!/usr/bin/env bash
# The GPU checks of issue 19 in one command, for a lent GPU machine (the device tool's `run`,
# carry [".whl"] after benchmarks/gpu_wheels.sh here; 2.8 minutes on an H200, 2026-11-27):
#   1. the tests that need CUDA (the prioritized sampler's CUDA tests, CUDA trees and storages),
#   2. benchmarks/cuda_examples.py on tdreplay (and its cuda_cpu_trees case again with one torch
#      thread: the host trees' large draws and updates unsplit), then on TorchRL (the release that
#      benchmarks/gpu_wheels.sh fetched, with its own tensordict),
#   3. the two merged into cuda.json (TorchRL time over tdreplay time);
#   4. where .whl/torchrl_cuda is (gpu_wheels.sh with TORCHRL_CSRC), TorchRL 0.14.1 with its
#      extension built here with CUDA (benchmarks/torchrl_ext.py, in the background while the
#      tests run: nothing is timed until it is done), timed and merged into
#      cuda_vs_cuda_trees.json.
#   5. (step "profile", not in the default STEPS) benchmarks/cuda_profile.py on the two cases
#      the host bounds (memmap_cuda_trees, cuda_cpu_trees) at the first of SIZES: profile.txt.
# Everything lands in $OUT (tests.log, gpu.txt, trees.json, cuda.json, torchrl_ext.log,
# cuda_vs_cuda_trees.json, profile.txt: the device tool brings back 8 files at most, so each
# library's own rows stay in $RAW, and are in the merged files and on stdout); a step that
# fails is logged and the next one still runs. STEPS picks steps (default: all of
# "tests trees tdreplay torchrl torchrl_cuda"), CASES the benchmark's cases (default: all three).
# Step "trees" times the device tree's operations alone (benchmarks/cuda_trees.py: trees.json).
# Check it without a GPU: DEVICE=cpu SIZES=20000 BATCH=512 PY=python NO_WHEELS=1 OUT=/tmp/x
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
SIZES=${SIZES:-1000000 10000000}
BATCH=${BATCH:-65536}
STEPS=${STEPS:-tests trees tdreplay torchrl torchrl_cuda}
CASES=${CASES:-all_cuda memmap_cuda_trees cuda_cpu_trees}
OUT=${OUT:?set OUT to the folder for the results}
RAW=${RAW:-/tmp/gpu_check_raw}
mkdir -p "$OUT" "$RAW"
export PYTHONUNBUFFERED=1
SRC=$(ls -d "$PWD"/packages/*/src | paste -sd:)
step() { [[ " $STEPS " == *" $1 "* ]]; }

if [ -z "${NO_WHEELS:-}" ]; then
    for lib in tdreplay torchrl torchrl_cuda; do
        [ -d ".whl/$lib" ] || continue
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "/tmp/site-$lib" .whl/"$lib"/*.whl || echo "wheels for $lib: install failed"
    done
fi
if step torchrl_cuda && [ -d .whl/torchrl_cuda/csrc ]; then
    "$PY" benchmarks/torchrl_ext.py --csrc .whl/torchrl_cuda/csrc --site /tmp/site-torchrl_cuda \
        --cuda > "$OUT/torchrl_ext.log" 2>&1 &
    BUILD=$!
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  "$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available())'; } > "$OUT/gpu.txt"

TESTS="packages/tdreplay-samplers/tests/test_prioritized_cuda.py
       packages/tdreplay-samplers/tests/test_prioritized_sampler.py
       packages/tdreplay-samplers/tests/test_priority_split.py
       packages/tdreplay-samplers/tests/test_host_threads.py
       packages/tdreplay-samplers/tests/test_segment_trees.py
       packages/tdreplay-samplers/tests/test_triton_kernels.py
       packages/tdreplay-storages/tests/test_tensor_storage.py
       packages/tdreplay-core/tests/test_replay_buffer.py"
if step tests; then
    # shellcheck disable=SC2086
    PYTHONPATH="/tmp/site-tdreplay:$SRC" timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
        --import-mode=importlib -o consider_namespace_packages=true -rs $TESTS \
        > "$OUT/tests.log" 2>&1
    echo "tests: exit $? ($(tail -1 "$OUT/tests.log"))"
fi

bench() {  # bench LIB PYTHONPATH NAME [ARGS...]: ARGS after the defaults (a later --cases wins)
    # shellcheck disable=SC2086
    PYTHONPATH="$2" timeout 200 "$PY" benchmarks/cuda_examples.py --lib "$1" --device "$DEVICE" \
        --capacities $SIZES --batch "$BATCH" --cases $CASES --out "$RAW/cuda_$3.json" "${@:4}" \
        || echo "bench $3: exit $?"
}
merge() {  # merge TORCHRL_NAME OUT_NAME
    PYTHONPATH="/tmp/site-tdreplay:$SRC" "$PY" benchmarks/cuda_examples.py merge \
        "$RAW/cuda_tdreplay.json" "$RAW/cuda_$1.json" --out "$OUT/$2.json" \
        && echo "merged: $OUT/$2.json"
}
if step trees; then
    # shellcheck disable=SC2086
    PYTHONPATH="/tmp/site-tdreplay:$SRC" timeout 120 "$PY" benchmarks/cuda_trees.py \
        --device "$DEVICE" --capacities $SIZES --batch "$BATCH" --out "$OUT/trees.json" \
        || echo "trees: exit $?"
fi
BUILT=
if [ -n "${BUILD:-}" ]; then
    if wait "$BUILD"; then
        BUILT=1
    else
        echo "TorchRL extension build failed: $(tail -3 "$OUT/torchrl_ext.log")"
    fi
fi
if step tdreplay; then
    bench tdreplay "/tmp/site-tdreplay:$SRC" tdreplay
    # the host trees' draws and updates in one thread, not split over torch's threads: the
    # split's gain on this machine (torch's own host work in one thread too)
    bench tdreplay "/tmp/site-tdreplay:$SRC" tdreplay_1thread --cases cuda_cpu_trees --threads 1
fi
if step torchrl; then
    bench torchrl "/tmp/site-torchrl" torchrl
    merge torchrl cuda
fi
if [ -n "$BUILT" ]; then
    bench torchrl "/tmp/site-torchrl_cuda" torchrl_cuda
    merge torchrl_cuda cuda_vs_cuda_trees
fi
if step profile; then
    PYTHONPATH="/tmp/site-tdreplay:$SRC" timeout 240 "$PY" benchmarks/cuda_profile.py \
        --device "$DEVICE" --capacities "${SIZES%% *}" --batch "$BATCH" --reps 20 --top 20 \
        --cases memmap_cuda_trees cuda_cpu_trees > "$OUT/profile.txt" 2>&1 \
        || echo "profile: exit $?"
fi
