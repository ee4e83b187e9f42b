"""Model type ``"moglm"`` (a run exported by ``moglm export``, :mod:`moglm.export`) in transformers' Auto
classes, without making ``import moglm`` import transformers.

:func:`install` (run by ``import moglm``) registers the exported model's classes at once when transformers is
already imported, and otherwise waits for its import: a finder on ``sys.meta_path`` that steps in only for the
top-level ``transformers`` module registers them right after that module has run, then removes itself. Either
way ``AutoModelForCausalLM.from_pretrained(OUT)`` loads an export after ``import moglm``, in either order of the
two imports, and a process that never imports transformers never pays for it. A registration that fails
(a transformers version this one cannot work with) is a warning, never a failed ``import transformers``.

The classes are named by a ``"module:attribute"`` string imported on first use (as the workload registry's
hooks are): the root package installs this hook, and the layers below must not import the export above them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Any

from .registry import load

#: registers the exported model's config and causal-LM classes with transformers' Auto classes
REGISTER = "moglm.export.modeling:register_auto_classes"


def register() -> None:
    """Register the classes now (imports transformers and torch); a failure is a warning."""
    try:
        load(REGISTER)()
    except Exception as e:  # noqa: BLE001 - an import or API mismatch must not break the user's import
        warnings.warn(f"moglm: model type 'moglm' is not registered with transformers ({type(e).__name__}: {e}); "
                      "load an export with trust_remote_code=True", stacklevel=2)


class _AfterTransformers(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``transformers`` it takes the spec the other finders give and registers the
    classes once that module has run."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "transformers":
            return None
        uninstall()
        spec = next((found for finder in sys.meta_path if hasattr(finder, "find_spec")
                     and (found := finder.find_spec(name, path, target)) is not None), None)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            register()

        spec.loader.exec_module = exec_module  # this spec's own loader object, made for this import
        return spec


_finder = _AfterTransformers()


def uninstall() -> None:
    """Stop waiting for transformers' import."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def install() -> None:
    """Register now if transformers is imported, else when it is (module docstring)."""
    if "transformers" in sys.modules:
        register()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)  # before the finders that would find transformers
