#!/usr/bin/env bash
# Session script (s28 call 1, deleted after its run): NOTES to-do items 11 and 12.
# Packages in parallel: mla (576, default = dense TMA, paged cp.async), mlap (576,
# -DFLASHATTN_DEV_MLA_TMA_PAGED), sp (d64;128, default), spp (d64;128,
# -DFLASHATTN_DEV_SM90_SPARSE_BWD_PERSISTENT); and flashattn_test_sparse with the persistent macro.
# Then: correctness first (test_mla on both 576 packages, test_block_sparse under sm90 on spp,
# dev/san_cases.py's sparse cases on spp), MLA kernel times alternated, and the sparse bench alternated twice (Flex in the first run).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT/r"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
build() {  # name dims flags jobs
  CMAKE_BUILD_PARALLEL_LEVEL=$4 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-$1 \
    -Cbuild-dir=build-ab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$2" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 "-Ccmake.define.CMAKE_CUDA_FLAGS=$3" . >"$OUT/r/pip-$1.log" 2>&1
}
gtest_build() {
  cmake -S . -B build-t -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=64;128" -DFLASHATTN_CUDA_DTYPES=bf16 -DFLASHATTN_BUILD_BENCH=OFF \
    "-DCMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_SM90_SPARSE_BWD_PERSISTENT" >"$OUT/r/gtest-build.log" 2>&1 &&
    cmake --build build-t -j 6 --target flashattn_test_sparse >>"$OUT/r/gtest-build.log" 2>&1
}
build mla 576 "" 3 & build mlap 576 "-DFLASHATTN_DEV_MLA_TMA_PAGED" 3 &
build sp "64;128" "" 6 & build spp "64;128" "-DFLASHATTN_DEV_SM90_SPARSE_BWD_PERSISTENT" 6 &
gtest_build & gpid=$!
wait -n; wait -n; wait -n; wait -n; wait -n
for n in mla mlap sp spp; do [ -d /tmp/ab-$n/flashattn ] || { echo "build $n failed"; tail -30 "$OUT/r/pip-$n.log"; }; done
[ -x build-t/tests/cpp/flashattn_test_sparse ] && echo "gtest built" || { echo "gtest build failed"; tail -20 "$OUT/r/gtest-build.log"; }
grep -h "spill" build-ab-spp/*.log "$OUT"/r/pip-*.log 2>/dev/null | sort | uniq -c | head -5
echo "$(el) built"

# Correctness.
for n in mla mlap; do
  PYTHONPATH=/tmp/ab-$n timeout 120 python3 -m pytest tests/python/test_mla.py -q -p no:cacheprovider >"$OUT/r/mla-$n.log" 2>&1
  echo "test_mla $n rc=$?: $(tail -1 "$OUT/r/mla-$n.log")"
done
PYTHONPATH=/tmp/ab-spp FLASHATTN_CUDA_PATH=sm90 timeout 200 python3 -m pytest tests/python/test_block_sparse.py -q \
  -p no:cacheprovider >"$OUT/r/bs-spp.log" 2>&1
echo "test_block_sparse spp sm90 rc=$?: $(tail -1 "$OUT/r/bs-spp.log")"
PYTHONPATH=/tmp/ab-spp FLASHATTN_CUDA_PATH=sm90 timeout 60 python3 dev/san_cases.py --only bwd_sparse_d128,bwd_sparse_d64 \
  >"$OUT/r/sparse-cases.log" 2>&1
echo "sparse cases rc=$?"; cat "$OUT/r/sparse-cases.log" | tail -10
echo "$(el) correctness"
# MLA kernel times, alternated.
for pass in 1 2; do
  for n in mla mlap; do
    PYTHONPATH=/tmp/ab-$n timeout 90 python3 dev/kernel_split.py --mla --shapes 8:8192:16,64:32768:16,1:4096:16,8:8192:128 \
      --impls flashattn_latent,flashattn_latent_paged64 --calls 20 --out "$OUT/r/mla-$n-$pass.json" >"$OUT/r/mlat-$n-$pass.log" 2>&1
    echo "$(el) mla $n $pass rc=$?: $(grep -E ' us per call' "$OUT/r/mlat-$n-$pass.log" | sed 's/ us per call//' | tr '\n' ' ')"
  done
done

# Sparse bench, alternated twice (Flex in the first run).
for pass in 1 2; do
  for n in sp spp; do
    [ $(( $(date +%s) - start )) -gt 540 ] && { echo "out of time before bench $n $pass"; break 2; }
    impls=flashattn; [ $pass = 1 ] && [ $n = sp ] && impls=flashattn,flex
    PYTHONPATH=/tmp/ab-$n timeout 150 python3 bench/bench.py --block-density 0.1,0.5 --head-dims 64,128 --impls $impls \
      --repeats 10 --out "$OUT/r/sb-$n-$pass.json" >"$OUT/r/sb-$n-$pass.log" 2>&1
    echo "$(el) bench $n $pass rc=$?"
  done
done
ls "$OUT"/r/sb-*.json >/dev/null 2>&1 && python3 dev/ab_table.py --figure bwd_tflops --peer flex $(ls "$OUT"/r/sb-sp-1.json "$OUT"/r/sb-spp-1.json "$OUT"/r/sb-sp-2.json "$OUT"/r/sb-spp-2.json 2>/dev/null)
echo "total $(el)"
tar czf "$OUT/s28c1.tgz" -C "$OUT" r && rm -rf "$OUT/r"
