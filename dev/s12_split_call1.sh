#!/usr/bin/env bash
# Twelfth session (s12), GPU call 1 (one H200, < 330 s), run from .carry/snap with .carry/fa4a beside it
# (the first half of the FlashAttention-4 wheels, kept in /tmp/fa4w for call 2):
#  1. the package for the session's benchmarks: d64;128;256, bf16 and fp16, in /tmp/pk (kept for
#     call 2 while the machine stays warm);
#  2. dev/kernel_split.py: per-kernel device time of one backward (ours, SDPA cuDNN, SDPA flash) at
#     the short rows issue 20 still fails, and of the forward at the forward's short rows.
# Writes $OUT/split-{bwd,fwd}.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
[ -d ../fa4a ] && cp ../fa4a/* /tmp/fa4w/ && t "fa4a kept: $(ls /tmp/fa4w | wc -l) files"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 260 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" \
  "-Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16;fp16" . > /tmp/logs/pip.log 2>&1
[ -d /tmp/pk/flashattn ] || { echo "build failed"; grep -E "error" /tmp/logs/pip.log | head; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
t built
export PYTHONPATH=/tmp/pk
timeout 60 python3 dev/kernel_split.py --impls flashattn,sdpa_cudnn,sdpa_flash \
  --shapes 128:512,128:512:c,128:1024,128:1024:c,64:1024,64:1024:c,128:2048,64:16384:c,128:16384 \
  --out $OUT/split-bwd.json > /tmp/logs/split-bwd.txt 2>&1
t "split bwd rc $?"
timeout 40 python3 dev/kernel_split.py --forward --impls flashattn,sdpa_cudnn \
  --shapes 128:512,128:1024,64:1024:c,64:512:c --out $OUT/split-fwd.json > /tmp/logs/split-fwd.txt 2>&1
t "split fwd rc $?"
tar czf $OUT/logs.tgz -C /tmp/logs .
cat /tmp/logs/split-bwd.txt /tmp/logs/split-fwd.txt | cut -c1-150
