#!/usr/bin/env bash
# GPU machine (device tool), the first call of a session after sessions without a device: what
# the default has not had on a GPU (dev/NOTES.md to-do 22). One call of at most ~560 s:
#   C++ build (64;128;256, fp16 and bf16, sm_90, tests) and a bf16 package (64;128;256),
#   concurrently; then concurrently: ctest under sm90 and under auto (fp16 since s31, the C++
#   Special / Correctness sink and fully-masked cases, flashattn_test_paged_varlen's CUDA cases,
#   KVCache, CApi), pytest (test_cuda incl. the bad device cu_seqlens case, test_sink,
#   test_paged_varlen, test_kvcache) under sm90, compute-sanitizer memcheck (tensors as their
#   own allocations) and racecheck of the paged varlen cases, the bad-cu_seqlens cases and the
#   short-rows tile cases; then the decode suite (kvcache rows against
#   bench/results/h200-2026-12-04-decode-b3a666a.json; varlen_paged16 for the first time).
# Carry [".whl/transformers"] (32 MB, `pip download` here, to-do 22) for test_transformers.
# Logs and JSON in $OUT/unrun.tar.gz; a short summary printed last. The forward record (two
# passes, d64-d256 512-16k) is PART=record, a second call:
#   OUT=$OUT PART=record bash dev/unrun_check.sh      (~150 s build + 2 x ~100 s, not timed)
# and the varlen clamps' A/B a third (a d128 package with -DFLASHATTN_DEV_NO_VARLEN_CLAMP;
# dev/varlen_probe.py on sm90, sm80 and with softcap, bench.py d128; ratios clamp / no clamp):
#   OUT=$OUT PART=ab bash dev/unrun_check.sh          (~150 s build + 2 passes, not timed)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/unrun-logs; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pack() { tar -czf "$OUT/unrun.tar.gz" -C $L . 2>/dev/null; }
pkg() {  # pkg DIR DTYPES
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target "$1" \
    -Cbuild-dir=build-"$(basename "$1")" -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" "-Ccmake.define.FLASHATTN_CUDA_DTYPES=$2" .
}

if [ "${PART:-tests}" = record ]; then
  pkg /tmp/fa-def bf16 >$L/pip-rec.log 2>&1; echo "pip rc=$? $(el)"; pack
  for p in 1 2; do
    PYTHONPATH=/tmp/fa-def python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn --dtypes bf16 \
      --no-backward --head-dims 64,128,256 --seqlens 512,1024,2048,16384 --repeats 30 \
      --out "$L/rec-$p.json" >>$L/bench-rec.txt 2>&1
    echo "record pass $p rc=$? $(el)"; pack
  done
  python3 dev/ab_table.py $L/rec-1.json $L/rec-2.json 2>&1 | tail -26
  pack; exit 0
fi
if [ "${PART:-tests}" = ab ]; then
  # d128 bf16 packages with the clamps (the default code) and without (to-do 22/23).
  for v in def noclamp; do
    flags=""; [ $v = noclamp ] && flags=-DFLASHATTN_DEV_NO_VARLEN_CLAMP
    ( CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/fa-$v \
        -Cbuild-dir=build-ab-$v -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
        -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
        "-Ccmake.define.CMAKE_CUDA_FLAGS=$flags" . >$L/pip-$v.log 2>&1
      echo "pip $v rc=$? $(el)" ) &
  done
  wait; pack
  # Clamp A/B, two passes in alternating order: varlen packs on sm90 (plain and softcap: the
  # modifier backward whose spills moved) and sm80 (its forward's spills moved), and the dense
  # d128 rows (their kernels share the prologue's SASS changes).
  if [ -d /tmp/fa-noclamp/flashattn ] && [ -d /tmp/fa-def/flashattn ]; then
    for p in 1 2; do
      order="def noclamp"; [ $p = 2 ] && order="noclamp def"
      for v in $order; do
        for path in sm90 sm80; do
          FLASHATTN_CUDA_PATH=$path PYTHONPATH=/tmp/fa-$v:dev timeout 60 python3 dev/varlen_probe.py \
            --out $L/ab-varlen-$path-$v-$p.json >>$L/ab.txt 2>&1 || echo "varlen $path $v failed" >>$L/ab.txt
        done
        FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/fa-$v:dev timeout 60 python3 dev/varlen_probe.py --softcap 30 \
          --out $L/ab-varlen-cap-$v-$p.json >>$L/ab.txt 2>&1 || echo "varlen cap $v failed" >>$L/ab.txt
        PYTHONPATH=/tmp/fa-$v timeout 90 python3 bench/bench.py --suite full --impls flashattn --dtypes bf16 \
          --head-dims 128 --seqlens 2048,16384 --repeats 20 --out $L/ab-dense-$v-$p.json >>$L/ab.txt 2>&1
        echo "ab pass $p $v $(el)"; pack
      done
    done
    python3 - $L <<'PYAB'
import glob, json, statistics, sys
L = sys.argv[1]
def fig(r):
    return [(k, r[k]) for k in ("fwd_tflops", "bwd_tflops", "tb_per_s") if k in r]
for kind in ("varlen-sm90", "varlen-sm80", "varlen-cap", "dense"):
    base = {}
    for v in ("def", "noclamp"):
        for f in sorted(glob.glob(f"{L}/ab-{kind}-{v}-*.json")):
            for r in json.load(open(f))["rows"]:
                key = (r.get("d"), r.get("pack", r.get("n")), r.get("causal"))
                for name, x in fig(r) if "pack" in r else [(n, r.get("flashattn", {}).get(n)) for n in ("fwd_tflops", "bwd_tflops")]:
                    if x: base.setdefault((key, name), {}).setdefault(v, []).append(x)
    for (key, name), d in sorted(base.items(), key=str):
        if len(d) == 2:
            a, b = statistics.mean(d["def"]), statistics.mean(d["noclamp"])
            print(f"{kind:12s} {str(key):28s} {name:11s} clamp {a:8.2f} noclamp {b:8.2f} ratio {a / b:.3f}")
PYAB
  fi
  pack; exit 0
fi

( cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_CUDA_ARCHITECTURES=90 \
    "-DFLASHATTN_CUDA_HEAD_DIMS=64;128;256" >$L/build.log 2>&1 && cmake --build build-gpu -j 16 >>$L/build.log 2>&1
  echo "cmake rc=$? $(el)" ) &
( pkg /tmp/fa-def bf16 >$L/pip.log 2>&1; echo "pip rc=$? $(el)" ) &
wait
grep -h "spill\|C751" $L/build.log | sort | uniq -c | head -5
pack
for path in sm90 auto; do
  ( FLASHATTN_CUDA_PATH=$path timeout 200 ctest --test-dir build-gpu -j 4 --output-on-failure \
      -LE "^(large|install)\$" >$L/ctest-$path.log 2>&1
    echo "ctest $path rc=$? $(grep -E 'tests passed|tests failed' $L/ctest-$path.log) $(el)" ) &
done
# transformers from the wheels carried in .whl/transformers (pip download on the dev machine,
# to-do 22), for test_transformers' first run with flashattn really in the models.
tf=""
if [ -d .whl/transformers ]; then
  # --no-deps, wheel by wheel: with --target pip would look for numpy among the wheels too.
  python3 -m pip install -q --no-index --no-deps --target /tmp/tf .whl/transformers/*.whl \
    >$L/pip-tf.log 2>&1 && tf=/tmp/tf
  echo "transformers wheels rc=$? $(el)"
fi
( FLASHATTN_CUDA_PATH=sm90 PYTHONPATH=/tmp/fa-def${tf:+:$tf} timeout 260 python3 -m pytest tests/python/test_cuda.py \
    tests/python/test_sink.py tests/python/test_paged_varlen.py tests/python/test_kvcache.py \
    tests/python/test_transformers.py tests/python/test_fa3.py \
    -q -p no:cacheprovider >$L/pytest.log 2>&1; echo "pytest rc=$? $(tail -1 $L/pytest.log) $(el)" ) &
( export PYTHONPATH=/tmp/fa-def
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck python3 dev/san_cases.py \
    --only varlen_bad_cu,varlen_bad_cu_d64,paged_varlen_decode,paged_varlen_prefill,decode_tokens_fold,decode_tokens_fold_g7,decode_tokens_fold_2tiles >$L/san-memcheck.log 2>&1
  echo "memcheck rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-memcheck.log | tr '\n' ' ') $(el)"
  FLASHATTN_CUDA_PATH=sm80 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 100 compute-sanitizer --tool memcheck \
    python3 dev/san_cases.py --only varlen_bad_cu,varlen_bad_cu_d64 >$L/san-memcheck-sm80.log 2>&1
  echo "memcheck sm80 rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-memcheck-sm80.log | tr '\n' ' ') $(el)" ) &
( export PYTHONPATH=/tmp/fa-def FLASHATTN_CUDA_PATH=sm90
  timeout 200 compute-sanitizer --tool racecheck python3 dev/san_cases.py --only paged_varlen_decode,\
paged_varlen_prefill,varlen_bad_cu,decode_tokens_fold,fwd_d128_short_tiles_causal,fwd_d128_short_tiles,fwd_d64_short_tiles_causal \
    >$L/san-racecheck.log 2>&1
  echo "racecheck rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-racecheck.log | tr '\n' ' ') $(el)" ) &
wait
grep -E "^\s*[0-9]+/[0-9]+ Test.*(Failed|Timeout|Exception)" $L/ctest-*.log | head -10
grep -E "^(FAILED|ERROR)" $L/pytest.log | head -10
pack
PYTHONPATH=/tmp/fa-def timeout 150 python3 bench/bench.py --suite decode \
  --impls kvcache,kvcache_paged16,varlen_paged16,sdpa_cudnn --out $L/decode.json >$L/bench-decode.txt 2>&1
echo "decode rc=$? $(el)"
tail -30 $L/bench-decode.txt
pack
echo "done $(el)"
