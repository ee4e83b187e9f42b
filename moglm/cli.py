"""The ``moglm`` command line (typer): train, evaluate, sample, and the commands later work adds.

Every user error is one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

try:
    import typer

    from .cli_common import (DEVICE_HELP, Checkpoint, Sampler, Split, UpdateRule, deprecated,
                             hyperparameter_overrides, new_app, renamed, values)
except ImportError:  # pragma: no cover - exercised only without the extra
    typer = None

from .errors import MoglmError

EXTRA_HINT = "moglm's command line needs its optional dependencies: pip install 'moglm[all]'"


def _build_app():
    app = new_app("Mogrifier LSTM and other input-dependent recurrent language models.", name="moglm",
                  add_completion=False, pretty_exceptions_enable=False)

    def show_version(value: bool) -> None:
        if value:
            from . import __version__

            typer.echo(f"moglm {__version__}")
            raise typer.Exit()

    @app.callback()
    def root(
        version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                     help="Print moglm's version and exit."),
    ) -> None:
        """Mogrifier LSTM and other input-dependent recurrent language models."""

    @app.command()
    def train(
        config: Optional[str] = typer.Argument(None, help="Config file (TOML/YAML) or shipped config name "
                                                          "(default: default; `moglm configs` lists them)."),
        set_: list[str] = typer.Option([], "--set", "-s", help="Override a config key: section.key=value."),
        run_dir: Optional[Path] = typer.Option(None, help="Run directory (default: runs/<config name>)."),
        restart: bool = typer.Option(False, help="Discard an existing run in the run directory."),
        learning_rate: Optional[float] = typer.Option(None, help="Sets train.learning_rate."),
        lr: Optional[float] = deprecated("--lr"),
        max_steps: Optional[int] = typer.Option(None, min=1, help="Sets train.max_steps."),
        batch_size: Optional[int] = typer.Option(None, min=1, help="Sets train.batch_size."),
        hidden_size: Optional[int] = typer.Option(None, min=1, help="Sets model.hidden_size (instead of a parameter "
                                                  "budget)."),
        threads: Optional[int] = typer.Option(None, min=1, help="Sets train.threads."),
        seed: Optional[int] = typer.Option(None, min=0, max=2**63 - 1, help="Sets train.seed."),
        progress: bool = typer.Option(True, help="Show progress bars."),
        help_config: bool = typer.Option(False, "--help-config", help="Describe every config field and exit."),
        nproc_per_node: Optional[int] = typer.Option(
            None, min=1, help="Data-parallel training: this many processes (torchrun), each training a block of the "
            "batch's rows."),
    ) -> None:
        """Train a language model (rerun the same command to resume), evaluate it and print a sample."""
        from .atomic import atomic_write_text
        from .train import data_parallel
        from .train.config import describe, load_config
        from .train.final_evaluation import final_block
        from .train.language_model_run import LanguageModelRun
        from .train.trainer import train_and_evaluate

        if help_config:
            typer.echo(describe())
            return
        set_ = [*set_, *hyperparameter_overrides(
            learning_rate=renamed(learning_rate, lr, "--lr", "--learning-rate"), max_steps=max_steps,
            batch_size=batch_size, hidden_size=hidden_size, threads=threads, seed=seed)]
        cfg = load_config(config or "default", set_)
        path = run_dir or Path("runs") / (cfg.name or "default")
        if nproc_per_node is not None and not data_parallel.launched():
            args = [config or "default", *[a for s in set_ for a in ("--set", s)], "--run-dir", str(path),
                    *(["--restart"] if restart else []), *([] if progress else ["--no-progress"])]
            data_parallel.launch(nproc_per_node, ["train", *args])
            return
        if restart and path.exists() and data_parallel.is_main_process():
            LanguageModelRun(path).discard()  # refused, and nothing removed, while a trainer runs there
        _, results = train_and_evaluate(cfg, path, progress=progress, log=typer.echo)
        if not data_parallel.is_main_process():
            return
        for line in final_block(results, cfg):
            typer.echo(line)
        run = LanguageModelRun(path)
        from .sampling import NoStart

        try:
            text = _sample(run, cfg.sample.prompt, cfg.sample.num_tokens, cfg.sample.temperature, cfg.sample.top_k,
                           cfg.train.seed) if cfg.sample.num_tokens else None
        except NoStart:  # said before training: the run trained all the same
            text = None
        if text is not None:
            atomic_write_text(run.sample_path, text + "\n")
            typer.echo(f"--- sample ---\n{text}\n--------------")
        typer.echo(f"run directory: {path}")

    @app.command()
    def evaluate(
        run_dir: Path = typer.Argument(..., help="A run directory made by `moglm train`."),
        split: list[Split] = typer.Option([], help="Split(s) to evaluate (default: the config's)."),
        batch_size: Optional[int] = typer.Option(None, help="Streams (1: one continuous stream)."),
        logit_factor: Optional[float] = typer.Option(
            None, help="Multiply the logits by this factor, the inverse of a softmax temperature (default: the "
            "factor searched on valid)."),
        temperature: Optional[float] = deprecated("--temperature"),
        mc_samples: Optional[int] = typer.Option(None, help="MC-dropout samples (0: off)."),
        mc_dropout_multiplier: Optional[float] = typer.Option(None, help="MC dropout: rates are multiplied by this."),
        checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
        device: Optional[str] = typer.Option(None, help=f"{DEVICE_HELP} (default: the run's)."),
        progress: bool = typer.Option(True, help="Show progress bars."),
    ) -> None:
        """Evaluate a trained run (perplexity, bits per character/word) and write results.json."""
        from .train.final_evaluation import evaluate_run
        from .train.language_model_run import LanguageModelRun

        split = values(split)
        logit_factor = renamed(logit_factor, temperature, "--temperature", "--logit-factor")
        evaluate_run(LanguageModelRun(run_dir), split or None, batch_size, logit_factor, mc_samples,
                     mc_dropout_multiplier, checkpoint, device, progress, typer.echo,
                     write=(not split and checkpoint == "best"))

    @app.command()
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
        from .train.language_model_run import LanguageModelRun

        num_tokens = renamed(num_tokens, tokens, "--tokens", "--num-tokens")
        adapt_learning_rate = renamed(adapt_learning_rate, adapt_lr, "--adapt-lr", "--adapt-learning-rate")
        if _is_music_run(run_dir):
            from .music.run import music_run, sample_music_run

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
            from .sampling import encode_prompt

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
        from .sampling import unknown_prompt_tokens

        vocab = run.load_vocab()
        if vocab.unk is not None and (unknown := unknown_prompt_tokens(vocab, prompt)):
            shown = ", ".join(repr(t) for t in unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
            typer.echo(f"warning: the prompt's {shown} {'is' if len(unknown) == 1 else 'are'} not in the run's "
                       "vocabulary and will be read as <unk>", err=True)
        typer.echo(_sample(run, prompt, num_tokens, temperature, top_k, seed, checkpoint,
                           adapt or adapt_output, adapt_output, adapt_learning_rate))

    @app.command("related-words")
    def related_words_command(
        run_dir: Path = typer.Argument(..., help="A word-level run made by `moglm train`."),
        word: str = typer.Argument(..., help="The word dynamic evaluation updates on (the thesis: production)."),
        split: Split = typer.Option("test", help="The split whose text is read up to the word."),
        occurrence: int = typer.Option(1, min=1, help="Which occurrence of the word in the split."),
        top: int = typer.Option(10, min=1, help="Words nearest to it by embedding cosine to list."),
        checkpoint: Checkpoint = typer.Option("best", help="The best or the last checkpoint."),
    ) -> None:
        """Which words one dynamic-evaluation update makes more likely (thesis 5.3, table 5.2): the words nearest
        to WORD by embedding, with the change of their log-probability at WORD's step, and the vocabulary's median."""
        from .dynamic_evaluation.related_words import markdown_lines, related_words_of_run

        result = related_words_of_run(run_dir, word, getattr(split, "value", split), occurrence, top, checkpoint)
        typer.echo(f"{word!r}, occurrence {occurrence} of {getattr(split, 'value', split)} (position "
                   f"{result['position']:,}), after one update on its segment:")
        typer.echo("\n".join(markdown_lines(result)))

    @app.command()
    def configs() -> None:
        """List the language-model configs that ship with moglm (music: `moglm music configs`)."""
        from .train.config import read_mapping, shipped_configs

        for name, path in shipped_configs().items():
            typer.echo(f"{name:32s} {read_mapping(path).get('description', '')}")
        typer.echo("(music configs, for `moglm music train`: `moglm music configs`)")

    @app.command()
    def info(
        as_json: bool = typer.Option(False, "--json", help="Print the details as one JSON object."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="List every probed shape class's timings."),
    ) -> None:
        """What runs here: versions, threads, the CPU, the compiled recurrence (built at first use) and its GEMM route."""
        typer.echo(_info(as_json, verbose))

    @app.command()
    def tune(
        space: Optional[str] = typer.Argument(None, help="Search-space file (TOML/YAML) or shipped space name."),
        base: Optional[str] = typer.Option(None, help="Run config every trial starts from (default: the space's)."),
        set_: list[str] = typer.Option([], "--set", "-s", help="Override a base-config key: section.key=value."),
        trials: Optional[int] = typer.Option(None, min=0, help="Trials in the study in total, 0 to create it only "
                                             "(default: the space's)."),
        timeout: Optional[str] = typer.Option(None, help="Wall time, e.g. 3600, 90m, 2h: no trial starts after it."),
        train_tokens: Optional[int] = typer.Option(
            None, min=1, help="Training tokens per trial (sets train.max_tokens; default: the space's budget)."),
        eval_tokens: Optional[int] = typer.Option(
            None, min=1, help="Dynamic-evaluation spaces: validation tokens each trial scores (default: the "
            "space's budget, else 10,000)."),
        max_tokens: Optional[int] = deprecated("--max-tokens", min=1),
        workers: int = typer.Option(1, help="Worker processes on this machine."),
        threads: Optional[int] = typer.Option(None, min=1, help="Torch threads per worker (default: cores / workers)."),
        storage: Optional[str] = typer.Option(None, help="Optuna storage: a journal file, or a database URL such as "
                                              "postgresql+psycopg://user@host/db (default: study.journal in the "
                                              "study dir)."),
        worker: bool = typer.Option(False, "--worker", help="Join the existing study in --storage and run its trials "
                                    "until its budget is spent (its base, --set and token budget come from it)."),
        study_name: Optional[str] = typer.Option(None, help="Study name (default: the space's name)."),
        study_dir: Optional[Path] = typer.Option(None, help="Trials and reports (default: studies/<study name>)."),
        sampler: Optional[Sampler] = typer.Option(None, help="Optuna sampler (default: the space's)."),
        seed: Optional[int] = typer.Option(None, help="Sampler seed (default: the space's)."),
        keep_checkpoints: bool = typer.Option(False, help="Keep every trial's checkpoints (default: the best's)."),
        plots: bool = typer.Option(True, help="Draw the plots (parallel coordinates, history, importances)."),
        progress: bool = typer.Option(True, help="Show a progress bar per trial (one worker) and a line per "
                                      "evaluation."),
        list_spaces: bool = typer.Option(False, "--list", help="List the shipped search spaces and exit."),
    ) -> None:
        """Tune hyperparameters with Optuna (rerun to resume; workers elsewhere join through --storage)."""
        try:
            from .tune import run_study, shipped_spaces, write_report
            from .tune.search_space import load_space
        except ImportError as e:
            missing = f"moglm tune needs the tune extra ({e.name} is missing)"
            raise MoglmError(f"{missing}: pip install 'moglm[tune]'") from None

        if list_spaces or space is None:
            for name in shipped_spaces():
                typer.echo(f"{name:20s} {load_space(name)[0].description or ''}")
            return
        tokens = _trial_tokens(load_space(space)[0].target, train_tokens, eval_tokens, max_tokens)
        result = run_study(space, base=base, overrides=set_, study_name=study_name, study_dir=study_dir,
                           storage=storage, workers=workers, threads=threads, trials=trials,
                           timeout=_seconds(timeout), max_tokens=tokens, sampler=sampler,
                           seed="space" if seed is None else seed, keep_checkpoints=keep_checkpoints, log=typer.echo,
                           progress=progress, worker=worker)
        if int(os.environ.get("RANK", "0")):  # torchrun: rank 0 reports
            return
        typer.echo(write_report(result, plots=plots), nl=False)
        if result.failed_workers:
            raise MoglmError("; ".join(result.failed_workers) + " (rerun the same command to continue the study)")

    @app.command()
    def dyneval(
        run_dir: Optional[Path] = typer.Argument(None, help="A run directory made by `moglm train` (or --hf)."),
        split: list[Split] = typer.Option([], help="Split(s) to evaluate (default: test)."),
        rule: Optional[UpdateRule] = typer.Option(None, help="Update rule (Krause thesis 4.5 and 5.4; default: "
                                                  "rms-rmsdecay, with --hf sgd)."),
        learning_rate: Optional[float] = typer.Option(None, help="Learning rate (default: 1e-3; SGD rules 0.03; "
                                                      "rmsprop 1e-4)."),
        lr: Optional[float] = deprecated("--lr"),
        decay: Optional[float] = typer.Option(None, help="Decay towards the trained weights (default: 1e-2)."),
        eps: Optional[float] = typer.Option(None, help="RMS stabiliser epsilon (default: 1e-3)."),
        momentum: Optional[float] = typer.Option(None, help="sgd-momentum: the momentum mu, in [0, 1) (thesis eq. "
                                                 "5.10; default: 0.5)."),
        alpha: Optional[float] = typer.Option(None, help="rmsprop: weight of the running mean square, in (0, 1) "
                                              "(thesis eq. 5.12; default: 0.99)."),
        segment_length: Optional[int] = typer.Option(None, "--segment-length", "-n",
                                                      help="Tokens per update (default: 20)."),
        search: bool = typer.Option(False, help="Search the learning rate, decay, eps and segment length on a "
                                    "validation prefix."),
        search_tokens: Optional[int] = typer.Option(None, min=1, help="Validation tokens the search scores each "
                                                    "setting on (default: 10,000)."),
        max_cost: Optional[float] = typer.Option(None, help="Search: at most this x the static CPU time."),
        sparse: bool = typer.Option(False, help="Sparse dynamic evaluation: adapt only an H x H matrix per layer."),
        sparse_units: Optional[int] = typer.Option(None, min=1, help="Sparse: hidden units H each matrix transforms "
                                                   "(default: 100)."),
        sparse_layer: list[int] = typer.Option([], help="Sparse: adapted layer(s) (default: all)."),
        streams: Optional[int] = typer.Option(None, min=1, help="Streams side by side (full: shared weights; "
                                              "default: 1)."),
        mc_samples: int = typer.Option(0, min=0, help="MC dropout with dynamic evaluation: score and adapt on the "
                                       "mean of this many dropout samples (0: dropout off)."),
        episodic: Optional[bool] = typer.Option(None, "--episodic/--stream",
                                                help="Reset weights and state at every boundary token, decay 0 "
                                                "(default: as the run was trained)."),
        boundary: Optional[str] = typer.Option(None, help="Episodic: the boundary token (default: <eos> or newline)."),
        stats_fraction: Optional[float] = typer.Option(None, help="RMS statistics: fraction of the training split "
                                                       "(default 0.01; with --hf of --stats-text, default 1)."),
        stats_batch_size: Optional[int] = typer.Option(None, help="RMS statistics: streams per batch (default 8; "
                                                       "with --hf 1)."),
        adapt: list[str] = typer.Option([], help="Adapt only the parameters whose names match this glob "
                                        "(repeatable; default: all)."),
        freeze: list[str] = typer.Option([], help="Do not adapt the parameters whose names match this glob "
                                         "(repeatable)."),
        freeze_embeddings: Optional[bool] = typer.Option(
            None, "--freeze-embeddings/--adapt-embeddings", help="Leave the embedding matrices (input, output, "
            "tied) out of the adaptation (default: adapt them; with --hf freeze them, the thesis's GPT-2 choice)."),
        cache: bool = typer.Option(False, help="Also score with the neural cache (Grave et al. 2017, thesis 2.2.1): "
                                   "static + cache and dynamic + cache, theta and lambda searched on validation."),
        cache_size: int = typer.Option(500, min=1, help="Neural cache: positions it holds."),
        hf: Optional[str] = typer.Option(None, help="A Hugging Face causal LM (a local directory, or a name in the "
                                         "local cache) instead of a run: needs the hf extra and --text."),
        text: Optional[Path] = typer.Option(None, help="--hf: the UTF-8 text file to score."),
        stats_text: Optional[Path] = typer.Option(None, help="--hf: held-out text of the model's domain for the RMS "
                                                  "statistics (the rms rules need it)."),
        search_text: Optional[Path] = typer.Option(None, help="--hf: held-out text of the model's domain that "
                                                   "--search and --cache tune on."),
        context: Optional[int] = typer.Option(None, min=0, help="--hf: tokens of context before each segment "
                                              "(default: the model's positions minus the segment length)."),
        out: Optional[Path] = typer.Option(None, help="--hf: write the report (JSON) here."),
        eval_tokens: Optional[int] = typer.Option(None, min=1, help="Evaluate only the first N tokens of each "
                                                  "split."),
        max_tokens: Optional[int] = deprecated("--max-tokens", min=1),
        logit_factor: Optional[float] = typer.Option(
            None, help="Multiply the logits by this factor, the inverse of a softmax temperature (default: "
            "results.json's, else 1)."),
        temperature: Optional[float] = deprecated("--temperature"),
        margin: Optional[float] = typer.Option(None, help="Divergence guard: nats/token over static, > 0 (default: "
                                               "3)."),
        checkpoint: Optional[Checkpoint] = typer.Option(None, help="The best or the last checkpoint (default: best)."),
        device: Optional[str] = typer.Option(None, help=f"{DEVICE_HELP} (default: the run's)."),
        threads: Optional[int] = typer.Option(None, min=1, help="CPU threads for torch."),
        cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="CUDA: replay the recurrent layers' fused "
                                         "windows as CUDA graphs (on an H200, 1.7x static instead of 2.3-3.1x)."),
        progress: bool = typer.Option(True, help="Show progress bars."),
    ) -> None:
        """Dynamic evaluation: adapt the weights to the text while scoring it (Krause thesis ch. 4-6), of a run or
        of a Hugging Face causal LM (--hf)."""
        import contextlib

        import torch

        from .recurrence import cuda_graphs as graphs

        from .dynamic_evaluation import Hyperparameters, ParameterSelection, SparseSpec, StatisticsSettings
        from .dynamic_evaluation.run import dyneval_run
        from .train.language_model_run import LanguageModelRun

        learning_rate = renamed(learning_rate, lr, "--lr", "--learning-rate")
        eval_tokens = renamed(eval_tokens, max_tokens, "--max-tokens", "--eval-tokens")
        logit_factor = renamed(logit_factor, temperature, "--temperature", "--logit-factor")
        given = {"lr": learning_rate, "decay": decay, "eps": eps, "segment_length": segment_length,
                 "momentum": momentum, "alpha": alpha}
        if (hf is None) == (run_dir is None):
            raise MoglmError("give either a run directory or --hf PATH_OR_NAME")
        if hf is None and any(v is not None for v in (text, stats_text, search_text, context, out)):
            raise MoglmError("--text, --stats-text, --search-text, --context and --out go with --hf")
        if hf is not None and given["segment_length"] is None:
            given["segment_length"] = 32  # the thesis's GPT-2 segments (6.3.2)
        hp = Hyperparameters(rule=rule or ("sgd" if hf else "rms-rmsdecay"),
                             **{k: v for k, v in given.items() if v is not None})
        selection = ParameterSelection(tuple(adapt) or ("*",), tuple(freeze),
                                       not (freeze_embeddings if freeze_embeddings is not None else hf is not None))
        if threads is not None:
            torch.set_num_threads(max(1, threads))
        if margin is not None and not margin > 0:
            raise MoglmError(f"--margin must be > 0 nats per token, got {margin}")
        extra = {} if margin is None else {"margin": margin}
        if hf is not None:
            from .dynamic_evaluation.huggingface import dyneval_hf, read_text

            run_only = {"--search-tokens": search_tokens, "--sparse": sparse or None, "--sparse-units": sparse_units,
                        "--sparse-layer": sparse_layer or None, "--streams": streams, "--split": split or None,
                        "--mc-samples": mc_samples or None, "--episodic/--stream": episodic,
                        "--boundary": boundary, "--checkpoint": checkpoint, "--cuda-graphs": cuda_graphs or None}
            if given_run_only := [name for name, value in run_only.items() if value is not None]:
                raise MoglmError(f"{', '.join(given_run_only)} appl{'ies' if len(given_run_only) == 1 else 'y'} to "
                                 "a run, not to --hf (its text is --text; --search tunes on --search-text)")
            if hf.startswith((".", "/", "~")) and not Path(hf).expanduser().is_dir():
                raise MoglmError(f"--hf {hf}: no such directory")
            if text is None:
                raise MoglmError("--hf needs --text FILE, the text to score")
            if out is not None:
                from .atomic import check_free

                check_free(out, True)  # a folder, or a path through a file, is refused before the work
            statistics = StatisticsSettings(1.0 if stats_fraction is None else stats_fraction, stats_batch_size or 1)
            dyneval_hf(hf, read_text(text, "text"), hp, context=context, selection=selection,
                       stats_text=None if stats_text is None else read_text(stats_text, "statistics text"),
                       statistics=statistics, search=search,
                       search_text=None if search_text is None else read_text(search_text, "search text"),
                       max_cost=max_cost, cache=cache, cache_size=cache_size, eval_tokens=eval_tokens,
                       factor=1.0 if logit_factor is None else logit_factor, device=device or "cpu",
                       progress=progress, log=typer.echo, out=out, **extra)
            return
        statistics = StatisticsSettings(0.01 if stats_fraction is None else stats_fraction, stats_batch_size or 8)
        if cuda_graphs and (why := graphs.unavailable()) is not None:
            raise MoglmError(f"--cuda-graphs: {why}")
        with graphs.graphs() if cuda_graphs else contextlib.nullcontext():
            dyneval_run(LanguageModelRun(run_dir), tuple(values(split)) or ("test",), hp, search=search,
                        search_tokens=search_tokens or 10_000,
                        max_cost=max_cost,
                        sparse=SparseSpec(sparse_units or 100, tuple(sparse_layer) or None) if sparse else None,
                        streams=streams or 1, episodic=episodic, boundary=boundary,
                        statistics=statistics, eval_tokens=eval_tokens,
                        temperature=logit_factor, mc_samples=mc_samples, selection=selection, cache=cache,
                        cache_size=cache_size, which=checkpoint or "best", device=device, progress=progress,
                        log=typer.echo,
                        **extra)

    from .compression.cli import register as compression_commands

    compression_commands(app)

    from .experiments.cli import experiment_app, report_command

    app.add_typer(experiment_app(), name="experiment", help="The papers' experiments: list, run, status.")
    app.command("report")(report_command)

    from .tasks.cli import task_app

    app.add_typer(task_app(), name="task", help="Synthetic tasks: Dyck-k (WCPA), reverse copy, partial sentences.")

    from .music.cli import music_app

    app.add_typer(music_app(), name="music", help="Polyphonic music: RNN-NADE / LSTM-NADE / Mogrifier-NADE (thesis 4.8).")

    from .bench.cli import bench_app

    app.add_typer(bench_app(), name="bench", help="Benchmarks: throughput against nn.LSTM; equal-budget comparisons.")

    return app


def _trial_tokens(target: str, train_tokens: Optional[int], eval_tokens: Optional[int],
                  max_tokens: Optional[int]) -> Optional[int]:
    """The token budget of each trial (the space's ``budget.max_tokens``): ``--train-tokens`` for a space that
    trains, ``--eval-tokens`` for one that tunes dynamic evaluation (or ``--max-tokens``, their old name)."""
    if target == "dyneval" and train_tokens is not None:
        raise MoglmError("--train-tokens: this space tunes dynamic evaluation, which trains nothing; "
                         "--eval-tokens sets the validation tokens each trial scores")
    if target != "dyneval" and eval_tokens is not None:
        raise MoglmError("--eval-tokens applies to dynamic-evaluation spaces; --train-tokens sets a trial's "
                         "training tokens")
    new = "--eval-tokens" if target == "dyneval" else "--train-tokens"
    return renamed(train_tokens if eval_tokens is None else eval_tokens, max_tokens, "--max-tokens", new)


def _seconds(text: Optional[str]) -> Optional[float]:
    """``3600``, ``90s``, ``90m``, ``2h`` or ``1d`` in seconds."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        value = float(number) * unit
    except ValueError:
        raise MoglmError(f"--timeout: expected seconds or a number with s, m, h or d, got {text!r}") from None
    if value <= 0:
        raise MoglmError(f"--timeout must be positive, got {text!r}")
    return value


def _info(as_json: bool, verbose: bool = False) -> str:
    """``moglm info``: ``key: value`` lines (``verbose``: every probed shape class's timings too), or with
    ``as_json`` ``compiled.info()`` plus the versions as JSON."""
    import json
    import platform
    import warnings

    import torch

    from . import __version__
    from .recurrence import compiled

    with warnings.catch_warnings():  # the reason it is unavailable is printed below, not warned
        warnings.simplefilter("ignore", compiled.CompiledUnavailableWarning)
        details = {"moglm": __version__, "torch": torch.__version__, "python": platform.python_version(),
                   **compiled.info()}
    if as_json:
        return json.dumps(details, indent=2)
    if details["compiled"]:
        recurrence = "compiled (C++, CPU float32/float64)"
    else:
        recurrence = f"Python fused (the compiled recurrence is unavailable: {details['reason']})"
    lines = {key: details[key] for key in ("moglm", "torch", "python", "threads", "cpu")}
    lines["recurrence"] = recurrence
    if details["compiled"]:
        probe = details["gemm_route_probe_seconds"]
        lines["gemm_route"] = details["gemm_route"] + ("" if probe else " (not probed: forced or the only route)")
        if probe:
            lines["gemm_route_probe"] = ", ".join(f"{route} {seconds * 1e3:.2f} ms" for route, seconds in probe.items())
        probe = details["weight_gradient_route_probe_seconds"]
        lines["weight_gradient_route"] = details["weight_gradient_route"] + ("" if probe else " (not probed)")
        if probe:
            lines["weight_gradient_route_probe"] = ", ".join(f"{route} {seconds * 1e3:.2f} ms"
                                                              for route, seconds in probe.items())
        lines["mkl_thread_control"] = "yes" if details["mkl_thread_control"] else "no"
        cache = details["workspace_cache"]
        lines["workspace_cache"] = (
            f"{cache['cached_bytes'] / 2**20:.0f} MiB in {cache['cached_blocks']} blocks held, limit "
            f"{cache['limit_bytes'] / 2**20:.0f} MiB, {cache['hits']} hits, {cache['misses']} misses"
            if cache["limit_bytes"] else "off (MOGLM_WORKSPACE_CACHE_MB=0)")
        choices = details["auto_backend"]
        lines["auto_backend"] = (f"{len(choices)} shape classes probed on this machine"
                                 + ("" if verbose else " (--verbose lists them)") if choices
                                 else "no shape class probed yet (each is, on first use)")
        for key, choice in sorted(choices.items()) if verbose else ():
            times = ", ".join(f"{name} {seconds * 1e3:.2f} ms" for name, seconds in choice["seconds"].items())
            noise = "" if choice.get("separated") else ", within noise"
            route = f", compiled on route {choice['route']}" if choice.get("route") else ""
            lines[f"  {key}"] = f"{choice['backend']} ({times}{noise}{route})"
    lines["build_dir"] = details["build_dir"] or "-"
    return "\n".join(f"{key}: {value}" for key, value in lines.items())


def _is_music_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a music run (its saved config says ``kind = "music"``)."""
    from .music.config import is_music_config
    from .runs import RunDirectory

    run = RunDirectory(run_dir)
    return run.config_path.is_file() and is_music_config(run.read_config())


def _sample(run, prompt, tokens, temperature, top_k, seed, checkpoint: str = "best", adapt: bool = False,
            adapt_output: bool = False, adapt_lr: Optional[float] = None) -> str:
    import torch

    from .sampling import sample

    model, _, vocab = run.load_model(checkpoint)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    adapter = None
    if adapt:
        from .dynamic_evaluation.run import sampling_adapter

        adapter = sampling_adapter(run, model, checkpoint, adapt_lr)
    return sample(model, vocab, prompt, tokens, temperature, top_k, generator, adapter, adapt_output)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``moglm`` script (a torchrun worker ends here, see
    :func:`moglm.train.data_parallel.exit_worker`)."""
    code = _main(argv)
    if argv is None and "torch.distributed" in sys.modules:
        from .train.data_parallel import exit_worker

        exit_worker(code)
    return code


def _main(argv: list[str] | None) -> int:
    if typer is None:
        print(f"error: {EXTRA_HINT}", file=sys.stderr)
        return 2
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MOGLM_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    app = _build_app()
    click_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        code = app(args=argv, prog_name="moglm", standalone_mode=False)  # --help, --version: the exit code
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except click_error as e:  # a usage error: one line, not the usage and a box
        return _usage_error(e)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        return 1
    except MoglmError as e:
        if str(e):  # empty: a data-parallel rank stopping because rank 0 reported the error
            print(f"error: {e}", file=sys.stderr)
        return 130 if type(e).__name__ == "TrainingInterrupted" else 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # anything else: one line, the traceback only with --debug
        if debug:
            raise
        print(f"error: {_unexpected(e)}", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0


def _unexpected(e: Exception) -> str:
    """One line for an exception no command turned into a :class:`MoglmError`: out of memory, a full or
    read-only disk, or an internal error (with the pointer to ``--debug``)."""
    import errno

    text = " ".join(str(e).split())
    memory = ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory")
    if type(e).__name__ == "OutOfMemoryError" or any(m in text.lower() for m in memory):
        return (f"out of memory ({text[:200]}); use a smaller model (model.hidden_size, model.num_params) or "
                "batch (train.batch_size, evaluation.batch_size)")
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return f"no space left on the device{f' writing {e.filename}' if e.filename else ''}; free some and rerun"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        return f"cannot write {e.filename or 'a file'} ({e.strerror}); choose a writable --run-dir or study dir"
    return f"{type(e).__name__}: {text[:300]} (an internal error: rerun with --debug for the traceback)"


def _usage_error(error) -> int:
    """Print a usage error as one line naming the command's ``--help`` (the help itself when a command
    that needs arguments got none); returns its exit code (2)."""
    ctx = getattr(error, "ctx", None)
    if type(error).__name__ == "NoArgsIsHelpError" and ctx is not None:
        print(ctx.get_help())
        return error.exit_code
    message = " ".join(error.format_message().replace("Value error, ", "").split())
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    print(f"error: {message}{where}", file=sys.stderr)
    return error.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def __getattr__(name: str):
    """``moglm.cli.click_command``: the ``moglm`` command as a click command (typer's), built on first use, for
    tools that read click commands (the docs' command-line reference)."""
    if name == "click_command":
        import typer

        return typer.main.get_command(_build_app())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
