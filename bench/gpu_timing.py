"""GPU time of a callable that launches CUDA work, for the Python benchmarks (compare.py,
peers_sdpa.py): CUDA events around the launches only, as docs/benchmarking.md asks.

Recording the start event and then calling a Python function leaves the GPU idle while the host
works its way to the first launch (autograd, dispatch, ctypes): events around a single call would
count that host time. So the stream is first kept busy with a sleep kernel longer than the host
needs to enqueue the whole call; the start event then fires when the sleep ends, with every launch
of the call already queued behind it, and the events measure the kernels alone. Host overhead per
call is reported separately (tests/python/overhead.py).
"""
import statistics
import time

_SLEEP_CYCLES_PER_MS = 2_000_000  # a Hopper SM clock is below 2 GHz: a generous lower bound on the sleep


def median_ms(torch, fn, warmup, reps, budget_s=float("inf")):
    """Median of `reps` event timings after `warmup` calls; fewer reps (at least 3) when `reps`
    of them would take longer than budget_s. Returns (median ms, reps timed)."""
    start_wall = time.perf_counter()
    host_ms = 0.0
    for _ in range(max(1, warmup)):
        torch.cuda.synchronize()
        enqueue_start = time.perf_counter()
        fn()
        host_ms = max(host_ms, (time.perf_counter() - enqueue_start) * 1e3)
        torch.cuda.synchronize()
        if time.perf_counter() - start_wall > budget_s / 2:
            break
    # Twice the slowest enqueue seen, and at least a millisecond.
    sleep_cycles = int(max(1.0, 2 * host_ms) * _SLEEP_CYCLES_PER_MS)
    times = []
    start_wall = time.perf_counter()
    for i in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        if i >= 2 and time.perf_counter() - start_wall > budget_s:
            break
    return statistics.median(times), len(times)
