#!/usr/bin/env bash
# Session script (s23 call 2, deleted after its run): branch bwd-d64-rows128 (the d64 backward
# stepping 128 query rows). Packages: r128 (the branch's default, d64;128 bf16) and base
# (-DFLASHATTN_DEV_SM90_BWD_D64_ROWS=64: main's d64 SASS, md5-checked; d64 bf16), in parallel.
# r128: test_cuda / test_torch under sm90 and auto, sanitizers on dev/san_cases.py's d64 backward
# cases; then bench.py issue3 d64 (ours + cuDNN, same process), base / r128 / base / r128.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
build() {  # name dims flags
  CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=$3" . >"$OUT/r/pip-$1.log" 2>&1
}
build r128 "64;128" "" & build base "64" "-DFLASHATTN_DEV_SM90_BWD_D64_ROWS=64" & wait
for n in r128 base; do [ -d /tmp/ab-$n/flashattn ] || { tail -30 "$OUT/r/pip-$n.log"; exit 1; }; done
echo "$(el) built"
export PYTHONPATH=/tmp/ab-r128
for path in sm90 auto; do
  FLASHATTN_CUDA_PATH=$path timeout 240 python3 -m pytest tests/python/test_cuda.py tests/python/test_torch.py -q -x \
    -p no:cacheprovider >"$OUT/r/pytest-$path.log" 2>&1
  echo "pytest $path rc=$?: $(tail -1 "$OUT/r/pytest-$path.log")"
done
echo "$(el) pytest"
cases=bwd_d64,bwd_d64_causal,bwd_d64_causal_2tiles,bwd_varlen_causal_d64,bwd_d64_det
for tool in memcheck racecheck synccheck; do
  FLASHATTN_CUDA_PATH=sm90 timeout 150 compute-sanitizer --tool $tool python3 dev/san_cases.py --only $cases \
    >"$OUT/r/san-$tool.log" 2>&1
  echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|ALL OK|SOME FAILED' "$OUT/r/san-$tool.log" | tr '\n' ' ')"
  grep -E "FAIL|Race reported|Invalid" "$OUT/r/san-$tool.log" | head -3
done
echo "$(el) sanitizers"
for pass in 1 2; do
  for n in base r128; do
    PYTHONPATH=/tmp/ab-$n python3 bench/bench.py --suite issue3 --impls flashattn,sdpa_cudnn --dtypes bf16 --head-dims 64 \
      --seqlens 1024,2048,4096,8192,16384 --repeats 15 --out "$OUT/r/ab-$n-$pass.json" >"$OUT/r/bench-$n-$pass.log" 2>&1
    echo "$(el) bench $n $pass rc=$?"
  done
done
python3 dev/ab_table.py --figure bwd_tflops "$OUT"/r/ab-base-1.json "$OUT"/r/ab-r128-1.json "$OUT"/r/ab-base-2.json "$OUT"/r/ab-r128-2.json
python3 dev/ab_table.py --figure fwdbwd_tflops "$OUT"/r/ab-base-1.json "$OUT"/r/ab-r128-1.json "$OUT"/r/ab-base-2.json "$OUT"/r/ab-r128-2.json 2>&1 | tail -12
echo "total $(el)"
tar czf "$OUT/s23c2.tgz" -C "$OUT" r && rm -rf "$OUT/r"
