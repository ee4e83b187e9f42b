"""``moglm sample``: text from a trained run (optionally adapting to the prompt and the output, thesis 5.2),
or from a music run a MIDI file and its piano roll."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import MoglmError
from .common import Checkpoint, deprecated, renamed


def sample(
    run_dir: Path = typer.Argument(..., help="A run directory made by `moglm train`."),
    prompt: Optional[str] = typer.Option(None, help="Text to continue (default: the run's [sample] prompt)."),
    num_tokens: Optional[int] = typer.Option(None, min=0, help="Tokens to sample, a music run: frames (default: "
                                             "the run's [sample] num_tokens, or 200 where that is 0)."),
    tokens: Optional[int] = deprecated("--tokens", min=0),
    temperature: Optional[float] = typer.Option(None, help="Sampling temperature, > 0 (default: the run's "
                                                "[sample] temperature)."),
    top_k: Optional[int] = typer.Option(None, help="Sample among the k most likely tokens (default: the run's "
                                        "[sample] top_k)."),
    seed: Optional[int] = typer.Option(None, min=0, max=2**63 - 1, help="Random seed."),
    checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
    prompt_file: Optional[Path] = typer.Option(None, help="Read the prompt from a file (a long text)."),
    adapt: bool = typer.Option(False, help="Dynamic evaluation: adapt the weights to the prompt first."),
    adapt_output: bool = typer.Option(False, help="Also adapt to the sample itself, segment by segment."),
    adapt_learning_rate: Optional[float] = typer.Option(
        None, help="Learning rate of the adaptation (default: dyneval/full.json's, else moglm dyneval's)."),
    adapt_lr: Optional[float] = deprecated("--adapt-lr"),
    output: Optional[Path] = typer.Option(
        None, help="A music run: the MIDI file to write (default: <run>/sample.mid; the piano roll's PNG beside "
        "it)."),
    force: bool = typer.Option(False, "--force", "-f", help="A music run: replace an existing --output file "
                               "(and the PNG beside it)."),
) -> None:
    """Sample text from a trained run (optionally adapting to the prompt and the output, thesis 5.2); from a
    music run, frames written as a MIDI file and a piano-roll PNG."""
    from ..runs.language_model import LanguageModelRun

    num_tokens = renamed(num_tokens, tokens, "--tokens", "--num-tokens")
    adapt_learning_rate = renamed(adapt_learning_rate, adapt_lr, "--adapt-lr", "--adapt-learning-rate")
    if is_music_run(run_dir):
        from ..music.run import music_run, sample_music_run

        if prompt or prompt_file or adapt or adapt_output or top_k is not None or adapt_learning_rate is not None:
            raise MoglmError("a music run samples from silence: --prompt, --prompt-file, --adapt, "
                             "--adapt-learning-rate and --top-k apply to language models")
        sample_music_run(music_run(run_dir), 200 if num_tokens is None else num_tokens,
                         1.0 if temperature is None else temperature, seed, checkpoint, output, typer.echo, force)
        return
    if output is not None or force:
        raise MoglmError("--output and --force apply to music runs; a language model's sample is printed")

    if prompt_file is not None:
        if prompt:
            raise MoglmError("give --prompt or --prompt-file, not both")
        if not prompt_file.is_file():
            raise MoglmError(f"{prompt_file}: no such prompt file")
        try:
            prompt = prompt_file.read_text(encoding="utf-8").rstrip("\n")
        except UnicodeDecodeError as e:
            raise MoglmError(f"{prompt_file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    run = LanguageModelRun(run_dir)
    saved = run.load_config().sample  # the run's [sample] settings, as moglm train used them
    if prompt is None:
        from ..sampling import encode_prompt

        prompt = saved.prompt
        try:
            encode_prompt(run.load_vocab(), prompt)
        except MoglmError as e:  # a saved prompt that cannot start a sample (a run trained without samples)
            typer.echo(f"warning: the run's [sample] prompt cannot be used ({e}); sampling from an empty prompt",
                       err=True)
            prompt = ""
    num_tokens = num_tokens if num_tokens is not None else (saved.num_tokens or 200)
    temperature = saved.temperature if temperature is None else temperature
    top_k = saved.top_k if top_k is None else top_k
    from ..sampling import unknown_prompt_tokens

    vocab = run.load_vocab()
    if vocab.unk is not None and (unknown := unknown_prompt_tokens(vocab, prompt)):
        shown = ", ".join(repr(t) for t in unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        typer.echo(f"warning: the prompt's {shown} {'is' if len(unknown) == 1 else 'are'} not in the run's "
                   "vocabulary and will be read as <unk>", err=True)
    typer.echo(generate(run, prompt, num_tokens, temperature, top_k, seed, checkpoint,
                       adapt or adapt_output, adapt_output, adapt_learning_rate))


def is_music_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a music run (its saved config says ``kind = "music"``)."""
    from ..music.config import is_music_config
    from ..runs import RunDirectory

    run = RunDirectory(run_dir)
    return run.config_path.is_file() and is_music_config(run.read_config())


def generate(run, prompt, tokens, temperature, top_k, seed, checkpoint: str = "best", adapt: bool = False,
            adapt_output: bool = False, adapt_lr: Optional[float] = None) -> str:
    import torch

    from ..sampling import sample

    model, _, vocab = run.load_model(checkpoint)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    adapter = None
    if adapt:
        from ..dynamic_evaluation.run import sampling_adapter

        adapter = sampling_adapter(run, model, checkpoint, adapt_lr)
    return sample(model, vocab, prompt, tokens, temperature, top_k, generator, adapter, adapt_output)
