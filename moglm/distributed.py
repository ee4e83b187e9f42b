"""Data-parallel training over processes with torch.distributed (DDP): ``torchrun -m moglm train``.

A run of N processes (ranks) trains exactly what one process trains with the same global batch:

* The B stream stripes of a batch are split into N contiguous blocks of B/N rows; each rank reads its
  block of every window and carries the recurrent state of its own stripes from window to window.
* Each rank's loss is its summed cross-entropy divided by the *global* number of sequences, times N, so
  that DDP's average of the gradients is the one-process gradient; clipping then sees the global norm
  (the averaged gradients are the same on every rank), and Adam and weight averaging run identically
  on every rank.
* The per-row state resets are drawn from a generator seeded by the step, for all B global rows, and
  each rank keeps its block: the same draws as one process makes. Dropout masks come from each rank's
  own generator (rank 0 continues the one-process stream, rank r > 0 is seeded apart), so the ranks'
  masks are independent, as one process's masks are across its rows.
* Validation runs on rank 0 and its scores are broadcast, so every rank takes the same decisions
  (best checkpoint, averaging, early stopping). Only rank 0 holds the run directory's lock and writes
  metrics, plots, TensorBoard events and checkpoints; a checkpoint holds the carried state of all B
  stripes and every rank's generator state. A rerun with the same world size resumes bit for bit; with
  another one (B must divide evenly) it resumes the same global stripes and their state, and the ranks
  it did not have before draw dropout masks afresh.
* A rank that dies makes the others' next collective fail (gloo and NCCL notice a closed peer), so the
  job stops; rerunning the command resumes from the last checkpoint. Ctrl-C or SIGTERM on any rank
  is agreed on at the end of a step, and every rank stops after one checkpoint at that step.

The run directory must be one every rank can read (a shared filesystem across machines): every rank
reads the checkpoint it resumes from.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from .device import usable_cores
from .errors import MoglmError, TrainingInterrupted

T = TypeVar("T")

TIMEOUT = datetime.timedelta(hours=2)  # a collective waits this long (rank 0 validates while the others wait)


class ReportedByRankZero(MoglmError):
    """An error rank 0 reports; the other ranks stop with it silently (an empty message prints nothing)."""

    def __init__(self) -> None:
        super().__init__("")


@dataclass(frozen=True)
class Group:
    """The processes training together: this process's ``rank`` of ``world_size``. The default is one
    process, for which every collective below is the identity (no torch.distributed at all)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rows(self, batch_size: int, what: str = "train.batch_size") -> slice:
        """This rank's contiguous block of a global batch of ``batch_size`` rows."""
        if batch_size % self.world_size:
            if not self.is_main:
                raise ReportedByRankZero()
            raise MoglmError(f"{what} = {batch_size} does not split evenly over {self.world_size} processes; "
                             f"use a multiple of {self.world_size}")
        n = batch_size // self.world_size
        return slice(self.rank * n, (self.rank + 1) * n)

    # -- collectives (all ranks call them, in the same order) -------------------------------------------
    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums of ``values`` over the ranks (float64)."""
        if not self.distributed:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return t.tolist()

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank (any picklable object)."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, device=self._device())
        return box[0]

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order (on every rank)."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def concat(self, tensor: Tensor, dim: int) -> Tensor:
        """The ranks' blocks of a tensor (equal shapes) concatenated along ``dim``: the global tensor."""
        if not self.distributed:
            return tensor
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim)

    def on_main(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on rank 0 only, its result on every rank; an exception it raises is raised on rank 0
        and stops the other ranks silently."""
        if not self.distributed:
            return fn()
        result, error = None, None
        if self.is_main:
            try:
                result = fn()
            except Exception as e:  # the other ranks must not wait for a result that never comes
                error = e
        failed, result = self.broadcast((error is not None, result))
        if failed:
            raise error if self.is_main else ReportedByRankZero()
        return result

    @contextmanager
    def hold(self, run) -> Iterator[None]:
        """Rank 0 holds ``run``'s lock (a :class:`~moglm.runs.RunDirectory`) for the job; a refusal stops
        every rank."""
        with ExitStack() as stack:
            self.on_main(lambda: stack.enter_context(run.lock()) and None)
            yield

    @contextmanager
    def peers(self) -> Iterator[None]:
        """A collective that fails because another rank died (killed, out of memory) becomes one line."""
        try:
            yield
        except RuntimeError as e:
            text = " ".join(str(e).split())
            if not self.distributed or not any(k in text for k in ("gloo", "NCCL", "Connection", "peer")):
                raise
            reason = text.split("] ", 1)[-1].split(". ")[0][:200]
            raise MoglmError(f"rank {self.rank}: another process of the job stopped ({reason}); rerun the same "
                             "command to resume from the last checkpoint") from None

    def wrap(self, module: nn.Module) -> nn.Module:
        """``module`` under DistributedDataParallel (gradients averaged over the ranks), or as it is."""
        if not self.distributed:
            return module
        from torch.nn.parallel import DistributedDataParallel

        device = next(module.parameters()).device
        return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)

    def _device(self) -> torch.device:
        import torch.distributed as dist

        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")


SINGLE = Group()


def launched() -> bool:
    """Whether torchrun (or another launcher setting ``WORLD_SIZE``) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def exit_worker(code: int) -> None:
    """End a torchrun worker with ``code`` without Python's finalization, once the job's process group
    exists (elsewhere: return, and the caller exits normally).

    Why: gloo's worker threads destroy a finished collective's work object after the caller has seen it
    complete; when that object holds tensors created in Python (``broadcast_object_list`` does) and the
    main thread is already finalizing the interpreter, the decref's GIL acquire ends that thread, which
    aborts the process ("terminate called without an active exception", SIGABRT; seen in a core dump:
    ``ProcessGroupGloo::runLoop`` -> ``~AsyncBroadcastWork`` -> ``decref_pyobject`` -> ``take_gil`` ->
    ``pthread_exit`` while the main thread was in ``Py_FinalizeEx``). The exit handlers run first (they
    destroy the process group), Python's and C's standard streams are flushed, and every file moglm writes
    was already written atomically, so skipping finalization loses nothing. (An in-process ``main(argv)``
    and ``--debug``'s re-raised traceback end as before.)"""
    import torch.distributed as dist

    if not (launched() and dist.is_available() and dist.is_initialized()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:  # C stdio buffers too (libraries' own printing), which os._exit would drop
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    os._exit(code)


def is_main_process() -> bool:
    """Whether this process is rank 0 of its job (or not part of one)."""
    return int(os.environ.get("RANK", "0")) == 0


def process_group(device: torch.device) -> Group:
    """The :class:`Group` this process belongs to: one process, or (under torchrun) the job's ranks,
    joining torch.distributed's default group on first use (NCCL for CUDA, gloo otherwise)."""
    if not launched():
        return SINGLE
    import torch.distributed as dist

    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group(backend, timeout=TIMEOUT)
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    return Group(rank, world, local)


def rank_device(device: torch.device, group: Group) -> torch.device:
    """Each rank's own GPU (``cuda:LOCAL_RANK``) when training on CUDA, else ``device``."""
    return torch.device("cuda", group.local_rank) if group.distributed and device.type == "cuda" else device


def seed_rank(seed: int, group: Group) -> None:
    """Give ranks r > 0 their own random stream (dropout masks independent of rank 0's)."""
    if group.rank > 0:
        torch.manual_seed(step_seed(seed, -group.rank))


def step_seed(seed: int, step: int) -> int:
    """A seed for ``step`` of a run seeded with ``seed`` (the same on every rank)."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9) % 2**63


class Nll(nn.Module):
    """``model.nll`` as a forward, so that DistributedDataParallel sees the call and averages its gradients."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor, targets: Tensor, state: Any):
        return self.model.nll(inputs, targets, state)


def launch(nproc_per_node: int, module_args: list[str]) -> None:
    """Run ``python -m moglm *module_args`` as ``nproc_per_node`` processes on this machine, through
    torch.distributed.run (torchrun); a failed rank is one line."""
    import logging
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(["--standalone", f"--nproc-per-node={nproc_per_node}", "--module",
                                         "moglm", *module_args])
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun would set 1 and warn about it
        os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cores() // nproc_per_node))
    for name in list(logging.root.manager.loggerDict):  # the ranks say what went wrong
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        run(args)
    except SignalException:  # Ctrl-C or SIGTERM: the ranks saved a checkpoint and said so
        raise TrainingInterrupted("") from None
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode in (130, -signal.SIGINT, -signal.SIGTERM):
            raise TrainingInterrupted("interrupted; rerun the same command to resume") from None
        if failure.exitcode < 0:
            name = signal.Signals(-failure.exitcode).name if -failure.exitcode in signal.valid_signals() else ""
            raise MoglmError(f"rank {rank} of {nproc_per_node} was killed (signal {-failure.exitcode} {name}); "
                             "rerun the same command to resume from the last checkpoint") from None
        raise ReportedByRankZero() from None  # the rank printed its error
