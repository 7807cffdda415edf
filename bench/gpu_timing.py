"""GPU time of a callable that launches CUDA work, for the Python benchmarks (compare.py,
peers_sdpa.py): CUDA events around the launches only, as docs/benchmarking.md asks.

Recording the start event and then calling a Python function leaves the GPU idle while the host
works its way to the first launch (autograd, dispatch, ctypes): events around a single call would
count that host time. So the stream is first kept busy with a sleep kernel longer than the host
needs to enqueue the whole call; the start event then fires when the sleep ends, with every launch
of the call already queued behind it, and the events measure the kernels alone. Host overhead per
call is reported separately (tests/python/overhead.py).

Calls of a few microseconds (decode: one query row against a KV cache) are timed from CUDA-graph
replays instead (graph_replay_ms): many calls between the two events, each launched as one graph,
so that neither the host's way to the launches nor event resolution weighs on the result.
"""
import itertools
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


def captured_graphs(torch, fns, warmup):
    """Each callable of `fns` warmed up `warmup` times on a side stream, as capture requires, then
    captured once in a CUDA graph of its own and replayed once (a graph's first replay also uploads
    it). Returns (graphs, outputs): keep the outputs alive as long as the graphs that write them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(1, warmup)):
            for fn in fns:
                fn()
    torch.cuda.current_stream().wait_stream(side)
    graphs, outputs = [], []
    for fn in fns:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs.append(fn())
        graphs.append(graph)
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    return graphs, outputs


def graph_replay_ms(torch, fns, warmup, replays, measurements=5):
    """GPU time of one call from CUDA-graph replays. Each callable of `fns` (one call, or the same
    call on several copies of its inputs, so that a replay does not find them in L2) is captured in
    a graph of its own (captured_graphs). A measurement replays the graphs in turn `replays` times
    between two events, queued behind a sleep kernel as in median_ms, and divides. Returns (median
    ms per call over `measurements`, replays per measurement)."""
    graphs, outputs = captured_graphs(torch, fns, warmup)
    # One cycle across all measurements: a graph's inputs come back only after every other graph's.
    turns = itertools.cycle(graphs)
    enqueue_start = time.perf_counter()
    for _ in range(replays):
        next(turns).replay()
    host_ms = (time.perf_counter() - enqueue_start) * 1e3
    torch.cuda.synchronize()
    sleep_cycles = int(max(1.0, 2 * host_ms) * _SLEEP_CYCLES_PER_MS)
    times = []
    for _ in range(measurements):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        for _ in range(replays):
            next(turns).replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / replays)
    return statistics.median(times), replays
