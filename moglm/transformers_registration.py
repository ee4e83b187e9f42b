"""Model type ``"moglm"`` (a run exported by ``moglm export``, :mod:`moglm.export`) in transformers' Auto
classes, without making ``import moglm`` import transformers, nor ``import transformers`` load any model code.

Each Auto class lives in a module of transformers (:data:`WATCHED`). :func:`install` (run by ``import moglm``)
registers moglm's class with each one that is already imported, and waits for the others: a finder on
``sys.meta_path`` that steps in only for those module names registers the class right after the module has run.
So ``AutoConfig.from_pretrained(OUT)`` and ``AutoModelForCausalLM.from_pretrained(OUT)`` load an export after
``import moglm`` in either order of the imports; a process that never imports transformers never pays for it,
and one that uses only its tokenizers never imports the model's code (``AutoModelForCausalLM`` holds a stand-in
until a model is loaded, :class:`~moglm.export.auto.DeferredMoglmForCausalLM`). A registration that fails (a
transformers version this one cannot work with) is a warning, never a failed import.

The classes are named by ``"module:attribute"`` strings imported on first use (as the workload registry's hooks
are): the root package installs this hook, and the layers below must not import the export above them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Any

from .registry import load

#: a module of transformers -> what registers moglm's class with the Auto class that module defines
WATCHED = {
    "transformers.models.auto.configuration_auto": "moglm.export.auto:register_config",
    "transformers.models.auto.modeling_auto": "moglm.export.auto:register_model",
}


def register(module: str) -> None:
    """Register moglm's class with the Auto class of ``module`` (one of :data:`WATCHED`); a failure is a
    warning."""
    try:
        load(WATCHED[module])()
    except Exception as e:  # noqa: BLE001 - an import or API mismatch must not break the user's import
        warnings.warn(f"moglm: model type 'moglm' is not registered with transformers ({type(e).__name__}: {e}); "
                      "load an export with trust_remote_code=True", stacklevel=2)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module it waits for, it takes the spec the other finders give and registers
    moglm's class once that module has run."""

    def __init__(self) -> None:
        self.waiting: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in self.waiting:
            return None
        self.waiting.discard(name)
        if not self.waiting:
            uninstall()
        spec = next((found for finder in sys.meta_path if finder is not self and hasattr(finder, "find_spec")
                     and (found := finder.find_spec(name, path, target)) is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            register(name)

        spec.loader.exec_module = exec_module  # this spec's own loader object, made for this import
        return spec


_finder = _AfterImport()


def uninstall() -> None:
    """Stop waiting for transformers' modules."""
    _finder.waiting.clear()
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    """Register with the Auto classes already imported, and wait for the others (module docstring)."""
    for module in WATCHED:
        if module in sys.modules:
            register(module)
        else:
            _finder.waiting.add(module)
    if _finder.waiting and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)  # before the finders that would find the modules
