"""How long a 100 MB corpus takes to load the first time (tokenised) and the second time (cached ids).

    python benchmarks/corpus_cache.py            # ~2 minutes; writes benchmarks/results/corpus_cache.json

Generates a ~100 MB word-level text (Zipf-distributed words from a 30k vocabulary, 20 words per line),
then times ``load_corpus`` twice in fresh processes (so nothing is shared but the cache on disk), for the
word and byte formats, with the id cache in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def write_corpus(path: Path, megabytes: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(30_000)])
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    written = 0
    with path.open("w") as f:
        while written < megabytes * 2**20:
            words = vocab[rng.choice(len(vocab), size=(5_000, 20), p=weights)]
            block = "\n".join(" ".join(row) for row in words) + "\n"
            f.write(block)
            written += len(block)
    return written


def timed_load(corpus: Path, fmt: str, cache: Path) -> float:
    code = (
        "import time; t = time.perf_counter(); from moglm.data.corpus import load_corpus; "
        f"c = load_corpus({str(corpus)!r}, format={fmt!r}); print(time.perf_counter() - t)"
    )
    env = {**os.environ, "MOGLM_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--formats", nargs="+", default=["word", "byte"])
    parser.add_argument("--out", default=str(HERE / "results" / "corpus_cache.json"))
    args = parser.parse_args(argv)
    results = {"megabytes": args.megabytes, "formats": {}}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        start = time.perf_counter()
        results["bytes"] = write_corpus(corpus, args.megabytes)
        print(f"wrote {results['bytes'] / 2**20:.0f} MB in {time.perf_counter() - start:.0f} s", flush=True)
        for fmt in args.formats:
            cache = Path(tmp) / f"cache-{fmt}"
            first, second = timed_load(corpus, fmt, cache), timed_load(corpus, fmt, cache)
            results["formats"][fmt] = {"first_load_s": first, "cached_load_s": second}
            print(f"{fmt}: first load {first:.1f} s, cached {second:.1f} s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"written to {out}")
    return results


if __name__ == "__main__":
    main()
