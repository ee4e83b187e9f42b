"""The adaptation's learning rate searched for compression on held-out text: ``moglm compress --dynamic`` (the
run's weights, rule rms-rmsdecay) and ``--from-scratch`` (fresh weights, rule rmsprop) at each learning rate,
bits per byte of the coded file against xz -9's.

    cat /usr/share/vim/vim90/doc/usr_0[6-8].txt > vim-usr-06-08.txt    # tuning text; 01-05 is the test text
    python benchmarks/compression_search.py experiments/cpu/runs/wikitext-2-byte-s1 vim-usr-06-08.txt \\
        --out benchmarks/results/compression_search.json                  # ~15 minutes on one core

Each setting compresses the file once as ``moglm compress`` does by default (blocks of 4096 bytes, at most 12
adapting, unless ``--block-size`` says, segments sized to them unless ``--segment-length`` says, the neural cache unless
``--no-cache``, the context mixer unless ``--contexts off``, the match model unless ``--match-min-length 0``,
one thread; ``--static`` adds rows without adapting); the coded size is the search's score, so nothing is
decompressed (``moglm bench compress`` checks the round trip of the setting chosen). Writes JSON and prints a
markdown table.
"""

from __future__ import annotations

import argparse
import lzma
from pathlib import Path

from moglm.bench import command_line, write_report
from moglm.compression import compress
from moglm.compression.container import default_block_size, streams
from moglm.compression.context_mixing import ContextSettings
from moglm.compression.match import MatchSettings
from moglm.compression.run import (CACHE, CONTEXTS, MATCH, adapter_from_settings, coding_model, dynamic_settings,
                                   scratch_settings)
from moglm.errors import MoglmError
from moglm.runs.language_model import LanguageModelRun

RUN_LRS = [3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 7e-3, 1e-2]
SCRATCH_LRS = [1e-3, 3e-3, 1e-2, 3e-2]


def _with(settings: dict, **changes) -> dict:
    """``settings`` with hyperparameters changed (None: kept)."""
    from moglm.dynamic_evaluation import Hyperparameters

    hp = Hyperparameters(**settings["hyperparameters"]).with_(**{k: v for k, v in changes.items() if v is not None})
    return {**settings, "hyperparameters": hp.as_dict()}


KEEP = "default"  # a setting left as moglm compress --dynamic sets it


def _set(settings: dict, key: str, value) -> dict:
    """``settings`` with ``key`` set to ``value`` (:data:`KEEP`: as they are; ``None``: left out)."""
    if isinstance(value, str) and value == KEEP:
        return settings
    rest = {k: v for k, v in settings.items() if k != key}
    return rest if value is None else rest | {key: value}


def measure(run_dir: Path, file: Path, run_lrs, scratch_lrs, seed: int, decays=(None,), segments=(None,),
            block_size: int | None = None, cache: bool = True, guards=(KEEP,), warmups=(KEEP,),
            log=print, min_lengths=(MATCH.min_length,), static: bool = False,
            contexts=(CONTEXTS,)) -> list[dict]:
    """``guards`` / ``warmups``: the divergence margins and step warm-ups to code with (:data:`KEEP`: moglm
    compress's; ``None``: none); ``min_lengths``: the match model's (0: none); ``contexts``: the context mixer's
    settings (``None``: none); ``static``: also code without adapting (a row per min_length, first);
    ``block_size``: bytes per block (``None``: moglm compress's, static and adapting)."""
    data = file.read_bytes()
    sizes = {adapting: default_block_size(len(data), adapting) if block_size is None else block_size
             for adapting in (False, True)}
    blocks = streams(data, LanguageModelRun(run_dir).load_vocab(), sizes[True])
    ways = [("run's weights", _set(_set(_with(dynamic_settings(run_dir, None, lr, blocks), decay=decay,
                                              segment_length=n), "guard", guard), "warmup", warmup))
            for lr in run_lrs for decay in decays for n in segments for guard in guards for warmup in warmups]
    ways += [(f"from scratch (seed {seed})", scratch_settings(seed, None, lr)) for lr in scratch_lrs]
    ways = ([("run's weights, static", None)] if static else []) + ways
    rows = []
    for (name, settings), min_length, mixer in ((way, n, c) for way in ways for n in min_lengths for c in contexts):
        model, vocab, factor = coding_model(run_dir, "best", (settings or {}).get("from_scratch"))
        adapter = None if settings is None else adapter_from_settings(run_dir, model, "best", factor, settings)
        _, report = compress(data, model, vocab, factor=factor, adapter=adapter, settings=settings,
                             cache=CACHE if cache else None, block_size=sizes[settings is not None], progress=False,
                             match=MatchSettings(min_length) if min_length else None, contexts=mixer)
        settings = settings or {}  # static: no adaptation, its fields empty
        hp = settings.get("hyperparameters", {})
        rows.append({"weights": name, "rule": hp.get("rule", "-"), "lr": hp.get("lr"), "decay": hp.get("decay"),
                     "segment_length": hp.get("segment_length"), "guard": settings.get("guard"),
                     "warmup": settings.get("warmup", 0), "match_min_length": min_length,
                     "contexts": None if mixer is None else vars(mixer), "block_size": sizes[settings is not None],
                     "rollbacks": report.rollbacks, "compressed_bytes": report.compressed_bytes,
                     "header_bytes": report.header_bytes,
                     "bits_per_byte": 8 * report.compressed_bytes / len(data), "seconds": report.seconds})
        log(f"{name}, {hp.get('rule', '-')} lr {hp.get('lr', '-')} decay {hp.get('decay', '-')} n "
            f"{hp.get('segment_length', '-')} guard {settings.get('guard', 'off')} warmup {settings.get('warmup', 0)} "
            f"match {min_length or 'off'} contexts {_spelled(mixer)}: {report.compressed_bytes:,} bytes, "
            f"{report.rollbacks} rollbacks")
    return rows


def _spelled(mixer: ContextSettings | None) -> str:
    if mixer is None:
        return "off"
    spelled = f"{','.join(map(str, mixer.orders))}/{mixer.words}/{mixer.alpha:g}/{mixer.lr:g}/{mixer.apm_lr:g}"
    if mixer.mixers or mixer.sparse:
        spelled += f"/{','.join(mixer.mixers)}/{mixer.final_lr:g}"
    return spelled + (f"/{','.join(mixer.sparse)}" if mixer.sparse else "")


def _mixer(spec: str) -> ContextSettings | None:
    """``--contexts``' ORDERS/WORDS/ALPHA/LR/APM_LR[/MIXERS/FINAL_LR[/SPARSE]] (e.g. ``1,2,3,4/2/0.5/1e-3/0.02``,
    or with further weight sets ``1,2,3,4,6/2/0.25/4e-3/0.02/token,order2,kinds,word/5e-4``, and sparse contexts
    ``.../5e-4/above,skip``; ``off``: none; ``default``: moglm compress's)."""
    if spec == "off":
        return None
    if spec == KEEP:
        return CONTEXTS
    try:
        parts = spec.split("/")
        if len(parts) not in (5, 7, 8):
            raise ValueError(spec)
        orders, words, alpha, lr, apm_lr = parts[:5]
        mixers, final_lr = parts[5:7] or ("", CONTEXTS.final_lr)
        sparse = parts[7] if len(parts) == 8 else ""
        return ContextSettings(tuple(int(k) for k in orders.split(",")), int(words), float(alpha), float(lr),
                               float(apm_lr), tuple(m for m in mixers.split(",") if m), float(final_lr),
                               tuple(m for m in sparse.split(",") if m), CONTEXTS.kernel)
    except (ValueError, MoglmError):
        raise SystemExit(f"--contexts: {spec!r} is not ORDERS/WORDS/ALPHA/LR/APM_LR[/MIXERS/FINAL_LR[/SPARSE]] (e.g. "
                         "1,2,3,4/2/0.5/1e-3/0.02), off or default") from None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("file", type=Path)
    parser.add_argument("--lr", type=float, nargs="+", default=RUN_LRS, help="--dynamic's learning rates")
    parser.add_argument("--scratch-lr", type=float, nargs="*", default=SCRATCH_LRS,
                        help="--from-scratch's learning rates (none: skip)")
    parser.add_argument("--seed", type=int, default=1, help="--from-scratch's seed")
    parser.add_argument("--decay", type=float, nargs="+", default=[None],
                        help="--dynamic's decays towards the trained weights (default: the rule's)")
    parser.add_argument("--segment-length", type=int, nargs="+", default=[None],
                        help="--dynamic's segment lengths (default: moglm compress's, sized to the blocks)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="bytes per block (default: moglm compress's, 4096, at most 12 blocks adapting; 0: one "
                             "stream)")
    parser.add_argument("--cache", action=argparse.BooleanOptionalAction, default=True,
                        help="code with moglm compress's neural cache (--no-cache: without, as the searches "
                             "recorded before it were)")
    parser.add_argument("--guard", nargs="+", default=[KEEP],
                        help="--dynamic's divergence margins in nats per token ('default': moglm compress's; "
                             "'off': none, as files written before the guard)")
    parser.add_argument("--warmup", type=int, nargs="+", default=[None],
                        help="tokens over which --dynamic's step grows to its full size (default: moglm "
                             "compress's; 0: none)")
    parser.add_argument("--match-min-length", type=int, nargs="+", default=[MATCH.min_length],
                        help=f"the match model's min_length (default: moglm compress's, {MATCH.min_length}; 0: "
                             "none, as the searches recorded before it were)")
    parser.add_argument("--contexts", nargs="+", default=[KEEP],
                        help="the context mixer's settings as ORDERS/WORDS/ALPHA/LR/APM_LR[/MIXERS/FINAL_LR[/SPARSE]], "
                             "e.g. 1,2,3,4/2/0.5/1e-3/0.02 ('default': moglm compress's; 'off': none, as the searches "
                             "recorded before it were)")
    parser.add_argument("--static", action="store_true", help="also code without adapting (the first rows)")
    parser.add_argument("--out", default="compression_search.json")
    args = parser.parse_args(argv)
    data = args.file.read_bytes()
    xz = len(lzma.compress(data, preset=9))
    rows = measure(args.run, args.file, args.lr, args.scratch_lr, args.seed, args.decay, args.segment_length,
                   args.block_size, args.cache,
                   [None if g == "off" else g if g == KEEP else float(g) for g in args.guard],
                   [KEEP if w is None else w or None for w in args.warmup], min_lengths=args.match_min_length,
                   static=args.static, contexts=[_mixer(spec) for spec in args.contexts])
    report = {"command": command_line(), "file": args.file.name, "bytes": len(data), "run": args.run.name,
              "block_size": args.block_size, "cache": vars(CACHE) if args.cache else None, "xz -9": xz, "rows": rows}
    write_report(report, args.out)
    print(f"`{args.file.name}` ({len(data):,} bytes), xz -9 {xz:,} bytes ({8 * xz / len(data):.3f} bits per byte)\n")
    print("| weights | rule | lr | decay | n | guard | match | contexts | rollbacks | bytes | bits per byte | "
          "against xz -9 |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        lr, decay, guard = ("-" if r[k] is None else f"{r[k]:g}" for k in ("lr", "decay", "guard"))
        print(f"| {r['weights']} | {r['rule']} | {lr} | {decay} | {r['segment_length'] or '-'} | {guard} | "
              f"{r['match_min_length'] or 'off'} | {_spelled(r['contexts'] and ContextSettings(**r['contexts']))} | "
              f"{r['rollbacks']} | "
              f"{r['compressed_bytes']:,} | {r['bits_per_byte']:.3f} | "
              f"{100 * (r['compressed_bytes'] / xz - 1):+.1f}% |")
    print(f"written to {args.out}")
    return report


if __name__ == "__main__":
    main()
