"""What torch.profiler reports, read the same way by every profiling benchmark."""

from __future__ import annotations


def device_us(event) -> float:
    """A kernel's own GPU microseconds in a ``key_averages()`` row (the attribute was renamed from CUDA to
    device in torch 2.4)."""
    us = getattr(event, "self_device_time_total", None)
    return us if us is not None else getattr(event, "self_cuda_time_total", 0.0)


def split_events(prof) -> tuple[dict[str, tuple[float, int]], dict[str, tuple[float, int]]]:
    """A profile's ``key_averages()`` as ``(host, kernels)``, each ``{name: (own milliseconds, calls)}``:
    host ops by their CPU self time, kernels (and memcpys, memsets) by their GPU time. The profiler's step
    markers and autograd's engine, which only contain other ops, are left out."""
    from torch.autograd import DeviceType

    host, kernels = {}, {}
    for event in prof.key_averages():
        if event.device_type == DeviceType.CUDA:
            kernels[event.key] = (device_us(event) / 1e3, event.count)
        elif not event.key.startswith(("ProfilerStep", "autograd::engine")):
            host[event.key] = (event.self_cpu_time_total / 1e3, event.count)
    return host, kernels
