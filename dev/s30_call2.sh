#!/usr/bin/env bash
# s30 call 2: the cluster merge's placement and split count at small decode grids. One package
# (d128 bf16 sm_90); dev/decode_splits.py with the cluster and counter merges alternated, in three
# processes: default placement, FLASHATTN_DEV_CLUSTER_SPREAD=1 (one CTA per SM),
# FLASHATTN_DEV_CLUSTER_POLICY=spread.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; R=$(pwd); T0=$(date +%s)
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -Cbuild-dir=build-py \
  -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > $OUT/pip.log 2>&1 || { tail -20 $OUT/pip.log; exit 1; }
echo "[$(( $(date +%s) - T0 )) s] built"
cd /tmp
S="--shapes 1x4096,1x8192,1x16384,2x4096,4x4096,8x8192 --splits 0,4,8,12,16 --merges cluster,counter --passes 1 --repeats 20"
for v in default spread1 policy_spread; do
  case $v in
    default) env=();;
    spread1) env=(FLASHATTN_DEV_CLUSTER_SPREAD=1);;
    policy_spread) env=(FLASHATTN_DEV_CLUSTER_POLICY=spread);;
  esac
  echo "== $v"
  env "${env[@]}" timeout 150 python3 $R/dev/decode_splits.py $S --out $OUT/s30-placement-$v.json 2>&1 | grep -v Warn
  echo "[$(( $(date +%s) - T0 )) s]"
done
