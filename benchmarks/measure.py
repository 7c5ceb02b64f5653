"""Timing and memory measurement helpers (CPU and CUDA)."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import statistics
import sys
import threading
import time

import torch

__all__ = ["time_call", "memory_profile", "measure_bandwidth", "cpu_model", "RSSSampler", "sync"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device: torch.device, repeats: int = 5, min_time: float = 0.5, max_repeats: int = 50,
              warmup: int = 1) -> dict:
    """Median wall time of ``fn()`` after warm-up, synchronizing CUDA around every call.

    Repeats at least ``repeats`` times and until ``min_time`` seconds were spent (at most
    ``max_repeats``).  The first (cold) call is reported separately: it includes one-off
    per-hierarchy caches (e.g. a dense cost matrix or pruning statistics).
    """
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    cold = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        fn()
        sync(device)
    times: list[float] = []
    while len(times) < repeats or (sum(times) < min_time and len(times) < max_repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": len(times), "cold_s": cold}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: high-water mark only
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r * (1 if platform.system() == "Darwin" else 1024)


class RSSSampler:
    """Peak resident set size of this process while active (polls /proc/self/statm every ``interval`` s).

    ``tracemalloc`` does not see torch's allocations; RSS does (and also sees memory the
    allocator keeps after a free, so deltas are a lower bound and absolute values an upper one).
    """

    def __init__(self, interval: float = 0.0005):
        self.interval = interval
        self.base = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self):
        self.base = self.peak = _rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the C++ profiler's start/stop log lines (written straight to fd 2)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _self_mem(e, cuda: bool) -> int:
    if cuda:
        for attr in ("self_device_memory_usage", "self_cuda_memory_usage"):
            v = getattr(e, attr, None)
            if v is not None:
                return int(v)
        return 0
    return int(getattr(e, "self_cpu_memory_usage", 0) or 0)


def memory_profile(fn, device: torch.device, top_ops: int = 4) -> dict:
    """One profiled call of ``fn``: tensor-memory peak, largest single allocation, peak RSS, top ops.

    - ``tensor_peak_bytes``: the most bytes of tensors allocated during the call and alive at
      once (torch profiler allocation/free events in time order; CUDA: max_memory_allocated);
    - ``max_alloc_bytes``: the largest single allocation made by one operator — what the
      "no N×L tensor" check compares with N·L·4;
    - ``rss_peak_bytes`` / ``rss_delta_bytes`` (CPU): this process's peak resident memory
      during the call, absolute and above its level before the call;
    - ``top_ops``: operators with the largest self time in that (profiled, so slower) call.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out: dict = {}
    if cuda:
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    sampler = RSSSampler()
    try:
        with sampler, _quiet_stderr():
            with profile(activities=acts, profile_memory=True) as prof:
                fn()
                sync(device)
    except Exception as exc:  # profiler unavailable: fall back to RSS only
        out["profiler_error"] = repr(exc)
        prof = None
    if cuda:
        out["tensor_peak_bytes"] = int(torch.cuda.max_memory_allocated(device) - base)
    if prof is not None:
        events = prof.events()
        mem = sorted(((e.time_range.start, _self_mem(e, cuda)) for e in events if _self_mem(e, cuda) != 0),
                     key=lambda x: x[0])
        run = peak = 0
        largest = 0
        for _, m in mem:
            run += m
            peak = max(peak, run)
            largest = max(largest, m)
        if not cuda:
            out["tensor_peak_bytes"] = int(peak)
        out["max_alloc_bytes"] = int(largest)
        try:
            key = "self_device_time_total" if cuda else "self_cpu_time_total"
            avgs = [a for a in prof.key_averages() if a.key != "[memory]"]
            avgs.sort(key=lambda a: getattr(a, key, 0) or 0, reverse=True)
            total = sum(getattr(a, key, 0) or 0 for a in avgs) or 1
            out["top_ops"] = [{"op": a.key, "share": round((getattr(a, key, 0) or 0) / total, 3), "calls": a.count}
                              for a in avgs[:top_ops]]
        except Exception:  # pragma: no cover - profiler API differences
            pass
    if not cuda:
        out["rss_peak_bytes"] = int(sampler.peak)
        out["rss_delta_bytes"] = int(sampler.peak - sampler.base)
    return out


def measure_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 7) -> float:
    """Sustained copy bandwidth in bytes/s: a large ``dst.copy_(src)`` counts its bytes read + written."""
    if nbytes is None:
        nbytes = 1 << 30 if device.type == "cuda" else 1 << 28
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    del src, dst
    return 2 * nbytes / statistics.median(times)


# Published peak bandwidths (bytes/s) by device-name substring, for reference next to the measured copy.
PEAK_BANDWIDTH = [
    ("H200", 4.8e12), ("H100 SXM", 3.35e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("A100-SXM4-80GB", 2.04e12),
    ("A100-SXM4-40GB", 1.56e12), ("A100", 1.94e12), ("L40S", 8.64e11), ("A10G", 6.0e11), ("T4", 3.2e11),
]


def table_bandwidth(name: str) -> float | None:
    for key, bw in PEAK_BANDWIDTH:
        if key.lower() in name.lower():
            return bw
    return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
