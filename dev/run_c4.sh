#!/usr/bin/env bash
# One device call: the forward's Q latency between tiles (two Q slots, the L2 prefetch, d128 with
# 160-key tiles and two slots) against the default, forward only, with cuDNN in each process;
# test_cuda on every variant (sm90 path).
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
build base "64;128;256" 5 "" &
build q2pf "64;128;256" 5 "-DFLASHATTN_DEV_SM90_FWD_Q2 -DFLASHATTN_DEV_SM90_FWD_QPF" &
build q2 "64;128" 3 "-DFLASHATTN_DEV_SM90_FWD_Q2" &
build n160 "128" 3 "-DFLASHATTN_DEV_SM90_FWD_Q2 -DFLASHATTN_DEV_SM90_HDIM=128 -DFLASHATTN_DEV_SM90_CONSUMERS=2 -DFLASHATTN_DEV_SM90_BN=160 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=1" &
wait; echo "builds: $(( $(date +%s) - start )) s"
for n in base q2pf q2 n160; do [ -d /tmp/ab-$n/flashattn ] || { echo "build $n failed"; tail -5 "$OUT/pip-$n.log"; }; done
for n in q2pf q2 n160; do
  ( r=$(PYTHONPATH=/tmp/ab-$n FLASHATTN_CUDA_PATH=sm90 timeout 200 python3 -m pytest tests/python/test_cuda.py -q -p no:cacheprovider 2>&1 | tail -1)
    echo "test_cuda (sm90) $n: $r" ) &
done
( for f in test_host_path test_torch; do
    echo "$f (base, auto path): $(PYTHONPATH=/tmp/ab-base timeout 200 python3 -m pytest tests/python/$f.py -q -p no:cacheprovider 2>&1 | tail -1)"
  done ) &
wait
b() {  # variant dims
  PYTHONPATH=/tmp/ab-$1 timeout 150 python3 bench/bench.py --suite issue3 --dtypes bf16 --repeats 20 --no-backward \
    --impls flashattn,sdpa_cudnn --head-dims "$2" --seqlens 512,1024,2048,4096,16384 --out "$OUT/ab-$1.json" 2>&1 |
    grep -E "^(bf16|fp16) |error" | cut -c1-110
}
for n in base q2pf q2; do echo "== $n"; b $n $([ $n = q2 ] && echo 64,128 || echo 64,128,256); done
echo "== n160"; b n160 128
echo "== host time (base)"
PYTHONPATH=/tmp/ab-base timeout 120 python3 dev/host_time.py --calls 1000 --rounds 3 --out "$OUT/host-time.json" 2>&1 | tail -25 | cut -c1-160
echo "total $(( $(date +%s) - start )) s"
