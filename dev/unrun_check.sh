#!/usr/bin/env bash
# GPU machine (device tool): what the default has not had on a GPU. The default part is s38's,
# s39's and s40's (dev/NOTES.md to-do 24 (0), 25 and 26; s36's list, which ran in s37, is in git
# history): one call of ~6-8 min (not timed; every step packs its logs, so a call cut at the
# device's 600 s keeps what ran), a C++ build (64;128;256;576, fp16 and bf16, tests) and a
# package (64;128;256) concurrently; then
#   - ctest of s38's two test fixes (FusedSplitCombine, Sm90BackwardRunsUnpaddedAt192_128), the
#     layout test and GqaTokensFoldedIntoRows, and s39's sm90 cache kernel (KVCacheSm90.*,
#     PagedVarlen.ChunkedPrefillOnTheSm90CacheKernel, and s40's mixed batches split between it
#     and the sm80 kernels, ...SplitBetweenKernels: the switch flipped in-process) with the
#     rest of KVCache.* and Mla.* (s39 made KVCacheParams::row_offset's page arithmetic 32-bit:
#     the append and MLA kernels' lookups; the C++ build has 576 for them), under sm90 and auto,
#     with --output-on-failure;
#   - s39's dbias with softcap (the sm80 backward's kFactorLater kernel): ctest ScoreMods' CUDA cases
#     (its softcap cases with dbias, declined before), SparseCuda's bias cases (the whole suite
#     takes ~350 s), SparseCudaDifferential.*, and
#     pytest test_bias -k "dbias_with_softcap or sm90_bias_backward" (the refactored helper too);
#   - pytest: test_kvcache -k "gqa_tokens_fold or sm90_cache" (the one-token fold against the
#     token fold; the cache kernel against the CPU backend, the reference and the sm80 kernels),
#     test_paged_varlen, test_cuda / test_sink -k 128 under sm90 in both dtypes (masked d128
#     short rows' first fp16 run, the new LONG_SHAPES: short rows without keys, the window kernel
#     past 512 rows);
#   - compute-sanitizer synccheck / racecheck of the masked d128 short kernel's tile cases,
#     memcheck / racecheck / synccheck of the sm90 cache kernel (paged_varlen_prefill_sm90*,
#     paged_varlen_mixed_sm90: NaN in every page row past a sequence, cp.async rows,
#     arrive.noinc barriers, the split's tile list), and
#     memcheck / racecheck of dbias with softcap (bwd_bias_softcap_*);
# and, in a second call on the same warm machine (OUT=$OUT PART=probes bash dev/unrun_check.sh,
# ~5-8 min, timeouts 580 s in all: a cold machine's ~100 s rebuild cuts the last one short; the
# whole would pass the device's 600 s a command), shortest first:
#   - bench.py flashattn against flashattn_sink, two processes (issue 19's sink cost, to-do 26 (c));
#   - dev/spec_decode_probe.py: the paged split cap for folded steps (predicted: paged b1 x 4k x 4
#     tokens 21.0 -> ~16.6 us, against bench/results/h200-2026-12-05-spec-decode-bf8e838.json);
#   - dev/cache_prefill_probe.py: the cache kernel against the sm80 cache kernels and the packed
#     sm90 forward on prefill chunks, and mixed batches split between them, each launch's kernel
#     time too (dev/NOTES.md "The sm90 cache kernel": predictions).
# Logs in $OUT/unrun.tar.gz, a short summary printed last. dev/fwd_regress_ab.sh (to-do 26 (00))
# is a call of its own, and the varlen clamps' A/B another (a d128 package with
# -DFLASHATTN_DEV_NO_VARLEN_CLAMP; dev/varlen_probe.py on sm90, sm80 and with softcap, bench.py
# d128; ratios clamp / no clamp):
#   OUT=$OUT PART=ab bash dev/unrun_check.sh          (~150 s build + 2 passes, not timed)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/unrun-logs; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
# Steps in parallel subshells pack too: each writes a file of its own and renames it over the
# last one, so no reader sees half a file.
pack() { tar -czf "$OUT/.unrun-$BASHPID.tar.gz" -C $L . 2>/dev/null && mv -f "$OUT/.unrun-$BASHPID.tar.gz" "$OUT/unrun.tar.gz"; }
pkg() {  # pkg DIR DTYPES
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target "$1" \
    -Cbuild-dir=build-"$(basename "$1")" -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" "-Ccmake.define.FLASHATTN_CUDA_DTYPES=$2" .
}

if [ "${PART:-tests}" = probes ]; then
  # The timings, in a second call on the same warm machine (the package from the first; if the
  # machine was handed back, its rebuild takes ~100 s of the 600).
  [ -d /tmp/fa-def/flashattn ] || pkg /tmp/fa-def "fp16;bf16" >$L/pip.log 2>&1
  # Issue 19's sink cost (to-do 26 (c)): with and without learnable_sink in one process (bench.py
  # times them in that order whatever --impls says), in two processes.
  for pass in 1 2; do
    PYTHONPATH=/tmp/fa-def timeout 80 python3 bench/bench.py --suite full --impls flashattn,flashattn_sink --dtypes bf16 \
      --head-dims 64,128 --seqlens 2048,8192 --repeats 20 --out $L/sink-cost-$pass.json >>$L/sink.txt 2>&1
    echo "sink cost pass $pass rc=$? $(el)"
  done
  grep -E "^bf16" $L/sink.txt | cut -c1-300 | tail -16
  pack
  PYTHONPATH=/tmp/fa-def:dev timeout 150 python3 dev/spec_decode_probe.py --out $L/spec-decode.json >$L/spec.txt 2>&1
  echo "spec decode rc=$? $(el)"; tail -14 $L/spec.txt
  pack
  OUT=$L PYTHONPATH=/tmp/fa-def timeout 280 python3 dev/cache_prefill_probe.py >$L/cache-prefill.txt 2>&1
  echo "cache prefill probe rc=$? $(el)"; tail -6 $L/cache-prefill.txt | cut -c1-400
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
    "-DFLASHATTN_CUDA_HEAD_DIMS=64;128;256;576" >$L/build.log 2>&1 && cmake --build build-gpu -j 16 >>$L/build.log 2>&1
  echo "cmake rc=$? $(el)" ) &
( pkg /tmp/fa-def "fp16;bf16" >$L/pip.log 2>&1; echo "pip rc=$? $(el)" ) &
wait
pack
for path in sm90 auto; do
  ( FLASHATTN_CUDA_PATH=$path timeout 300 ctest --test-dir build-gpu -j 4 --timeout 60 --output-on-failure \
      -R "FusedSplitCombine|Sm90BackwardRunsUnpaddedAt192_128|Sm90FwdTile|GqaTokensFolded|KVCache|OnTheSm90CacheKernel|SplitBetweenKernels|Mla|ScoreMods\.MatchesReference/cuda|SparseCudaDifferential|SparseCuda\.[A-Za-z]+/bias" \
      >$L/ctest-$path.log 2>&1
    echo "ctest $path rc=$? $(grep -E 'tests passed|tests failed' $L/ctest-$path.log) $(el)"; pack ) &
done
( export PYTHONPATH=/tmp/fa-def FLASHATTN_CUDA_PATH=sm90
  timeout 300 python3 -m pytest tests/python/test_kvcache.py -k "gqa_tokens_fold or sm90_cache" -q -p no:cacheprovider \
    >$L/pytest-fold.log 2>&1
  rc_cache=$?; echo "pytest fold, sm90 cache rc=$rc_cache $(tail -1 $L/pytest-fold.log) $(el)"; pack
  timeout 200 python3 -m pytest tests/python/test_paged_varlen.py -q -p no:cacheprovider >$L/pytest-paged.log 2>&1
  echo "pytest paged varlen rc=$? $(tail -1 $L/pytest-paged.log) $(el)"; pack
  timeout 300 python3 -m pytest tests/python/test_bias.py -k "dbias_with_softcap or sm90_bias_backward" -q \
    -p no:cacheprovider >$L/pytest-dbias.log 2>&1
  echo "pytest dbias with softcap, sm90 bias backward rc=$? $(tail -1 $L/pytest-dbias.log) $(el)"; pack
  timeout 300 python3 -m pytest tests/python/test_cuda.py tests/python/test_sink.py -k "128" -q -p no:cacheprovider \
    >$L/pytest-128.log 2>&1
  echo "pytest -k 128 (sm90, both dtypes) rc=$? $(tail -1 $L/pytest-128.log) $(el)"; pack
  if [ $rc_cache != 0 ] && grep -q "sm90_cache" $L/pytest-fold.log; then
    # The cache kernel wrong: whether the writer-side proxy fence is what it lacks (dev/NOTES.md
    # "The sm90 cache kernel"; the review's first risk): a d128 package with the fence variant
    # (last, so that it cannot hold the other steps past the device's 600 s).
    timeout 150 env CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q \
      --target /tmp/fa-fence -Cbuild-dir=build-fence -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
      -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 \
      -Ccmake.define.CMAKE_CUDA_FLAGS=-DFLASHATTN_DEV_SM90_CACHE_FENCE . >$L/pip-fence.log 2>&1
    PYTHONPATH=/tmp/fa-fence timeout 120 python3 -m pytest tests/python/test_kvcache.py -k sm90_cache -q \
      -p no:cacheprovider >$L/pytest-fence.log 2>&1
    echo "pytest sm90 cache, FENCE variant rc=$? $(tail -1 $L/pytest-fence.log) $(el)"; pack
  fi ) &
( export PYTHONPATH=/tmp/fa-def FLASHATTN_CUDA_PATH=sm90
  for tool in synccheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool python3 dev/san_cases.py \
      --only fwd_d128_short_tiles_causal,fwd_d128_short_tiles_causal_nokeys,fwd_d128_window_tiles_causal >$L/san-$tool.log 2>&1
    echo "$tool rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-$tool.log | tr '\n' ' ') $(el)"; pack
  done
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool python3 dev/san_cases.py \
      --only paged_varlen_prefill_sm90,paged_varlen_prefill_sm90_p64,paged_varlen_mixed_sm90 >$L/san-cache-$tool.log 2>&1
    echo "cache kernel $tool rc=$? $(grep -E 'SUMMARY|FAIL|did not run' $L/san-cache-$tool.log | tr '\n' ' ') $(el)"; pack
  done ) &
( export PYTHONPATH=/tmp/fa-def
  # dbias with softcap: the sm80 backward's own kernel (beside the other sanitizer runs, so that
  # the part stays within the device's 600 s a command).
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool python3 dev/san_cases.py \
      --only bwd_bias_softcap_d128_causal,bwd_bias_softcap_d64_keypad >$L/san-dbias-cap-$tool.log 2>&1
    echo "dbias with softcap $tool rc=$? $(grep -E 'SUMMARY|FAIL' $L/san-dbias-cap-$tool.log | tr '\n' ' ') $(el)"; pack
  done ) &
wait
grep -E "Failed|FAILED|Error" $L/ctest-*.log $L/pytest-*.log | head -12
pack
echo "done $(el)"
