#!/usr/bin/env bash
# GPU machine (device tool): FlashAttention-4 beside ours, in three back-to-back calls on one warm
# machine (dev/NOTES.md to-do 26 (a)). FA4's wheels are not on the GPU machine and do not fit one
# carry (nvidia-cutlass-dsl-libs-cu13 is 92 MB): .carry/fa4a holds every wheel but that one's
# second half (.carry/fa4b), made on the dev machine from `pip download` into .whl/fa4 (s37/s38).
#   1. carry [".carry/fa4a"]  OUT=$OUT PART=setup bash dev/fa4_calls.sh
#        the first half and the small wheels to /tmp/fa4w; a d64;128 bf16 package of this tree
#   2. carry [".carry/fa4b"]  OUT=$OUT PART=sparse bash dev/fa4_calls.sh
#        the wheel joined and installed; the block-sparse suite (d128, 16 heads, 16k, 128 x 128
#        blocks, densities 1 / 0.5 / 0.1) with flex and fa4 in one process (issue 18's FA4 goal;
#        each peer's out and grads against ours in the row: max_abs_diff_vs_flashattn)
#   3. OUT=$OUT PART=ncu bash dev/fa4_calls.sh
#        ncu of the d128 backward, causal 4 x 16 x 4k (issue 20: FA4 steps 64 rows there too and
#        is 5-10% faster), and of the unmasked d128 forward at 4k (issue 15: 0.90x FA4), ours and
#        FA4 in one process each (dev/ncu_attn.sh; source pages too)
# Results: $OUT/fa4-PART.tar.gz, a short summary printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; L=/tmp/fa4logs; mkdir -p $L
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s]"; }
part=${PART:-setup}
pack() { tar -czf "$OUT/fa4-$part.tar.gz" -C $L . 2>/dev/null; }
w=/tmp/fa4w site=/tmp/fa4-site pkg=/tmp/fa4-ours
fa4_path() { echo "$pkg:$site:$site/nvidia_cutlass_dsl/dsl_packages"; }

case $part in
setup)
  mkdir -p $w && cp .carry/fa4a/* $w/ || { echo "no .carry/fa4a"; exit 1; }
  CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target $pkg \
    -Cbuild-dir=/tmp/fa4-ours-build -Ccmake.define.FLASHATTN_CUDA_ARCHITECTURES=90 \
    "-Ccmake.define.FLASHATTN_CUDA_HEAD_DIMS=64;128" -Ccmake.define.FLASHATTN_CUDA_DTYPES=bf16 . >$L/pip.log 2>&1
  echo "package rc=$? $(el)"; ls $w | wc -l
  ;;
sparse)
  joined=$w/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
  [ -f $joined ] || [ -f $w/cu13.part1 ] || { echo "no first half in $w (not the setup call's machine)"; exit 1; }
  [ -d $pkg/flashattn ] || { echo "no package from the setup call"; exit 1; }
  if [ ! -f $joined ]; then  # (a second run of this part finds it joined)
    cat $w/cu13.part1 .carry/fa4b/cu13.part2 >$joined && rm $w/cu13.part1
  fi
  rm -rf $site
  python3 -m pip install -q --no-index --no-deps --no-compile --target $site \
    $(ls $w/*.whl | grep -v cutlass_dsl_libs_core) >$L/fa4-install.log 2>&1 || tail -5 $L/fa4-install.log
  # The core wheel unpacked as it is (pip's --target drops its dsl_packages layout).
  python3 -c "import sys, zipfile, glob; [zipfile.ZipFile(f).extractall(sys.argv[1]) for f in glob.glob(sys.argv[2] + '/*cutlass_dsl_libs_core*.whl')]" $site $w
  PYTHONPATH=$(fa4_path) python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -2
  PYTHONPATH=$(fa4_path) timeout 480 python3 bench/bench.py --suite sparse --block-density 1,0.5,0.1 \
    --impls flashattn,flex,fa4 --repeats 10 --gpu-state --out $L/sparse-fa4.json >$L/sparse.txt 2>&1
  echo "sparse suite rc=$? $(el)"; grep -E "density|n/a|error" $L/sparse.txt | cut -c1-400 | tail -8
  ;;
ncu)
  python3 -c "import os; assert os.path.isdir('$site/flash_attn')" 2>/dev/null || { echo "no FA4 install (sparse call first)"; exit 1; }
  export PYTHONPATH=$(fa4_path)
  PEERS=fa4 OUT=$L timeout 280 bash dev/ncu_attn.sh bwd "4 16 4096 128 causal" >$L/ncu-bwd-summary.txt 2>&1
  echo "ncu bwd rc=$? $(el)"; pack
  PEERS=fa4 OUT=$L timeout 250 bash dev/ncu_attn.sh fwd "4 16 4096 128" >$L/ncu-fwd-summary.txt 2>&1
  echo "ncu fwd rc=$? $(el)"
  grep -E "^  [a-zA-Z_:]+.*\(|Duration|Warp Cycles Per Issued" $L/ncu-bwd-summary.txt | head -24
  ;;
esac
pack
echo "done $part $(el)"
