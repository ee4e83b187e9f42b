"""``moglm task ...``: the synthetic tasks from the command line (a typer sub-app that moglm.cli mounts).

Each command writes a run directory (``runs/<task name>`` unless ``--run-dir`` says otherwise) with its
config, ``metrics.jsonl``, ``checkpoints/`` and ``results.json``; rerunning the same command resumes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import Architecture, DyckObjective, DyckPositions, deprecated, new_app, renamed
from ..errors import MoglmError


def _fresh(path: Path, restart: bool) -> Path:
    from ..runs import RunDirectory

    if restart:
        RunDirectory(path).discard()  # a run's own files only, under its lock
    return path


app = new_app("Synthetic tasks: bounded Dyck-k (WCPA), reverse copy, partial-sentence training.")

@app.command()
def dyck(
    k: int = typer.Option(2, "--k", help="Bracket types."),
    m: int = typer.Option(4, "--m", help="Maximum depth (unclosed brackets)."),
    architecture: Architecture = typer.Option("dyck_rnn", help="Any moglm architecture (model.architecture)."),
    objective: Optional[DyckObjective] = typer.Option(
        None, help="closing: predict the closing brackets; lm: a language model (default: closing for dyck_rnn, "
        "else lm)."),
    learned_embedding: bool = typer.Option(False, help="Dyck-RNN: the report's learned 2-d embedding, H = 2m."),
    zero_gate: bool = typer.Option(True, help="Dyck-RNN: start the push/pop gate weight at 0 (else random)."),
    hidden_size: Optional[int] = typer.Option(None, help="Hidden units (default: m (2m) for the Dyck-RNN, else 16)."),
    num_params: Optional[int] = typer.Option(None, help="Parameter budget instead of a hidden size."),
    steps: int = typer.Option(1000, help="Training steps."),
    batch_size: int = typer.Option(128, help="Sequences per step."),
    learning_rate: float = typer.Option(0.03, help="Adam learning rate (beta1 = 0)."),
    lr: Optional[float] = deprecated("--lr"),
    seed: int = typer.Option(1, help="Seed of the corpus and of training."),
    train_sequences: int = typer.Option(2000, help="Training sequences."),
    valid_sequences: int = typer.Option(200, help="Validation sequences."),
    test_sequences: int = typer.Option(500, help="Test sequences."),
    train_lengths: tuple[int, int] = typer.Option((20, 100), help="Brackets per training/validation sequence."),
    test_lengths: tuple[int, int] = typer.Option((102, 200), help="Brackets per test sequence."),
    positions: DyckPositions = typer.Option(
        "closing", help="WCPA positions: closing (before each closing bracket) or open_stack (before each "
        "token read with a bracket open)."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Objective lm: override a run-config key (a.b=value)."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (default: runs/dyck-k<k>-m<m>-<arch>)."),
    restart: bool = typer.Option(False, help="Discard an existing run in the run directory."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Bounded Dyck-(k, m): generate the corpus, train a model, report WCPA."""
    from ..tasks.dyck import DyckTask
    from ..tasks.dyck_training import DyckTraining, run_dyck

    task = DyckTask(num_types=k, max_depth=m, train_sequences=train_sequences, valid_sequences=valid_sequences,
                    test_sequences=test_sequences, train_lengths=train_lengths, test_lengths=test_lengths,
                    seed=seed, positions=positions)
    training = DyckTraining(architecture, objective, learned_embedding, zero_gate, hidden_size, num_params,
                            batch_size, steps, renamed(learning_rate, lr, "--lr", "--learning-rate"),
                            seed=seed)
    name = f"dyck-k{k}-m{m}-{architecture}{'-learned' if learned_embedding else ''}"
    path = _fresh(run_dir or Path("runs") / name, restart)
    results = run_dyck(task, training, path, set_, progress, typer.echo)
    typer.echo(f"test WCPA {100 * (results['wcpa']['test']['wcpa'] or 0):.1f}%\nrun directory: {path}")

@app.command("reverse-copy")
def reverse_copy(
    length: int = typer.Option(20, help="Tokens to copy (the decoder writes them reversed)."),
    min_length: Optional[int] = typer.Option(None, help="With --max-length: lengths drawn from this range "
                                             "(one per batch; replaces --length; the paper: 50-200)."),
    max_length: Optional[int] = typer.Option(None, help="The longest sequence, with --min-length."),
    train_examples: Optional[int] = typer.Option(None, help="A fixed training set of this many examples (the "
                                                 "paper: 500000; default: a fresh batch every step)."),
    vocab_size: int = typer.Option(100, help="Vocabulary the tokens are drawn from (uniformly; the paper: 1000)."),
    architecture: Architecture = typer.Option("mogrifier", help="Encoder and decoder architecture "
                                              "(model.architecture)."),
    num_params: Optional[int] = typer.Option(200_000, help="Parameter budget (both halves together)."),
    hidden_size: Optional[int] = typer.Option(None, help="Hidden units instead of a budget."),
    embedding_ratio: float = typer.Option(1.0, help="Embedding size = ratio * hidden size."),
    cell: list[str] = typer.Option([], help="Architecture option key=value, e.g. --cell rounds=5 --cell rank=16."),
    num_layers: int = typer.Option(1, help="Layers of the encoder and of the decoder."),
    steps: int = typer.Option(2000, help="Training steps."),
    batch_size: int = typer.Option(64, help="Sequences per step."),
    learning_rate: float = typer.Option(0.003, help="Adam learning rate (beta1 = 0)."),
    lr: Optional[float] = deprecated("--lr"),
    l2_penalty: float = typer.Option(0.0, help="l2_penalty * 0.5 * sum(w^2) added to the loss."),
    clip_norm: float = typer.Option(10.0, help="Clip the gradient's global norm to this."),
    eval_every: int = typer.Option(200, help="Validate and checkpoint every this many steps."),
    test_examples: int = typer.Option(1000, help="Test sequences (and validation ones unless --valid-examples; "
                                      "the paper: 10000)."),
    valid_examples: Optional[int] = typer.Option(None, help="Validation sequences (default: --test-examples)."),
    seed: int = typer.Option(1, help="Seed of weights and data."),
    device: str = typer.Option("cpu", help="auto, cpu, cuda, cuda:1, ..."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (default: runs/reverse-copy-<arch>-L<length>, "
                                           "L<min>-<max> for a range)."),
    restart: bool = typer.Option(False, help="Discard an existing run in the run directory."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Reverse copy (Mogrifier paper 4.3) with an encoder-decoder: test cross-entropy and exact sequences,
    overall and per length."""
    import yaml

    from ..tasks.reverse_copy import ReverseCopyConfig, run_reverse_copy

    options = {}
    for item in cell:
        key, sep, value = item.partition("=")
        if not sep:
            raise MoglmError(f"--cell {item!r}: expected key=value, e.g. rounds=5")
        options[key.strip()] = yaml.safe_load(value)
    cfg = ReverseCopyConfig(length=length, vocab_size=vocab_size, architecture=architecture, num_layers=num_layers,
                            hidden_size=hidden_size, num_params=None if hidden_size else num_params,
                            input_embedding_ratio=embedding_ratio, cell=options, batch_size=batch_size, steps=steps,
                            learning_rate=renamed(learning_rate, lr, "--lr", "--learning-rate"),
                            l2_penalty=l2_penalty, clip_norm=clip_norm, eval_every=eval_every,
                            valid_examples=valid_examples or test_examples, test_examples=test_examples, seed=seed,
                            min_length=min_length, max_length=max_length, train_examples=train_examples)
    path = _fresh(run_dir or Path("runs") / f"reverse-copy-{architecture}-L{cfg.length_label}", restart)
    run_reverse_copy(cfg, path, progress, typer.echo, device=device)
    typer.echo(f"run directory: {path}")

@app.command("partial-sentences")
def partial_sentences(
    config: Optional[str] = typer.Argument(None, help="Run config (TOML/YAML) or shipped name (default: default)."),
    cut: int = typer.Option(25, help="Keep the first CUT tokens (characters) of every training sentence."),
    set_: list[str] = typer.Option([], "--set", "-s", help="Override a config key: section.key=value."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory (default: runs/<config name>-cut<CUT>)."),
    restart: bool = typer.Option(False, help="Discard an existing run in the run directory."),
    progress: bool = typer.Option(True, help="Show progress bars."),
) -> None:
    """Train on sentences cut at CUT tokens, validate and test on whole sentences (report 6.1)."""
    from ..runs.config import load_config
    from ..train.final_evaluation import headline
    from ..tasks.partial_sentences import run_partial_sentences

    cfg = load_config(config or "default", set_)
    path = _fresh(run_dir or Path("runs") / f"{cfg.name or 'default'}-cut{cut}", restart)
    results = run_partial_sentences(cfg, cut, path, progress, typer.echo)
    typer.echo(f"{headline(results, 'test')} (trained on sentences cut at {cut})\nrun directory: {path}")
