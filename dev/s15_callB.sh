#!/usr/bin/env bash
# s15 call B (warm machine after call A): FA4 joined from the two halves, the package at every head
# dim (bf16), the ten-run deterministic test with d192 built, the full bf16 suite with FA4 and --gpu-state.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
cp .carry/fa4b/* /tmp/fa4w/ && cat /tmp/fa4w/cu13.part.aa /tmp/fa4w/cu13.part.ab > /tmp/fa4w/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl && rm /tmp/fa4w/cu13.part.*
t "fa4 wheels: $(ls /tmp/fa4w | wc -l)"
site=/tmp/fa4-site
( python3 -m pip install -q --no-index --no-deps --no-compile --target $site $(ls /tmp/fa4w/*.whl | grep -v cutlass_dsl_libs_core) > /tmp/logs/fa4.log 2>&1
  python3 -c "import sys, zipfile, glob; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob('/tmp/fa4w/*cutlass_dsl_libs_core*.whl')]" $site ) &
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/logs/pip.log 2>&1 || { tail -5 /tmp/logs/pip.log; exit 1; }
wait; t built
PYTHONPATH=/tmp/pk timeout 60 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider -k "bitwise_stable_over_ten_runs" -rA 2>&1 | grep -E "PASSED|FAILED|SKIPPED|passed|failed" | tail -12
t dettest
export PYTHONPATH=/tmp/pk:$site:$site/nvidia_cutlass_dsl/dsl_packages
python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -1
timeout 400 python3 bench/bench.py --suite full --dtypes bf16 --impls flashattn,sdpa_cudnn,fa4 --repeats 10 --gpu-state \
  --out $OUT/full-bf16-fa4.json > /tmp/logs/bench.log 2>&1; t "bench rc $?"
tar czf $OUT/logsB.tgz -C /tmp/logs .
grep -E "^bf16" /tmp/logs/bench.log | cut -c1-170
