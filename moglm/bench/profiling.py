"""What torch.profiler reports, read the same way by every profiling benchmark."""

from __future__ import annotations


def device_us(event) -> float:
    """A kernel's own GPU microseconds in a ``key_averages()`` row (the attribute was renamed from CUDA to
    device in torch 2.4)."""
    us = getattr(event, "self_device_time_total", None)
    return us if us is not None else getattr(event, "self_cuda_time_total", 0.0)
