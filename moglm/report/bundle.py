"""A report that can be committed: every file it links to is copied beside it, so its links resolve inside
the report's own folder (``runs/<run>/...``) and nothing it cites lives in an ignored or machine-local path.

Only small text results are copied: a linked JSON or TOML file, and, for a linked run directory, its config,
model sizes, metrics and results. Checkpoints, token losses and caches are never copied. Each copied result
carries its provenance (:mod:`moglm.provenance`), so the bundle says which machine, command and commit made
every number."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ..atomic import atomic_write_text
from ..errors import MoglmError

#: what a run directory contributes when a report links the directory itself
RUN_FILES = ("config.toml", "model.json", "metrics.jsonl", "results.json")
#: the kinds of file a bundle copies when a report links them
COPIED_SUFFIXES = (".json", ".toml", ".jsonl", ".png")
LINK = re.compile(r"\]\(([^)\s\"]+)")


def bundle_report(report: Path, run_dirs: list[Path]) -> list[Path]:
    """Copy every file ``report`` links to inside ``run_dirs`` to ``<report folder>/runs/<run>/...`` and rewrite
    its links there. Returns the files copied. A link to anything else outside the report's folder is an error."""
    out = report.parent.resolve()
    runs = {Path(d).resolve(): out / "runs" / Path(d).name for d in run_dirs}
    text = report.read_text()
    copied: list[Path] = []

    def home(target: Path) -> tuple[Path, Path] | None:
        for run, copy in runs.items():
            if target == run or run in target.parents:
                return run, copy
        return None

    def rewrite(match: re.Match) -> str:
        link = match.group(1)
        if "://" in link or link.startswith("#"):
            return match.group(0)
        target = (out / link).resolve()
        if target == out or out in target.parents:
            if out / "runs" in target.parents and not target.exists():
                raise MoglmError(f"{report}: links to {link}, which is not in the bundle")
            return match.group(0)
        found = home(target)
        if found is None:
            raise MoglmError(f"{report}: links to {link}, outside the report's folder and its runs")
        run, copy = found
        destination = copy / target.relative_to(run)
        if target.is_dir():
            destination.mkdir(parents=True, exist_ok=True)
            for name in RUN_FILES if target == run else ():
                if (target / name).is_file():
                    shutil.copyfile(target / name, copy / name)
                    copied.append(copy / name)
        elif target.suffix in COPIED_SUFFIXES and target.is_file():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(target, destination)
            copied.append(destination)
        else:
            raise MoglmError(f"{report}: links to {link}, which a bundle does not copy")
        return "](" + os.path.relpath(destination, out).replace(os.sep, "/")

    atomic_write_text(report, LINK.sub(rewrite, text))
    return copied
