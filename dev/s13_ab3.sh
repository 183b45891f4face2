#!/usr/bin/env bash
# Thirteenth session (s13), third A/B call (one H200, < 400 s), run from .carry/snap with the base
# tree in ../base: d128 without a mask up to 1024 rows on the short-rows kernel (128 x 128 tile,
# row sums on the tensor cores: m64n136 over a ones panel beside each stage's V) against the
# default 128 x 176 kernel. base = ../base (d128 bf16), new = . (d64;128 bf16). test_cuda.py and
# test_torch.py under FLASHATTN_CUDA_PATH=sm90 on new; memcheck, racecheck, synccheck of
# dev/san_cases.py bwd_d128 (1 x 1024 x 2, unmasked: the new kernel) on new; the forward against
# SDPA cuDNN at d128 512 / 1k / 2k, causal and not, base, new, base, new (one process each).
# Writes $OUT/ab3-{base,new,base2,new2}.json, $OUT/logs.tgz.
set -uo pipefail
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local left=$(( 390 - ($(date +%s) - T0) )); (( left < $1 )) && echo $(( left > 1 ? left : 1 )) || echo "$1"; }
OUT=${OUT:-/tmp/flashattn-out}; mkdir -p "$OUT" /tmp/logs
build() {  # name tree dims
  ( cd "$2" && CMAKE_BUILD_PARALLEL_LEVEL=8 timeout 200 python3 -m pip install --no-build-isolation --no-deps -q \
      --target /tmp/ab-$1 -Cbuild-dir=/tmp/bab-$1 -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
      "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=$3" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . > /tmp/logs/pip-$1.log 2>&1 )
}
build base ../base "128" & build new . "64;128" & wait
for n in base new; do [ -d /tmp/ab-$n/flashattn ] || { echo "build $n failed"; grep -E "error" /tmp/logs/pip-$n.log | head; }; done
t built
for f in test_cuda test_torch; do
  ( PYTHONPATH=/tmp/ab-new FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 120)" python3 -m pytest tests/python/$f.py -q \
      -p no:cacheprovider > /tmp/logs/test-$f.log 2>&1; echo "$f sm90 new: $(tail -1 /tmp/logs/test-$f.log)" ) &
done
wait
grep -hE "^FAILED|Error" /tmp/logs/test-*.log | head -6
t tested
for tool in memcheck racecheck synccheck; do
  PYTHONPATH=/tmp/ab-new FLASHATTN_CUDA_PATH=sm90 timeout "$(cap 50)" compute-sanitizer --tool $tool --print-limit 20 \
    python3 dev/san_cases.py --only bwd_d128 > /tmp/logs/san-$tool.txt 2>&1
  t "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/logs/san-$tool.txt | tail -1) $(grep -c 'ok$' /tmp/logs/san-$tool.txt) ok"
done
for run in base new base2 new2; do
  n=${run%2}
  PYTHONPATH=/tmp/ab-$n timeout "$(cap 40)" python3 bench/bench.py --suite full --dtypes bf16 --head-dims 128 \
    --seqlens 512,1024,2048 --impls flashattn,sdpa_cudnn --no-backward --repeats 20 --out $OUT/ab3-$run.json \
    > /tmp/logs/bench-$run.log 2>&1
  t "bench $run rc $?"
done
tar czf $OUT/logs.tgz -C /tmp/logs .
python3 dev/ab_table.py $OUT/ab3-base.json $OUT/ab3-new.json $OUT/ab3-base2.json $OUT/ab3-new2.json 2>&1 | tail -8
