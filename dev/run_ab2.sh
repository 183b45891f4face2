#!/usr/bin/env bash
# One device call (2026-12-02 session): the forward pin at d192/d256 and with softcap, the d64
# exp2-on-FMA variants, and the 192/128 probe, each against the current default in one session.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
build() {  # name dims jobs flags
  CMAKE_BUILD_PARALLEL_LEVEL=$3 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=/tmp/build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
    "-Ccmake.define.CMAKE_CUDA_FLAGS=$4" . >"$OUT/pip-$1.log" 2>&1
}
start=$(date +%s)
build base "64;128;192;256" 6 "" &
build pinall "64;128;192;256" 6 "-DFLASHATTN_DEV_SM90_FWD_PIN_ALL" &
build k4 "64" 2 "-DFLASHATTN_DEV_SM90_FWD_EXP2_FMA=4" &
build k8 "64" 2 "-DFLASHATTN_DEV_SM90_FWD_EXP2_FMA=8" &
wait; echo "builds: $(( $(date +%s) - start )) s"
for n in base pinall k4 k8; do [ -d /tmp/ab-$n/flashattn ] || { echo "build $n failed"; tail -5 "$OUT/pip-$n.log"; }; done
for n in pinall k4 k8; do
  echo "test_cuda $n: $(PYTHONPATH=/tmp/ab-$n timeout 150 python3 -m pytest tests/python/test_cuda.py -q -x -p no:cacheprovider 2>&1 | tail -1)"
done
b() {  # variant tag args...
  local n=$1 tag=$2; shift 2
  PYTHONPATH=/tmp/ab-$n timeout 120 python3 bench/bench.py --suite issue3 --dtypes bf16 --repeats 20 --no-backward \
    --out "$OUT/ab-$tag-$n.json" "$@" 2>&1 | grep -E "^(bf16|fp16) |error" | cut -c1-200
}
for n in base pinall; do echo "== d192/256 $n"; b $n hd --impls flashattn,sdpa_cudnn --head-dims 192,256 --seqlens 1024,4096,16384; done
for n in base pinall; do echo "== softcap $n"; b $n sc --impls flashattn --head-dims 64,128 --seqlens 1024,4096,16384 --softcap 30; done
for n in base k4 k8; do echo "== d64 $n"; b $n e2 --impls flashattn,sdpa_cudnn --head-dims 64 --seqlens 1024,4096,16384; done
echo "== 192/128 probe (base)"
PYTHONPATH=/tmp/ab-base timeout 150 python3 dev/dv_probe.py --out "$OUT/dv-probe.json" 2>&1 | tail -12
echo "total $(( $(date +%s) - start )) s"
