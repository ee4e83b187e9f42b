"""What every ``moglm`` command shares: the Typer app factory, the option value sets, renamed options.

* Help is plain text (``rich_markup_mode=None``): Rich would read ``[default: ...]`` and other square
  brackets in a help string as markup and drop them.
* An option with a fixed set of values is typed with one of the ``Literal`` aliases below (``Split`` is an
  :class:`enum.Enum`, because Typer takes no list of ``Literal``): ``--help`` shows the values
  (``<best|last>``) and a wrong value is refused before the command runs. The sets are written out here,
  so that building the command line imports neither torch nor the modules that define them; the tests
  check that they match those modules.
* One vocabulary: options are named after the config fields they set (``--learning-rate``,
  ``--hidden-size``, ``--batch-size``). The spellings of earlier releases are kept for one release as
  hidden options that still work and print a deprecation warning (:func:`renamed`).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import typer

UpdateRule = Literal["sgd", "sgd-decay", "rms", "rms-decay", "rms-rmsdecay", "sgd-momentum",
                     "rmsprop"]  # dynamic_evaluation.update_rules.RULES
Sampler = Literal["gp", "tpe", "random"]  # tune.search_space.StudySettings.sampler
Checkpoint = Literal["best", "last"]
TokenizerKind = Literal["bpe", "unigram"]  # data.tokenizer.KINDS
Detokenizer = Literal["wikitext", "wikitext-wrapped"]  # data.detokenize.DETOKENIZERS
DyckObjective = Literal["closing", "lm"]  # tasks.dyck_training.OBJECTIVES
DyckPositions = Literal["closing", "open_stack"]  # tasks.wcpa.POSITIONS
Architecture = Literal["lstm", "mogrifier", "multiplicative_lstm", "mi_lstm", "rnn", "multiplicative_rnn", "mmrnn", "mmlstm",
                       "dyck_rnn", "gru", "mogrifier_gru", "mogrifier_rnn"]  # modules.ARCHITECTURES
ThroughputModel = enum.Enum("ThroughputModel", {name: name for name in (  # bench.throughput.MODELS and GRAPHED
    "torch.nn.LSTM", "moglm LSTM", "moglm LSTM + state dropout", "moglm Mogrifier r=5 k=64",
    "moglm multiplicative LSTM", "LSTM, Python fused", "Mogrifier, Python fused",
    "multiplicative LSTM, Python fused", "Mogrifier, reference loop", "LSTM, CUDA graphs", "Mogrifier, CUDA graphs",
    "multiplicative LSTM, CUDA graphs", "Mogrifier, CUDA graphs, step kernels")}, type=str)


class Split(str, enum.Enum):
    """A corpus split (an Enum: ``--split`` can be repeated)."""

    train = "train"
    valid = "valid"
    test = "test"


DEVICE_HELP = "cpu, cuda, cuda:1, mps, ..."


def new_app(help: str, **options: Any) -> typer.Typer:
    """A Typer app (or sub-app) with plain-text help that prints its help when called without arguments."""
    return typer.Typer(help=help, rich_markup_mode=None, no_args_is_help=True, **options)


def values(items: list[Any]) -> list[Any]:
    """The plain values of a repeated Enum option."""
    return [getattr(item, "value", item) for item in items]


def renamed(value: Any, old_value: Any, old: str, new: str) -> Any:
    """``value`` of option ``new``, or the value given under its deprecated spelling ``old`` (a hidden option
    that defaults to ``None`` or ``[]``), with a warning on stderr."""
    if old_value is None or (isinstance(old_value, list) and not old_value):
        return value
    typer.echo(f"warning: {old} is deprecated and will be removed in the next release; use {new}", err=True)
    return old_value


#: the options ``moglm train`` and ``moglm music train`` share, each setting one config key (after ``--set``)
HYPERPARAMETERS = {"learning_rate": "train.learning_rate", "max_steps": "train.max_steps",
                   "batch_size": "train.batch_size", "hidden_size": "model.hidden_size", "threads": "train.threads",
                   "seed": "train.seed"}


def hyperparameter_overrides(budget: bool = True, **values: Any) -> list[str]:
    """``--set`` assignments for the hyperparameter options given (``None``: not given). With ``budget`` (a
    language model's config), a hidden size replaces a parameter budget (``model.num_params``)."""
    out = [f"{HYPERPARAMETERS[name]}={value!r}" for name, value in values.items() if value is not None]
    if budget and values.get("hidden_size") is not None:
        out.append("model.num_params=")
    return out


def deprecated(old: str, **options: Any) -> Any:
    """A hidden option for the deprecated spelling ``old`` of a renamed option (see :func:`renamed`)."""
    return typer.Option(options.pop("default", None), old, hidden=True, **options)


def _item_type(option: Any) -> Any:
    """The item type of a repeatable option of numbers or fixed values (``list[int]``, ``list[Split]``,
    ``list[Literal[...]]``): the options that also take ``256 650`` and ``256,650``; else ``None``."""
    import typing

    descriptor = getattr(option, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    if not getattr(option, "multiple", False) or typing.get_origin(annotation) is not list:
        return None
    (item,) = typing.get_args(annotation)
    fixed = typing.get_origin(item) is typing.Literal or (isinstance(item, type) and issubclass(item, enum.Enum))
    return item if item in (int, float) or fixed else None


def _accepts(item: Any, token: str) -> bool:
    import typing

    if typing.get_origin(item) is typing.Literal:
        return token in typing.get_args(item)
    if isinstance(item, type) and issubclass(item, enum.Enum):
        return token in {m.value for m in item}
    try:
        item(token)
        return True
    except ValueError:
        return False


def expand_list_options(command: Any, argv: list[str]) -> list[str]:
    """``argv`` with every list option's values spelled as repeated flags, so that ``--hidden-size 256 650``
    and ``--hidden-size 256,650`` mean ``--hidden-size 256 --hidden-size 650``. Applies to repeatable options of
    numbers or fixed values (:func:`_item_type`); the values end at the first token the option does not
    take (an option, or an argument such as a run directory), and anything else passes through untouched."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        subcommands = getattr(command, "commands", {})
        if token in subcommands:
            command = subcommands[token]
        flag, _, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        option = next((p for p in getattr(command, "params", ()) if flag in getattr(p, "opts", ())), None)
        item = None if option is None else _item_type(option)
        if item is None:
            out.append(token)
            i += 1
            continue
        given = [inline] if inline else argv[i + 1:i + 2]
        i += 1 + (0 if inline else len(given))
        while i < len(argv) and not argv[i].startswith("-") and _accepts(item, argv[i].split(",")[0]):
            given.append(argv[i])
            i += 1
        for value in given:
            for part in [value] if _accepts(item, value) else value.split(","):  # a value may hold a comma
                out += [flag, part]
    return out
