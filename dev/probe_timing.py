"""Device time of a call for the dev/ probes (dv_probe.py, bias_probe.py): CUDA events around each
call, median of `repeats` after two warm-up calls, in seconds."""
import statistics

import torch


def timed(fn, repeats):
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)
