#!/usr/bin/env bash
# GPU machine (device tool): what the default has not had on a GPU. The default part is s41's
# (s38-s40's lists ran in s41's first calls, H100; they are in git history): one call of ~7 min
# (not timed; every step packs its logs, so a call cut at the device's 600 s keeps what ran), a
# C++ build (64;128;256, tests) and a package (64;128;256, fp16 and bf16) concurrently; then
#   - ctest PagedVarlen.*, KVCache*.*, GqaTokensFolded, Sm90FwdTile under sm90 and auto (the
#     decodes' own launch of a varlen cache call under Switch::kDecodeShare: cuda_backend.cu
#     run_kvcache decode_share, and its test DecodesOnTheirOwnBesideChunks);
#   - pytest test_paged_varlen (all; the four switch settings of the mixed batch) and
#     test_kvcache -k "fold or sm90_cache or paged or graph";
#   - compute-sanitizer memcheck / racecheck / synccheck of paged_varlen_prefill{,_share} (the
#     split on the sm80 kernels), paged_varlen_decode and paged_varlen_mixed_sm90;
#   - last, on an idle GPU: dev/cache_prefill_probe.py (the cache kernel against the sm80 cache
#     kernels and the packed forward; the mixed batches under sm90_cache x decode_share).
# The earlier probes (sink cost, spec_decode_probe) stay as PART=probes in a second call on the
# same warm machine (~2 min):
#   OUT=$OUT PART=probes bash dev/unrun_check.sh
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
DIMS=${DIMS:-64;128;256}  # DIMS="64;128": a shorter build when device time is short
pkg() {  # pkg DIR DTYPES
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target "$1" \
    -Cbuild-dir=build-"$(basename "$1")" -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$DIMS" "-Ccmake.define.FLASHATTN_CUDA_DTYPES=$2" .
}

if [ "${PART:-tests}" = probes ]; then
  # The timings, in a second call on the same warm machine (the package from the first; if the
  # machine was handed back, its rebuild takes ~100 s of the 600).
  [ -d /tmp/fa-def/flashattn ] || pkg /tmp/fa-def "fp16;bf16" >$L/pip.log 2>&1
  # Issue 19's sink cost (to-do 27): paired rounds in one loop (s41's two bench.py processes
  # swung +-10% per row: dev/NOTES.md "Sinks: what they cost").
  PYTHONPATH=/tmp/fa-def timeout 120 python3 dev/sink_cost_probe.py --out $L/sink-cost-paired.json >$L/sink.txt 2>&1
  echo "sink cost rc=$? $(el)"; tail -9 $L/sink.txt | cut -c1-300
  pack
  PYTHONPATH=/tmp/fa-def:dev timeout 150 python3 dev/spec_decode_probe.py --out $L/spec-decode.json >$L/spec.txt 2>&1
  echo "spec decode rc=$? $(el)"; tail -14 $L/spec.txt
  pack
  OUT=$L PYTHONPATH=/tmp/fa-def timeout 280 python3 dev/cache_prefill_probe.py >$L/cache-prefill.txt 2>&1
  echo "cache prefill probe rc=$? $(el)"; tail -6 $L/cache-prefill.txt | cut -c1-400
  pack; exit 0
fi

if [ "${PART:-tests}" = carried ]; then
  # The leanest: a package built on the dev machine for Python 3.12 (d128 bf16, sm_90a), carried
  # as .carry/fa-s41: pytest test_paged_varlen's CUDA cases, memcheck of the two split cases,
  # the probe's mixed batches (~2 min).
  export PYTHONPATH=$PWD/.carry/fa-s41
  timeout 60 python3 -m pytest tests/python/test_paged_varlen.py -q -p no:cacheprovider -k cuda >$L/pytest-paged.log 2>&1
  echo "pytest paged varlen rc=$? $(tail -1 $L/pytest-paged.log) $(el)"; pack
  timeout 40 compute-sanitizer --tool memcheck python3 dev/san_cases.py \
    --only paged_varlen_prefill_share,paged_varlen_mixed_sm90 >$L/san-cache-memcheck.log 2>&1
  echo "memcheck rc=$? $(grep -E 'SUMMARY|FAIL|did not run' $L/san-cache-memcheck.log | tr '\n' ' ') $(el)"; pack
  OUT=$L timeout 80 python3 dev/cache_prefill_probe.py --mixed-only >$L/cache-prefill.txt 2>&1
  echo "cache prefill probe rc=$? $(el)"; grep -v Warn $L/cache-prefill.txt | cut -c1-600 | tail -8
  pack; exit 0
fi

if [ "${PART:-tests}" = lean ]; then
  # The default part cut to fit ~5 min of device time: a bf16 d128 package, pytest
  # test_paged_varlen (its d128 cases; the others skip as not built), memcheck of the two split
  # cases, then the probe (all d128 bf16).
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/fa-def \
    -Cbuild-dir=build-lean -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 -Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=128 \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >$L/pip.log 2>&1
  echo "pip rc=$? $(el)"; pack
  export PYTHONPATH=/tmp/fa-def
  timeout 90 python3 -m pytest tests/python/test_paged_varlen.py -q -p no:cacheprovider -k cuda >$L/pytest-paged.log 2>&1
  echo "pytest paged varlen rc=$? $(tail -1 $L/pytest-paged.log) $(el)"; pack
  timeout 60 compute-sanitizer --tool memcheck python3 dev/san_cases.py \
    --only paged_varlen_prefill_share,paged_varlen_mixed_sm90 >$L/san-cache-memcheck.log 2>&1
  echo "memcheck rc=$? $(grep -E 'SUMMARY|FAIL|did not run' $L/san-cache-memcheck.log | tr '\n' ' ') $(el)"; pack
  OUT=$L timeout 150 python3 dev/cache_prefill_probe.py >$L/cache-prefill.txt 2>&1
  echo "cache prefill probe rc=$? $(el)"; grep -v Warn $L/cache-prefill.txt | cut -c1-300 | tail -12
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
    "-DFLASHATTN_CUDA_HEAD_DIMS=$DIMS" >$L/build.log 2>&1 && cmake --build build-gpu -j 16 >>$L/build.log 2>&1
  echo "cmake rc=$? $(el)" ) &
( pkg /tmp/fa-def "fp16;bf16" >$L/pip.log 2>&1; echo "pip rc=$? $(el)" ) &
wait
pack
for path in sm90 auto; do
  ( FLASHATTN_CUDA_PATH=$path timeout 240 ctest --test-dir build-gpu -j 4 --timeout 60 --output-on-failure \
      -R "PagedVarlen|KVCache|GqaTokensFolded|Sm90FwdTile" >$L/ctest-$path.log 2>&1
    echo "ctest $path rc=$? $(grep -E 'tests passed|tests failed' $L/ctest-$path.log) $(el)"; pack ) &
done
( export PYTHONPATH=/tmp/fa-def
  timeout 200 python3 -m pytest tests/python/test_paged_varlen.py -q -p no:cacheprovider >$L/pytest-paged.log 2>&1
  echo "pytest paged varlen rc=$? $(tail -1 $L/pytest-paged.log) $(el)"; pack
  timeout 200 python3 -m pytest tests/python/test_kvcache.py -k "fold or sm90_cache or paged or graph" -q \
    -p no:cacheprovider >$L/pytest-kvcache.log 2>&1
  echo "pytest kvcache rc=$? $(tail -1 $L/pytest-kvcache.log) $(el)"; pack ) &
( export PYTHONPATH=/tmp/fa-def
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool python3 dev/san_cases.py \
      --only paged_varlen_prefill,paged_varlen_prefill_share,paged_varlen_decode,paged_varlen_mixed_sm90 >$L/san-cache-$tool.log 2>&1
    echo "cache kernels $tool rc=$? $(grep -E 'SUMMARY|FAIL|did not run' $L/san-cache-$tool.log | tr '\n' ' ') $(el)"; pack
  done ) &
wait
grep -E "Failed|FAILED|Error" $L/ctest-*.log $L/pytest-*.log | head -12
pack
# The timings last, on an idle GPU.
OUT=$L PYTHONPATH=/tmp/fa-def timeout 200 python3 dev/cache_prefill_probe.py >$L/cache-prefill.txt 2>&1
echo "cache prefill probe rc=$? $(el)"; grep -v Warn $L/cache-prefill.txt | cut -c1-300 | tail -12
pack
echo "done $(el)"
