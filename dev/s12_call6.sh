#!/usr/bin/env bash
# Eleventh session, GPU call 6 (right after call 5, on the still-warm machine; < 560 s), from
# .carry/snap with .carry/fa4b (the second half of the FlashAttention-4 wheels; call 5 left the
# first in /tmp/fa4w): join the -libs-cu13 wheel, install FA4 (scripts/gpu-check.sh's steps), and
# time the full suite bf16 d64/d128 512..16k with flashattn (call 5's package, else a fresh
# d64;128 build), SDPA-cuDNN and FA4 in one process.
# Writes $OUT/fa4.json, $OUT/logs.tgz; the tables on stdout.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 555 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w
if [ ! -f /tmp/fa4w/cu13part.aa ]; then echo "fresh machine: /tmp/fa4w/cu13part.aa is gone (call 5's half); no FA4"; exit 1; fi
cp ../fa4b/* /tmp/fa4w/
cat /tmp/fa4w/cu13part.aa /tmp/fa4w/cu13part.ab > /tmp/fa4w/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
rm /tmp/fa4w/cu13part.*
if [ ! -d /tmp/pk-new/flashattn ]; then
  CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk-new \
    -Cbuild-dir=/tmp/bb-new6 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/logs/pip6.log 2>&1
  t "package rebuilt (fresh machine)"
fi
site=/tmp/fa4-site
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
  $(ls /tmp/fa4w/*.whl | grep -v cutlass_dsl_libs_core) > /tmp/logs/fa4-install.log 2>&1 || tail -5 /tmp/logs/fa4-install.log
python3 -c "import sys, zipfile, glob; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob('/tmp/fa4w/*cutlass_dsl_libs_core*.whl')]" "$site"
export PYTHONPATH="/tmp/pk-new:$site:$site/nvidia_cutlass_dsl/dsl_packages"
python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -2
t "fa4 installed"
timeout "$(cap 420)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 --seqlens 512,1024,2048,4096,16384 \
  --impls flashattn,sdpa_cudnn,fa4 --repeats 20 --out $OUT/fa4.json > /tmp/logs/fa4-bench.log 2>&1
t "bench rc $?"
tar czf $OUT/logs.tgz -C /tmp/logs .
for fig in fwd_tflops bwd_tflops; do
  for peer in sdpa_cudnn fa4; do python3 dev/ab_table.py --figure $fig --peer $peer $OUT/fa4.json; done
done
t done
