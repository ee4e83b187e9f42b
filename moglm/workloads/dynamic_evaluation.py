"""Dynamic evaluation as a tuning target (:mod:`moglm.registry`): a trial adapts a trained run while it
scores a validation prefix with the sampled settings (Krause thesis 4.5); it trains nothing."""

from __future__ import annotations

from pathlib import Path

from ..errors import MoglmError


def tuning_prepare(space, space_name: str, base: str | None, overrides: list[str], max_tokens: int | None,
                   directory: Path):
    from ..tune.dynamic_evaluation import prepare_dyneval

    if overrides:
        raise MoglmError("--set changes run configs; a dynamic-evaluation space takes its settings in [fixed]")
    return prepare_dyneval(space, space_name, base, max_tokens, directory)


def tuning_key_problem(key: str) -> str | None:
    """Dynamic-evaluation keys are ``dyneval.<setting>`` (which settings exist is checked by the setup)."""
    parts = key.split(".")
    ok = parts[0] == "dyneval" and len(parts) > 1 and all(parts)
    return None if ok else "dynamic-evaluation keys start with 'dyneval.'"


def tuning_best(result, best, storage: str) -> tuple[str, str, str]:
    from ..tune.dynamic_evaluation import best_settings_text

    return "best settings", "best_dyneval.toml", best_settings_text(result.study, best, result.setup, storage)
