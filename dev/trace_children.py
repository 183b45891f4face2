"""Runs a dev/ trace script's child once per shape and summarises what its kernels printed.

A kernel's printf reaches stdout only at a synchronize of the process that launched it, so each
shape runs in a child process of its own (the script itself with --child SHAPE and the extra
arguments), and the parent reads the child's stdout (dev/decode_trace.py)."""
import os
import subprocess
import sys


def run_children(script, shapes, summarize, label, extra_args=(), timeout=120):
    """For each shape: python3 SCRIPT *extra_args --child SHAPE, then summarize(stdout, label(shape)),
    or the child's return code and the end of its stderr when it failed."""
    for shape in shapes:
        res = subprocess.run([sys.executable, os.path.abspath(script), *extra_args, "--child", shape],
                             capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            print(f"{shape}: rc {res.returncode}: {res.stderr[-500:]}")
            continue
        summarize(res.stdout, label(shape))
