#!/usr/bin/env bash
# Thirteenth session (s13), GPU call 1 (one H200, < 420 s), run from .carry/snap with .carry/fa4a
# beside it (the first half of the FlashAttention-4 wheels, kept in /tmp/fa4w for call 2):
#  1. the package for the session (d64;128;192;256 bf16) in /tmp/pk, kept for call 2;
#  2. Nsight Compute sections of the short-rows forward, ours against cuDNN's (its kernels are
#     64 x 128 tiles of one warpgroup, 4x1x1): d64 causal 1k and 512, d128 512; the SASS source
#     page of ours at d64 causal 1k;
#  3. compute-sanitizer racecheck and synccheck of the two-CTA d64 short-rows forward, synccheck
#     of the backward cases (dev/san_cases.py under FLASHATTN_CUDA_PATH=sm90).
# Writes $OUT/ncu.tgz, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 410 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs /tmp/fa4w /tmp/ncu
[ -d ../fa4a ] && cp ../fa4a/* /tmp/fa4w/ && t "fa4a kept: $(ls /tmp/fa4w | wc -l) files"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 220 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/pk \
  -Cbuild-dir=/tmp/bb -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" \
  "-Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16" . > /tmp/logs/pip.log 2>&1
[ -d /tmp/pk/flashattn ] || { echo "build failed"; grep -E "error" /tmp/logs/pip.log | head; tar czf $OUT/logs.tgz -C /tmp/logs .; exit 1; }
t built
export PYTHONPATH=/tmp/pk
for shape in "16 32 1024 64 causal" "32 32 512 64 causal" "32 16 512 128"; do
  PEERS=sdpa_cudnn OUT=/tmp/ncu timeout "$(cap 60)" bash dev/ncu_attn.sh fwd "$shape" > /tmp/logs/ncu-$(echo $shape | tr ' ' _).txt 2>&1
  t "ncu $shape rc $?"
done
OUT=/tmp/ncu timeout "$(cap 60)" bash dev/ncu_source.sh fwd "16 32 1024 64 causal" > /tmp/logs/ncu-src.txt 2>&1
t "ncu source rc $?"
tar czf $OUT/ncu.tgz -C /tmp/ncu .
san() {  # tool cases
  FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 80)" compute-sanitizer --tool $1 --print-limit 20 python3 dev/san_cases.py --only $2 \
    > /tmp/logs/san-$1-$3.txt 2>&1
  t "$1 $3 rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/san-$1-$3.txt | tail -1) $(grep -cE 'ok$' /tmp/logs/san-$1-$3.txt) ok, $(grep -c FAIL /tmp/logs/san-$1-$3.txt) FAIL"
}
san racecheck fwd_d64_short_causal short
san synccheck fwd_d64_short_causal short
san synccheck bwd_d128_causal,bwd_d128_2tiles,bwd_d64_causal_2tiles,bwd_varlen_causal,bwd_192_128_causal bwd
tar czf $OUT/logs.tgz -C /tmp/logs .
for f in /tmp/logs/ncu-*_*.txt; do echo "== $f"; cut -c1-160 $f | grep -E "fwd_kernel|cudnn|Duration|Registers Per|Achieved Occ|Issued Warp|Executed Ipc A|Executed Instructions  |Theoretical Occ|Block Limit (Reg|Block Limit Sh|Grid Size|Block Size|Compute \(SM\) Th|L2 Cache Th|Memory Throughput|Waves" | head -50; done
