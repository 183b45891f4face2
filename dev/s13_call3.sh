#!/usr/bin/env bash
# Twelfth session, GPU call 3 (one H200, < 540 s), right after call 2 on the same warm machine,
# run from .carry/snap with .carry/fa4b beside it: joins the FlashAttention-4 wheels (call 2 left
# the first half in /tmp/fa4w), installs them in /tmp/fa4-site, and times in one process each
#  1. bf16 d64/d128, 512..16k with 8k, ours, SDPA cuDNN and FA4 (forward and backward);
#  2. fp16 d64/d128, 512..16k, ours and SDPA cuDNN.
# Uses call 2's package /tmp/pk-base (d64;128 bf16; rebuilt here if the machine is fresh) and
# builds an fp16 one (/tmp/pk-fp16) while FA4 installs.
# Writes $OUT/{fa4-bf16,fp16}.json, $OUT/logs3.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 530 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs3 /tmp/fa4w
PIP="python3 -m pip install --no-build-isolation --no-deps -q -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128"
(CMAKE_BUILD_PARALLEL_LEVEL=12 timeout 200 $PIP --target /tmp/pk-fp16 -Cbuild-dir=/tmp/bb-fp16 \
   -Ccmake.define.FLASHATTN_CUDA_DTYPES=fp16 . > /tmp/logs3/pip-fp16.log 2>&1) &
fp16_build=$!
if [ ! -d /tmp/pk-base/flashattn ]; then
  t "fresh machine: building the bf16 package"
  CMAKE_BUILD_PARALLEL_LEVEL=4 timeout 250 $PIP --target /tmp/pk-base -Cbuild-dir=/tmp/bb-base \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/logs3/pip.log 2>&1
  t "built rc $?"
fi
impls=flashattn,sdpa_cudnn
if [ -f /tmp/fa4w/cu13part.aa ] && [ -d ../fa4b ]; then
  cp ../fa4b/* /tmp/fa4w/
  cat /tmp/fa4w/cu13part.aa /tmp/fa4w/cu13part.ab > /tmp/fa4w/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
  rm -f /tmp/fa4w/cu13part.*
  site=/tmp/fa4-site
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
    $(ls /tmp/fa4w/*.whl | grep -v cutlass_dsl_libs_core) > /tmp/logs3/fa4-install.log 2>&1 || tail -5 /tmp/logs3/fa4-install.log
  python3 -c "import sys, zipfile, glob; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob(sys.argv[2] + '/*cutlass_dsl_libs_core*.whl')]" "$site" /tmp/fa4w
  export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages"
  python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -2
  impls=flashattn,sdpa_cudnn,fa4
else
  echo "no FA4 wheels (first half missing: the machine is not call 2's)"
fi
wait $fp16_build; t "fa4 installed, fp16 package built"
FA4PATH=${PYTHONPATH:-}
export PYTHONPATH=/tmp/pk-base${FA4PATH:+:$FA4PATH}
timeout "$(cap 330)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 64,128 \
  --seqlens 512,1024,2048,4096,8192,16384 --impls $impls --repeats 10 --out $OUT/fa4-bf16.json > /tmp/logs3/bench-bf16.log 2>&1
t "bench bf16 rc $?"
PYTHONPATH=/tmp/pk-fp16 timeout "$(cap 180)" python3 bench/bench.py --suite full --dtypes fp16 --head-dims 64,128 \
  --seqlens 512,1024,2048,4096,16384 --impls flashattn,sdpa_cudnn --repeats 10 --out $OUT/fp16.json > /tmp/logs3/bench-fp16.log 2>&1
t "bench fp16 rc $?"
tar czf $OUT/logs3.tgz -C /tmp/logs3 .
python3 - <<'PY'
import json, os
out = os.environ.get("OUT", "/tmp/flashattn-out")
for fn in ("fa4-bf16.json", "fp16.json"):
    try:
        d = json.load(open(f"{out}/{fn}"))
    except Exception as e:
        print(fn, e); continue
    for r in d["rows"]:
        f, c, a = r.get("flashattn", {}), r.get("sdpa_cudnn", {}), r.get("fa4", {})
        def ratio(p, k):
            return f"{p[k]/f[k]:.2f}" if k in p and k in f else " -- "
        print(f"{r['dtype']} d{r['d']:3} {r['n']:5}{'c' if r['causal'] else ' '} fwd {f.get('fwd_tflops', 0):4.0f} cudnn x{ratio(c, 'fwd_ms')} fa4 x{ratio(a, 'fwd_ms')} | bwd {f.get('bwd_tflops', 0):4.0f} cudnn x{ratio(c, 'bwd_ms')} fa4 x{ratio(a, 'bwd_ms')}")
PY
