#!/usr/bin/env bash
# s38 call 1 (GPU machine): issue 15's written, never-run forward A/Bs (dev/NOTES.md to-do 20 (a)),
# bf16 packages built concurrently:
#   base = the default (64;128;256: call 2 reuses it for the record with FA4)
#   q2w  = FLASHATTN_DEV_SM90_FWD_Q2_WINDOW + SHORT128_MASKED (two Q slots, the Q first, on the
#          plain d64 / d128 window kernels: d64 causal 2k, d128 causal 1k-2k; d128 causal <= 512
#          on the short kernel)
#   s1k  = SHORT128_MAX=1024 + SHORT128_MASKED (d128 up to 1k rows on the short kernel, masked or not)
# Then four passes, the order rotated, each against cuDNN in its process; then the variants'
# correctness (test_cuda under sm90) and racecheck / synccheck of their multi-tile cases, as the
# time left allows. Also keeps the first half of the FA4 wheels in /tmp/fa4w for call 2.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s38logs1; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
left() { echo $(( 560 - ($(date +%s) - start) )); }
pack() { tar -czf "$OUT/logs1.tar.gz" -C $L . 2>/dev/null; }
mkdir -p /tmp/fa4w && cp .carry/fa4a/* /tmp/fa4w/ 2>/dev/null; ls /tmp/fa4w | wc -l
# SHORT128_MASKED's instantiation (dispatched only under that macro; unused code in base).
cat >src/cuda/instantiations/sm90fwdshort_hdim128_bf16_window.cu <<'EOF'
// dev A/B only (SHORT128_MASKED): written by dev/s38_call1.sh on the GPU machine.
#include "cuda/sm90/fwd_launch.h"

namespace flashattn::cuda {
template Status sm90::run_fwd<sm90::FwdShortRowsTraits<__nv_bfloat16, 128, MaskMode::kWindow>>(const ForwardParams&, cudaStream_t);
}  // namespace flashattn::cuda
EOF
ls src/cuda/instantiations/sm90fwdshort_hdim128_bf16_window.cu
pipb() {  # name head_dims [cuda flags]
  local args=(-Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90
              "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16)
  [ -n "${3:-}" ] && args+=("-Ccmake.define.CMAKE_CUDA_FLAGS=$3")
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    "${args[@]}" . >"$L/pip-$1.log" 2>&1
  echo "pip $1 rc=$? $(el)"
}
bench() {  # name tag head_dims seqlens
  PYTHONPATH=/tmp/ab-$1 timeout 90 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 \
    --no-backward --head-dims $3 --seqlens $4 --repeats 30 --out "$L/$2.json" >>$L/bench.txt 2>&1
  echo "bench $2 rc=$? $(el)"
}
pipb base "64;128;256" &
pipb q2w "64;128" "-DFLASHATTN_DEV_SM90_FWD_Q2_WINDOW -DFLASHATTN_DEV_SM90_FWD_SHORT128_MASKED" &
pipb s1k "128" "-DFLASHATTN_DEV_SM90_FWD_SHORT128_MAX=1024 -DFLASHATTN_DEV_SM90_FWD_SHORT128_MASKED" &
wait
grep -h "C751\|spill" $L/pip-*.log | sort | uniq -c | head -5
pack
order=(base q2w s1k)
for p in 1 2 3 4; do
  [ "$(left)" -lt 150 ] && { echo "pass $p skipped (time)"; break; }
  for i in 0 1 2; do
    k=${order[$(( (i + p) % 3 ))]}
    if [ $k = s1k ]; then bench s1k ab-s1k-$p 128 512,1024; else bench $k ab-$k-$p 64,128 512,1024,2048; fi
  done
  pack
done
python3 dev/ab_table.py "base=$L/ab-base-*.json" "q2w=$L/ab-q2w-*.json" "s1k=$L/ab-s1k-*.json" 2>&1 | tail -16
pt() {  # pkg -k-expr
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$1 timeout $(( $(left) - 10 )) python3 -m pytest tests/python/test_cuda.py \
    -k "$2" -q -p no:cacheprovider -x >$L/pytest-$1.log 2>&1; echo "pytest $1 rc=$? $(tail -1 $L/pytest-$1.log) $(el)"
}
san() {  # pkg tool cases
  FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/ab-$1 timeout $(( $(left) - 10 )) compute-sanitizer --tool $2 python3 dev/san_cases.py \
    --only $3 >$L/san-$1-$2.log 2>&1
  echo "san $1 $2 rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$1-$2.log | tr '\n' ' ') $(el)"
}
if [ "$(left)" -gt 60 ]; then
  pt q2w "64 or 128" &
  pt s1k "128" &
  ( PYTHONPATH=/tmp/ab-base timeout $(( $(left) - 10 )) python3 -m pytest tests/python/test_kvcache.py -k gqa_tokens_fold \
      -q -p no:cacheprovider >$L/pytest-fold.log 2>&1; echo "pytest fold (base) rc=$? $(tail -1 $L/pytest-fold.log) $(el)" ) &
  san q2w racecheck fwd_d64_window_tiles_causal,fwd_d128_window_tiles_causal,fwd_d128_short_tiles_causal,fwd_mask_tile &
  san q2w synccheck fwd_d64_window_tiles_causal,fwd_d128_window_tiles_causal &
  san s1k racecheck fwd_d128_window_tiles_causal,fwd_d128_short_tiles &
  wait
fi
pack
echo "done $(el)"
