#!/usr/bin/env bash
# SASS and spill changes between two trees, over a set of instantiation files, on this machine
# (no GPU): dev/sass_md5.sh on each file of each tree (two at a time), then one line per file
# whose SASS or ptxas spill figures differ, with its instruction counts, its spill bytes and,
# for files whose spills moved, the local-memory instructions in and outside the loops
# (dev/spills_in_loops.py; "hot" = its hottest loop: the per-block loop of the sm80 kernels, the
# tile loop of the persistent sm90 ones, whose per-block loop it lists as "innermost MMA loop").
#   dev/sass_diff.sh BASE_TREE NEW_TREE [GLOB] [-- nvcc args]
#   e.g. git worktree add /tmp/base HEAD~1; dev/sass_diff.sh /tmp/base . 'hdim128_bf16*'
# GLOB selects src/cuda/instantiations/*GLOB*.cu (default hdim128_bf16: 32 files, ~5 min a
# tree on 2 cores). The defines are those of a 64;128;256 bf16 sm90 build; more after `--`.
# Needs nvcc and a cuobjdump (CUOBJDUMP=path, as dev/sass_md5.sh). The trees' folder names must
# differ (dev/sass_md5.sh names its objects after them).
set -euo pipefail
base=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
shift 2
glob=hdim128_bf16
if [ $# -gt 0 ] && [ "$1" != "--" ]; then glob=$1; shift; fi
[ "${1:-}" = "--" ] && shift
if [ "$(basename "$base")" = "$(basename "$new")" ]; then
  echo "sass_diff: the trees' folder names must differ (both $(basename "$new"))" >&2; exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
defs=(-DFLASHATTN_WITH_CUDA -DFLASHATTN_CUDA_DTYPE_BF16 -DFLASHATTN_CUDA_HDIM_64 -DFLASHATTN_CUDA_HDIM_128
      -DFLASHATTN_CUDA_HDIM_256 -DFLASHATTN_CUDA_SM90 "$@")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for tree in "$base" "$new"; do
  tag=$([ "$tree" = "$base" ] && echo base || echo new)
  # Each tree's own files; one that fails to compile is reported and left out.
  (cd "$tree" && ls src/cuda/instantiations/*"$glob"*.cu) |
    xargs -P 2 -I{} sh -c 'bash "$0" "$@" || echo "$2: failed to compile" >&2' \
      "$here/sass_md5.sh" "$tree" {} "${defs[@]}" > "$out/$tag.txt"
done
python3 - "$out" "$base" "$new" "$here" <<'EOF'
import os, re, subprocess, sys
out, base, new, here = sys.argv[1:5]
def load(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 3:
            rows[f[0]] = (f[1], int(f[2]), re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line))
    return rows
def loops(tree, name):
    obj = f"/tmp/sass_{os.path.basename(tree)}_{name}.o"
    sass = subprocess.run([os.environ.get("CUOBJDUMP", "cuobjdump"), "-sass", obj], capture_output=True, text=True).stdout
    report = subprocess.run([sys.executable, f"{here}/spills_in_loops.py"], input=sass, capture_output=True, text=True).stdout
    hits = re.findall(r"local-memory instructions (\d+), in loops (\d+), in the hottest loop (\d+)", report)
    return " ".join(f"{a}/{b}/{c}" for a, b, c in hits if a != "0") or "none"
a, b = load(f"{out}/base.txt"), load(f"{out}/new.txt")
same = 0
for name in sorted(set(a) | set(b)):
    x, y = a.get(name), b.get(name)
    if x is None or y is None:
        print(f"{name}: only in {'new' if x is None else 'base'}")
        continue
    if x[0] == y[0]:
        same += 1
        continue
    spill = lambda r: " ".join(f"{s}/{l}" for s, l in r[2] if (s, l) != ("0", "0")) or "0"
    line = f"{name}: {x[1]} -> {y[1]} instructions, spill bytes {spill(x)} -> {spill(y)}"
    if x[2] != y[2]:
        line += f"; local-memory instructions all/in loops/hot: {loops(base, name)} -> {loops(new, name)}"
    print(line)
print(f"{same} of {len(set(a) & set(b))} files with identical SASS")
EOF
