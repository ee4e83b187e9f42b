"""Run directories: the files a run writes and later commands read, and their checkpoints."""

from .checkpoints import CheckpointStore, load_group
from .directory import RunDirectory

__all__ = ["CheckpointStore", "RunDirectory", "load_group"]
