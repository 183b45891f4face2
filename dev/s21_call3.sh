#!/usr/bin/env bash
# Session script (s21 call 3, deleted after its run): the fixed workspace test and the CUDA graph one.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-gpu/python \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >/tmp/pip.log 2>&1 || { tail -30 /tmp/pip.log; exit 1; }
echo "$(el) built"
python3 -m pytest tests/python/test_bias.py -q -p no:cacheprovider 2>&1 | tail -3
FLASHATTN_CUDA_PATH=sm90 python3 -m pytest tests/python/test_bias.py -q -p no:cacheprovider -k "workspace or dbias" 2>&1 | tail -3
echo "total $(el)"
