#!/usr/bin/env bash
# Ninth session, second GPU call: the d64 forward at short rows (0.93x cuDNN at 1k, 0.78x causal)
# with the butterfly transpose now the default: O in 16-byte chunks at d64 (CHUNKS_ALL), the
# 128 x 128 two-consumer tile, and both, against the shipped 192 x 128 three-consumer tile; plus
# the sparse forward's racecheck with lane 0 alone reading the shared words (LANE0_READS).
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
( cmake -S . -B /tmp/bl -DFLASHATTN_CUDA_ARCHITECTURES=90 -DFLASHATTN_CUDA_HEAD_DIMS=128 -DFLASHATTN_CUDA_DTYPES=bf16 \
    -DFLASHATTN_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_SM90_SPARSE_LANE0_READS" > /tmp/bl.log 2>&1 \
  && cmake --build /tmp/bl -j 4 --target flashattn_test_sparse >> /tmp/bl.log 2>&1 || { echo "lane0 build failed"; grep error /tmp/bl.log | head -5; } ) &
D="-DFLASHATTN_DEV_SM90_HDIM=64 -DFLASHATTN_DEV_SM90_CONSUMERS=2 -DFLASHATTN_DEV_SM90_BN=128 -DFLASHATTN_DEV_SM90_STAGES=2 -DFLASHATTN_DEV_SM90_PINGPONG=1"
SUITE=full IMPLS=flashattn,sdpa_cudnn BENCH_ARGS="--no-backward" TEST_ARGS="-x" timeout 470 bash dev/ab.sh 64 512,1024,2048,4096,16384 \
  "base=" "chunks=-DFLASHATTN_DEV_SM90_FWD_CHUNKS_ALL" "c2=$D" "c2chunks=$D -DFLASHATTN_DEV_SM90_FWD_CHUNKS_ALL" > /tmp/ab.log 2>&1
grep -E "^builds|^test_cuda|^==|error|Error" /tmp/ab.log | head -20
wait; t "ab done"
SP=$(find /tmp/bl -name flashattn_test_sparse -type f | head -1)
C=All/SparseSm90.MatchesReference
F=$C/sm90_varlen_lists_causal_ragged:$C/sm90_dense_64x192_window:$C/sm90_lists_128x64_softcap_alibi_gqa
FLASHATTN_CUDA_PATH=sm90 timeout 90 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 10 $SP \
  --gtest_filter="$F" > $OUT/san-racecheck-lane0.txt 2>&1
echo "racecheck sparse LANE0_READS: rc $? $(grep -E 'RACECHECK SUMMARY' $OUT/san-racecheck-lane0.txt | tail -1) ok $(grep -c 'OK \]' $OUT/san-racecheck-lane0.txt)"
t "racecheck"
python3 dev/ab_table.py $OUT/ab-base.json $OUT/ab-chunks.json $OUT/ab-c2.json $OUT/ab-c2chunks.json
