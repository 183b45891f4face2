#!/usr/bin/env bash
# s38 call 2 (GPU machine, right after call 1 on the same warm machine): the FA4 wheels joined
# (first half left in /tmp/fa4w by call 1, second in .carry/fa4b) and installed, then the forward
# and backward record of the default (call 1's base package, 64;128;256 bf16) against cuDNN and
# FA4 in one process per head dim (issues 15 and 20's standings; FA4 last ran in s15 / s23).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/s38logs2; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
pack() { tar -czf "$OUT/logs2.tar.gz" -C $L . 2>/dev/null; }
if [ ! -d /tmp/ab-base/flashattn ]; then  # call 1's base build failed on the A/B's extra instantiation
  rm -f src/cuda/instantiations/sm90fwdshort_hdim128_bf16_window.cu
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/ab-base \
    -Cbuild-dir=build-ab-base -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128;256" \
    -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >$L/pip-base.log 2>&1; echo "pip base rc=$? $(el)"
fi
w=/tmp/fa4w
[ -f $w/cu13.part1 ] || { echo "no first half in $w (machine not call 1's)"; exit 1; }
cat $w/cu13.part1 .carry/fa4b/cu13.part2 >$w/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
rm $w/cu13.part1
site=/tmp/fa4-site; rm -rf $site
python3 -m pip install -q --no-index --no-deps --no-compile --target $site \
  $(ls $w/*.whl | grep -v cutlass_dsl_libs_core) >$L/fa4-install.log 2>&1 || tail -5 $L/fa4-install.log
python3 -c "import sys, zipfile, glob; [zipfile.ZipFile(f).extractall(sys.argv[1]) for f in glob.glob(sys.argv[2] + '/*cutlass_dsl_libs_core*.whl')]" $site $w
export PYTHONPATH="/tmp/ab-base:$site:$site/nvidia_cutlass_dsl/dsl_packages"
python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -2
echo "fa4 $(el)"
for d in 128 64 256; do
  timeout 200 python3 bench/bench.py --suite full --impls flashattn,sdpa_cudnn,fa4 --dtypes bf16 --head-dims $d \
    --repeats 15 --gpu-state --out $L/rec-fa4-d$d.json >$L/bench-d$d.txt 2>&1
  echo "record d$d rc=$? $(el)"; pack
done
# Issue 17's open fold row (paged b1 x 4k x 4 tokens 0.96x unfolded): split counts with the fold
# on and off, dense and 16-row pages, 2 and 4 tokens (dev/decode_splits.py --tokens).
for t in 4 2; do
  for ps in 16 0; do
    PYTHONPATH=/tmp/ab-base timeout 60 python3 dev/decode_splits.py --shapes 1x4096,4x4096 --tokens $t --page-size $ps \
      --splits 0,4,8,12,16,24,32 --switches none,no_token_fold --out $L/splits-t$t-p$ps.json >>$L/splits.txt 2>&1
    echo "splits t$t p$ps rc=$? $(el)"
  done
done
# One token: fold_gqa_decode against the token fold taking its calls (no_decode_fold), alternated.
for ps in 0 16; do
  PYTHONPATH=/tmp/ab-base timeout 60 python3 dev/decode_splits.py --shapes 1x4096,8x16384,64x4096 --page-size $ps \
    --splits 0 --passes 3 --switches none,no_decode_fold --out $L/splits-t1-p$ps.json >>$L/splits.txt 2>&1
  echo "splits t1 p$ps rc=$? $(el)"
done
pack
cat $L/splits.txt | cut -c1-400
for d in 128 64 256; do grep -E "^bf16 " $L/bench-d$d.txt | head -14; done
pack
echo "done $(el)"
