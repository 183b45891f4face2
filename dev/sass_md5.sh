#!/usr/bin/env bash
# md5 of one instantiation's SASS, for "refactor leaves the code unchanged" checks on this machine
# (no GPU): compiles FILE.cu of TREE for sm_90a with -Xptxas -v and prints the hash of every
# instruction line (addresses and encodings stripped, all kernels of the object), the line count
# and ptxas's spill / C75xx lines. Extra arguments go to nvcc (e.g. -DFLASHATTN_DEV_...).
#   dev/sass_md5.sh /path/to/tree src/cuda/instantiations/sm90fwd_hdim128_bf16_window.cu [-DX]
# cuobjdump: CUDA's, or the pip wheels nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm (CUOBJDUMP=path).
# Addresses have four or more hex digits: a pattern of exactly four hashed only each kernel's
# first 4096 instructions (the sessions before 2026-12-03 s16 used such a script).
set -euo pipefail
tree=$1 f=$2; shift 2
name=$(basename "$f" .cu); tag=$(basename "$tree")
obj=/tmp/sass_${tag}_${name}.o log=/tmp/ptxas_${tag}_${name}.txt txt=/tmp/sass_${tag}_${name}.txt
( cd "$tree" && nvcc -c -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Xptxas=-v --expt-relaxed-constexpr \
    -std=c++20 -I include -I src "$@" "$f" -o "$obj" ) > "$log" 2>&1 || { tail -20 "$log"; exit 1; }
"${CUOBJDUMP:-cuobjdump}" -sass "$obj" | grep -E '^\s+/\*[0-9a-f]{4,}\*/' |
  sed -E 's#/\*[0-9a-f]{4,}\*/##; s#/\*[^*]*\*/##g; s/ +/ /g' > "$txt"
echo "$name $(md5sum < "$txt" | cut -c1-12) $(grep -c . "$txt") instructions;" \
  "$(grep -E 'spill|C75' "$log" | sort | uniq -c | sort -rn | head -3 | tr -s ' ' | tr '\n' ';')"
