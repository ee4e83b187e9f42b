"""``moglm info``: what runs here (versions, threads, the CPU, the compiled recurrence and its routes)."""

from __future__ import annotations

import typer


def info(
    as_json: bool = typer.Option(False, "--json", help="Print the details as one JSON object."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List every probed shape class's timings."),
) -> None:
    """What runs here: versions, threads, the CPU, the compiled recurrence (built at first use) and its GEMM route."""
    typer.echo(describe(as_json, verbose))


def describe(as_json: bool, verbose: bool = False) -> str:
    """``moglm info``: ``key: value`` lines (``verbose``: every probed shape class's timings too), or with
    ``as_json`` ``compiled.info()`` plus the versions as JSON."""
    import json
    import platform
    import warnings

    import torch

    from .. import __version__
    from ..recurrence import compiled

    with warnings.catch_warnings():  # the reason it is unavailable is printed below, not warned
        warnings.simplefilter("ignore", compiled.CompiledUnavailableWarning)
        details = {"moglm": __version__, "torch": torch.__version__, "python": platform.python_version(),
                   **compiled.info()}
    if as_json:
        return json.dumps(details, indent=2)
    if details["compiled"]:
        recurrence = "compiled (C++, CPU float32/float64)"
    else:
        recurrence = f"Python fused (the compiled recurrence is unavailable: {details['reason']})"
    lines = {key: details[key] for key in ("moglm", "torch", "python", "threads", "cpu")}
    lines["recurrence"] = recurrence
    if details["compiled"]:
        probe = details["gemm_route_probe_seconds"]
        lines["gemm_route"] = details["gemm_route"] + ("" if probe else " (not probed: forced or the only route)")
        if probe:
            lines["gemm_route_probe"] = ", ".join(f"{route} {seconds * 1e3:.2f} ms" for route, seconds in probe.items())
        probe = details["weight_gradient_route_probe_seconds"]
        lines["weight_gradient_route"] = details["weight_gradient_route"] + ("" if probe else " (not probed)")
        if probe:
            lines["weight_gradient_route_probe"] = ", ".join(f"{route} {seconds * 1e3:.2f} ms"
                                                              for route, seconds in probe.items())
        lines["mkl_thread_control"] = "yes" if details["mkl_thread_control"] else "no"
        cache = details["workspace_cache"]
        lines["workspace_cache"] = (
            f"{cache['cached_bytes'] / 2**20:.0f} MiB in {cache['cached_blocks']} blocks held, limit "
            f"{cache['limit_bytes'] / 2**20:.0f} MiB, {cache['hits']} hits, {cache['misses']} misses"
            if cache["limit_bytes"] else "off (MOGLM_WORKSPACE_CACHE_MB=0)")
        lines["flush_denormals"] = ("yes (subnormals are zero in the windows)" if details["flush_denormals"]
                                    else "no")
        lines["blocked_products"] = ("yes (per-step products over 768 KiB of rows summed in chunks)"
                                     if details["blocked_products"] else "no")
        choices = details["auto_backend"]
        lines["auto_backend"] = (f"{len(choices)} shape classes probed on this machine"
                                 + ("" if verbose else " (--verbose lists them)") if choices
                                 else "no shape class probed yet (each is, on first use)")
        for key, choice in sorted(choices.items()) if verbose else ():
            times = ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in choice["seconds"].items())
            noise = "" if choice.get("separated") else ", within noise"
            route = f", compiled on route {choice['route']}" if choice.get("route") else ""
            lines[f"  {key}"] = f"{choice['backend']} ({times}{noise}{route})"
    lines["build_dir"] = details["build_dir"] or "-"
    return "\n".join(f"{key}: {value}" for key, value in lines.items())
