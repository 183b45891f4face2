#!/usr/bin/env bash
# Copies the committed tree (HEAD) into .carry/snap for a run on the GPU machine (device tool:
# carry [".carry/snap"], command "cd .carry/snap && bash scripts/gpu-check.sh"), with the commit
# in SOURCE_COMMIT so that results name the code they measured (bench.py reads it).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .carry/snap
mkdir -p .carry/snap
git archive HEAD | tar -x -C .carry/snap
git rev-parse HEAD >.carry/snap/SOURCE_COMMIT
echo "snapshot of $(cat .carry/snap/SOURCE_COMMIT) in .carry/snap"
