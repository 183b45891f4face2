#!/usr/bin/env bash
# The session's last device call (2026-12-02): one trimmed build of merged main (d64/128/192/256,
# bf16, with the gtest binaries from the same objects), the GPU tests of what changed, then
# forward+backward against cuDNN, 192/128 (dsv3), decode and bias. Writes under $OUT (<= 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT"
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/fa \
  -Cbuild-dir=/tmp/bfa -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;192;256" \
  -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 -Ccmake.define.FLASHATTN_BUILD_TESTS=ON . >"$OUT/logs-pip.txt" 2>&1 || { tail -30 "$OUT/logs-pip.txt"; exit 1; }
echo "build $(el) s"
export PYTHONPATH=/tmp/fa
logs=/tmp/final-logs; mkdir -p $logs
( cmake --build /tmp/bfa -j 16 --target flashattn_test_special flashattn_test_kvcache >$logs/gtest-build.log 2>&1 &&
  for t in special kvcache; do
    timeout 150 /tmp/bfa/tests/cpp/flashattn_test_$t --gtest_filter='*cuda*:*Cuda*:*Fused*' >$logs/gtest-$t.log 2>&1
    echo "gtest $t rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' $logs/gtest-$t.log | head -2 | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]' $logs/gtest-$t.log | head -5
  done ) &
run() {  # tag path files...
  local tag=$1 path=$2; shift 2
  ( if [ "$path" = auto ]; then unset FLASHATTN_CUDA_PATH; else export FLASHATTN_CUDA_PATH=$path; fi
    timeout 200 python3 -X faulthandler -m pytest "$@" -q -rs -p no:cacheprovider >"$logs/py-$tag.log" 2>&1
    echo "pytest $tag (path $path): rc=$? $(tail -1 "$logs/py-$tag.log")"
    grep -E "^FAILED" "$logs/py-$tag.log" | head -5 )
}
run cuda-auto auto tests/python/test_cuda.py &
run cuda-sm90 sm90 tests/python/test_cuda.py &
run kvcache auto tests/python/test_kvcache.py &
run torch auto tests/python/test_torch.py tests/python/test_host_path.py &
run misc auto tests/python/test_block_sparse.py tests/python/test_fp8.py tests/python/test_sink.py &
wait
echo "tests $(el) s"
bench() {  # tag args...
  local tag=$1; shift
  timeout 120 python3 bench/bench.py --dtypes bf16 --repeats 10 --out "$OUT/bench-$tag.json" "$@" 2>&1 |
    grep -E "^(bf16|fp16) |^decode|error" | cut -c1-180
}
echo "== fwd+bwd vs cuDNN"; bench issue3 --suite issue3 --impls flashattn,sdpa_cudnn --head-dims 64,128,256 --seqlens 1024,4096,16384
echo "== dsv3 (192/128) $(el) s"; bench dsv3 --suite dsv3 --impls flashattn,sdpa_cudnn
echo "== decode $(el) s"; bench decode --suite decode --impls flashattn,kvcache,kvcache_paged16,sdpa_cudnn
echo "== bias $(el) s"; timeout 60 python3 dev/bias_probe.py --seqlens 2048 --out "$OUT/bias.json" 2>&1 | tail -3 | cut -c1-500
echo "total $(el) s"
tar czf "$OUT/logs.tgz" -C $logs . 2>/dev/null
