"""``moglm export RUN OUT``: a run directory as a directory transformers loads, and optionally a Hub repository.

``OUT`` receives ``config.json`` and ``generation_config.json`` (:class:`~.configuration.MoglmConfig`),
``model.safetensors``, ``tokenizer.json`` and ``tokenizer_config.json`` (:mod:`.tokenizer`), ``README.md`` (the
model card, :mod:`.card`), ``moglm_config.toml`` (the run's config) and ``configuration_moglm.py`` /
``modeling_moglm.py``, two one-line files that import moglm's classes for ``trust_remote_code=True``.

An existing ``OUT`` is refused without ``force``; with it, the files above are replaced and nothing else in
``OUT`` is touched (a clone of a Hub repository keeps its ``.git``). The files are written to a temporary
folder first, so a failed export leaves ``OUT`` as it was (a new ``OUT`` appears whole or not at all).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ..atomic import atomic_directory
from ..errors import MoglmError
from ..runs.language_model import LanguageModelRun
from .card import model_card, read_report

#: the remote-code files: each imports one class from the installed moglm (``auto_map`` in config.json names them)
REMOTE_CODE = {
    "configuration_moglm.py": "from moglm.export.configuration import MoglmConfig",
    "modeling_moglm.py": "from moglm.export.modeling import MoglmForCausalLM",
}
AUTO_MAP = {"AutoConfig": "configuration_moglm.MoglmConfig", "AutoModelForCausalLM": "modeling_moglm.MoglmForCausalLM"}
#: every file an export writes (transformers 4 adds special_tokens_map.json); --force replaces these and nothing else
EXPORT_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                          "tokenizer_config.json", "special_tokens_map.json", "README.md", "moglm_config.toml",
                          *REMOTE_CODE})


def check_destination(out: Path, force: bool) -> None:
    """Refuse an ``OUT`` that exists (without ``force``) or is not a folder, before any work."""
    if out.exists() and not out.is_dir():
        raise MoglmError(f"{out} is a file: give a folder to export to")
    if out.exists() and not force:
        raise MoglmError(f"{out} exists: give --force to replace the exported files in it, or another folder")


def load_exportable(run_dir: Path) -> LanguageModelRun:
    """The run, or a one-line error for what cannot be exported: no run, a music run, a synthetic task's run, no
    vocabulary."""
    run = LanguageModelRun(run_dir)
    saved = run.read_config()
    if saved.get("kind") == "music":
        raise MoglmError(f"{run_dir} is a music run: an RNN-NADE models piano-roll frames, not tokens, so it is not "
                         "a causal LM that transformers can load; nothing was exported")
    if not isinstance(saved.get("model"), dict):  # a synthetic task's run (reverse copy, Dyck-k)
        inner = run.path / "lm" / "config.toml"
        hint = f"; its language model is the run {run.path / 'lm'}" if inner.is_file() else ""
        raise MoglmError(f"{run_dir} is not a language-model run (its config.toml has no [model] section){hint}: "
                         "moglm export reads the runs moglm train makes")
    run.load_config()
    if not run.vocab_path.is_file():
        raise MoglmError(f"{run_dir}: no vocabulary (vocab.json), so there is no tokenizer to export; train the run "
                         "first (`moglm train`)")
    return run


def export_run(run_dir: str | Path, out: str | Path, force: bool = False, checkpoint: str = "best",
               push_to_hub: str | None = None, private: bool = False,
               log: Callable[[str], None] = lambda message: None) -> Path:
    """Export the run ``run_dir`` to ``out`` (module docstring); with ``push_to_hub``, also upload ``out`` to
    that Hub repository (created if missing). Returns ``out``."""
    run_dir, out = Path(run_dir), Path(out)
    if out.resolve() == run_dir.resolve():
        raise MoglmError(f"{out} is the run directory itself: export to a folder of its own")
    check_destination(out, force)
    run = load_exportable(run_dir)
    model, tokenizer = build_export(run, checkpoint)
    if out.exists():
        with tempfile.TemporaryDirectory(dir=out, prefix=".tmp-export-") as tmp:
            _write(Path(tmp), run, model, tokenizer, push_to_hub)
            new = {path.name for path in Path(tmp).iterdir()}
            for name in sorted(new):
                os.replace(Path(tmp) / name, out / name)
            for name in EXPORT_FILES - new:  # an earlier export's file that this one does not write
                (out / name).unlink(missing_ok=True)
    else:
        with atomic_directory(out) as tmp:
            _write(tmp, run, model, tokenizer, push_to_hub)
            if out.exists():  # another process made it meanwhile: leave it alone
                raise MoglmError(f"{out} appeared while exporting: nothing was written; export again")
    log(f"exported {run_dir} to {out}: {', '.join(sorted(p.name for p in out.iterdir() if p.name in EXPORT_FILES))}")
    if push_to_hub:
        upload(out, push_to_hub, private, log)
    return out


def _write(folder: Path, run: LanguageModelRun, model, tokenizer, repo: str | None) -> None:
    """Every file of the export (:data:`EXPORT_FILES`) into ``folder``."""
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # a bar for writing one small file
    try:
        model.save_pretrained(folder)
    finally:
        if shown:
            logging.enable_progress_bar()
    tokenizer.save_pretrained(folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"  # the name every transformers knows (5's TokenizersBackend)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    for name, line in REMOTE_CODE.items():
        (folder / name).write_text(f'"""moglm\'s class for trust_remote_code=True (needs `pip install moglm`)."""'
                                   f"\n\n{line}  # noqa: F401\n", encoding="utf-8")
    shutil.copyfile(run.config_path, folder / "moglm_config.toml")
    config, vocab = run.load_config(), run.load_vocab()
    card = model_card(config.name or run.path.name, config, run.model_info(), len(vocab), vocab.level, vocab.unk,
                      read_report(run.results_path), read_report(run.path / "dyneval" / "full.json"), repo)
    (folder / "README.md").write_text(card, encoding="utf-8")
    unexpected = sorted(p.name for p in folder.iterdir() if p.name not in EXPORT_FILES)
    if unexpected:  # this transformers writes files this module does not know: --force could not replace them
        raise MoglmError(f"this transformers wrote files moglm export does not know ({', '.join(unexpected)})")


def build_export(run: LanguageModelRun, checkpoint: str = "best"):
    """The transformers model (with the run's ``checkpoint`` weights) and tokenizer of ``run``."""
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise MoglmError("moglm export needs transformers and tokenizers: pip install 'moglm[hf]'") from None
    from .. import __version__
    from .configuration import MoglmConfig
    from .modeling import MoglmForCausalLM
    from .tokenizer import run_tokenizer

    config, vocab, info = run.load_config(), run.load_vocab(), run.model_info()
    tokenizer = run_tokenizer(vocab)
    hf_config = MoglmConfig(
        vocab_size=len(vocab), hidden_size=info["hidden_size"], num_hidden_layers=config.model.num_layers,
        moglm_model=config.model.model_dump(mode="json", exclude_none=True), logit_factor=run.logit_factor(),
        vocabulary_level=vocab.level, moglm_version=__version__, bos_token_id=tokenizer.bos_token_id,
        architectures=["MoglmForCausalLM"], auto_map=AUTO_MAP)
    try:
        model = MoglmForCausalLM(hf_config)
    except ValueError as e:  # a transformers that cannot load this model back
        raise MoglmError(f"{run.path}: {e}") from None
    run.load_weights(model.model, checkpoint)
    model.generation_config.eos_token_id = None  # a line end is not the end of a text: generate() runs on, as sample
    return model.eval(), tokenizer


def upload(out: Path, repo: str, private: bool, log: Callable[[str], None]) -> None:
    """Upload the export ``out`` to the Hub repository ``repo`` with ``huggingface_hub`` (the user's saved token)."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise MoglmError("--push-to-hub needs huggingface_hub: pip install 'moglm[hf]'") from None
    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo, folder_path=str(out), allow_patterns=sorted(EXPORT_FILES),
                                   commit_message="moglm export")
    except Exception as e:  # noqa: BLE001 - network, authentication and naming errors all become one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MoglmError(f"--push-to-hub {repo}: {first}") from None
    log(f"pushed to https://huggingface.co/{repo} ({getattr(commit, 'commit_url', None) or 'uploaded'})")
