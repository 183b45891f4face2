#!/usr/bin/env bash
# Twelfth session (s12), last GPU call (< 190 s): the deterministic mode (the Hopper backward's
# two-kernel form, whose dQ kernel now also stores 16-byte row chunks) against the default, in one
# process with cuDNN. A d64;128 bf16 package; pytest test_cuda's deterministic cases under sm90;
# bench rows 1k / 4k / 16k, causal and not, impls flashattn, flashattn_det, sdpa_cudnn.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 185 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 110 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pkd \
  -Cbuild-dir=/tmp/bbd -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $OUT/pip.log 2>&1
[ -d /tmp/pkd/flashattn ] || { echo "build failed"; grep -E "error" $OUT/pip.log | head; exit 1; }
t built
export PYTHONPATH=/tmp/pkd
FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 40)" python3 -m pytest tests/python/test_cuda.py tests/python/test_torch.py -q \
  -p no:cacheprovider -k "determin" > $OUT/py-det.log 2>&1
echo "pytest deterministic cases (sm90): $(tail -1 $OUT/py-det.log)"; grep -E "^FAILED|^ERROR" $OUT/py-det.log | head -5
t tested
timeout "$(cap 120)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 --seqlens 1024,4096,16384 \
  --impls flashattn,flashattn_det,sdpa_cudnn --repeats 10 --out $OUT/det.json > $OUT/bench-det.log 2>&1
t "bench rc $?"
grep -E "^bf16" $OUT/bench-det.log | cut -c1-200
