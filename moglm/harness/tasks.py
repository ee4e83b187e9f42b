"""Local lm-eval tasks: a YAML task over a JSON-lines file beside it, read with no network (lm-eval's ``json``
dataset type), for ``--include_path DIR --tasks NAME`` or ``--tasks DIR/NAME.yaml``.

:func:`write_wikitext_task` makes lm-eval's ``wikitext`` task (Merity et al. 2016) from a local copy of
WikiText-2's test split: one document per article (cut at the ``= Title =`` headings, as lm-eval's
document-level copy of WikiText is), scored with ``loglikelihood_rolling`` and reported as word perplexity,
byte perplexity and bits per byte, words and bytes counted on each article as lm-eval's ``wikitext`` counts
them. ``detokenize=False`` scores the tokenized text itself (the text a word-level run trained on);
``detokenize=True`` first undoes its tokenization with lm-eval's own ``wikitext_detokenizer``, exactly as
lm-eval's ``wikitext`` task does (``@-@``, spaces before punctuation).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text
from ..errors import MoglmError

#: an article's first line in the tokenized WikiText files: `` = Title = `` (sections are `` = = Title = = ``)
ARTICLE = re.compile(r"^ = [^=].* = $")
WIKITEXT_RESULTS = "lm_eval.tasks.wikitext.preprocess_wikitext"
PERPLEXITY_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")


class Function(str):
    """A ``!function module.name`` value in a task's YAML (lm-eval imports it when the task loads)."""


def write_task(directory: str | Path, name: str, documents: list[dict[str, Any]], cache_dir: str | Path | None = None,
               **config: Any) -> Path:
    """Write task ``name`` to ``directory``: ``name.jsonl`` (one JSON object per document) and ``name.yaml``
    (the task over it, test split, with ``config``'s keys: ``output_type``, ``doc_to_text`` ...). Returns the
    YAML's path. ``cache_dir``: where ``datasets`` keeps its copy (default: its own cache)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(Function, lambda dumper, value: dumper.represent_scalar("!function", str(value)))
    if not documents:
        raise MoglmError(f"task {name}: no documents")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{name}.jsonl"
    atomic_write_text(data, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents))
    dataset: dict[str, Any] = {"data_files": {"test": str(data.resolve())}}
    if cache_dir is not None:
        dataset["cache_dir"] = str(cache_dir)
    task = {"task": name, "dataset_path": "json", "dataset_kwargs": dataset, "test_split": "test", **config,
            "metadata": {"version": 1.0}}
    path = directory / f"{name}.yaml"
    atomic_write_text(path, yaml.dump(task, Dumper=Dumper, sort_keys=False, allow_unicode=True))
    return path


def write_perplexity_task(directory: str | Path, name: str, texts: list[str],
                          cache_dir: str | Path | None = None) -> Path:
    """A ``loglikelihood_rolling`` task over ``texts`` (field ``page``), scored as they are: word perplexity,
    byte perplexity and bits per byte, as lm-eval's perplexity tasks report them."""
    return write_task(directory, name, [{"page": t} for t in texts], cache_dir, output_type="loglikelihood_rolling",
                      doc_to_text="", doc_to_target="{{page}}",
                      metric_list=[{"metric": m} for m in PERPLEXITY_METRICS])


def wikitext_articles(text: str) -> list[str]:
    """The articles of a tokenized WikiText file, each from its `` = Title = `` line to the next (the lines
    before the first heading, a blank line in the released files, belong to no article)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if ARTICLE.match(line.rstrip("\n"))]
    if not starts:
        raise MoglmError("no WikiText article heading (a line ' = Title = ') in the text")
    return ["".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]


def write_wikitext_task(test_file: str | Path, directory: str | Path, name: str = "wikitext2_local",
                        detokenize: bool = False, cache_dir: str | Path | None = None) -> tuple[Path, int]:
    """lm-eval's ``wikitext`` task over the articles of a local tokenized WikiText file (module docstring);
    returns the YAML's path and the number of articles."""
    path = Path(test_file)
    if not path.is_file():
        raise MoglmError(f"{path}: no such file (a tokenized WikiText split, e.g. wikitext-2/test.txt)")
    articles = wikitext_articles(path.read_text(encoding="utf-8"))
    target: Any = Function(f"{WIKITEXT_RESULTS}.wikitext_detokenizer") if detokenize else "{{page}}"
    yaml_path = write_task(directory, name, [{"page": a} for a in articles], cache_dir,
                           output_type="loglikelihood_rolling", doc_to_text="", doc_to_target=target,
                           process_results=Function(f"{WIKITEXT_RESULTS}.process_results"),
                           metric_list=[{"metric": m} for m in PERPLEXITY_METRICS])
    return yaml_path, len(articles)
