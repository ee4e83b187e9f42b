"""Shared test helpers: float64, small odd sizes, fixed seeds."""

from __future__ import annotations

import json
import random

import pytest
import torch

# Tiny models run fastest on one thread, and one thread per process keeps the suite from
# oversubscribing a small machine shared with other work.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    """SIGTERM stops the run as Ctrl-C does (a KeyboardInterrupt: pytest reports what ran and exits)."""
    import signal

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)


@pytest.fixture(autouse=True)
def _stop_on_signals_a_trainer_caught(request):
    """A SIGINT or SIGTERM that arrives while a test trains in this process is caught by the training engine
    (it saves a checkpoint and stops that run): the test run stops after that test instead of going on. Tests
    that signal themselves on purpose are marked ``sends_signals``."""
    from moglm.train.engine import _InterruptFlag

    _InterruptFlag.received = None
    yield
    if _InterruptFlag.received is not None and request.node.get_closest_marker("sends_signals") is None:
        pytest.exit(f"stopped by signal {_InterruptFlag.received} during {request.node.nodeid}", returncode=2)


def grads_of(tensors):
    """Gradients of ``tensors`` (a list), with ``None`` for tensors that got none."""
    return [None if t.grad is None else t.grad.clone() for t in tensors]


def assert_close_all(actual, expected, **kw):
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert (a is None) == (e is None), f"item {i}: one gradient is missing"
        if a is not None:
            torch.testing.assert_close(a, e, **kw, msg=lambda m: f"item {i}: {m}")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Corpus caches of tests go to a per-session temporary folder, never to ~/.cache; ``backend="auto"``
    runs the compiled window without probing (a timing must not decide what a test exercises, nor the
    tests' tiny shapes fill the machine's stored choices); tests/recurrence/test_recurrence_auto.py lifts this."""
    monkeypatch.setenv("MOGLM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "moglm-cache"))
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", "compiled")


def write_tiny_corpus(directory, lines_per_split=(400, 40, 40), seed=0):
    """A small word-level corpus with learnable structure: 'the <noun> <verb> the <noun> .' sentences."""
    import random

    rng = random.Random(seed)
    nouns = ["cat", "dog", "bird", "fish", "cow", "owl"]
    verbs = ["sees", "likes", "eats", "hears"]
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines_per_split):
        lines = []
        for _ in range(n):
            a, b = rng.choice(nouns), rng.choice(nouns)
            lines.append(f"the {a} {rng.choice(verbs)} the {b} .")
        (directory / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture
def fresh_choice_store(tmp_path, monkeypatch):
    """``auto`` free to probe (``MOGLM_AUTO_BACKEND`` lifted), its choices stored in a fresh place rather than this
    machine's cache (the built library stays where it is); yields the store's file."""
    from moglm.recurrence.compiled import routes

    monkeypatch.setattr(routes, "backend_file", lambda: tmp_path / "backend_choice_v2.json")
    monkeypatch.delenv("MOGLM_AUTO_BACKEND", raising=False)
    routes.forget()
    yield tmp_path / "backend_choice_v2.json"
    routes.forget()


@pytest.fixture
def tiny_corpus(tmp_path):
    return write_tiny_corpus(tmp_path / "tiny")


def tiny_config(corpus_dir, **sections):
    """A RunConfig for a tiny model on ``corpus_dir`` that trains in a second or two."""
    from moglm.runs.config import validate

    data = {
        "name": "tiny",
        "data": {"path": str(corpus_dir), "format": "word"},
        "model": {"architecture": "mogrifier", "num_layers": 2, "hidden_size": 24, "cell": {"rounds": 3, "rank": 4},
                  "input_dropout": 0.1, "state_dropout": 0.1, "output_dropout": 0.1},
        "train": {"batch_size": 4, "bptt": 10, "max_steps": 12, "eval_every": 4, "learning_rate": 0.01,
                  "eval_batch_size": 2, "device": "cpu", "averaging_patience": 1},
        "evaluation": {"temperature_tokens": 200, "batch_size": 1},
        "sample": {"num_tokens": 5},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    return validate(data)


def tiny_trained_run(root, test_prefix: str = "", **train):
    """A tiny run trained in ``root / "run"`` (its corpus cache under ``root``): the shared fixture of
    the dynamic-evaluation tests. ``test_prefix``: text put before the test split's first line."""
    from moglm.train import Trainer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOGLM_CACHE_DIR", str(root / "cache"))
        corpus = write_tiny_corpus(root / "tiny")
        test = corpus / "test.txt"
        test.write_text(test_prefix + test.read_text())
        cfg = tiny_config(corpus, train=train, sample={"num_tokens": 0})
        Trainer(cfg, root / "run", progress=False, log=lambda s: None).train()
    return root / "run"


def tiny_format_run(root, fmt, **model):
    """A tiny run trained in ``root / "run"`` on the tiny corpus read as ``fmt``: ``char``, ``byte``, or
    ``ptb_char`` (the corpus rewritten in Mikolov's format: symbols separated by spaces, ``_`` between words).
    The shared fixture of the compression tests."""
    from moglm.train import Trainer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOGLM_CACHE_DIR", str(root / "cache"))
        corpus = write_tiny_corpus(root / "tiny")
        if fmt == "ptb_char":
            for split in ("train", "valid", "test"):
                path = corpus / f"{split}.txt"
                lines = path.read_text().splitlines()
                path.write_text("".join(" " + " ".join(line.replace(" ", "_")) + " \n" for line in lines))
        cfg = tiny_config(corpus, data={"format": fmt}, model=model, train={"max_steps": 40, "eval_every": 20},
                          sample={"num_tokens": 0})
        Trainer(cfg, root / "run", progress=False, log=lambda s: None).train()
    return root / "run"


def coded_round_trip(run, data: bytes, hp=None, block_size: int = 64, **coding):
    """``(container, report)`` of ``data`` compressed with the trained ``run`` (``hp``: adapting with these
    dynamic-evaluation hyperparameters; ``coding``: compress's ``cache`` / ``match`` / ``contexts``), after checking
    that it decompresses to ``data``."""
    from moglm.compression import compress, decompress
    from moglm.dynamic_evaluation import DynamicEvaluator
    from moglm.runs.language_model import load_run

    trained = load_run(run)

    def adapter(header=None):
        return None if hp is None else DynamicEvaluator(trained.model, hp, factor=trained.temperature)

    settings = None if hp is None else {"hyperparameters": hp.as_dict()}
    blob, report = compress(data, trained.model, trained.vocab, factor=trained.temperature, adapter=adapter(),
                            settings=settings, block_size=block_size, progress=False, **coding)
    assert decompress(blob, trained.model, trained.vocab, progress=False, adapter_for=adapter) == data
    return blob, report


def tiny_evaluated_run(root):
    """A tiny run trained and evaluated by ``moglm evaluate`` (``results.json``: its scores and logit factor) in
    ``root / "run"``, its test split starting with a blank line as WikiText's do: the rest of the split, read from
    a leading line separator, is the token stream ``moglm evaluate`` scores (:func:`tiny_evaluated_document`)."""
    from moglm.cli import main

    run = tiny_trained_run(root, test_prefix="\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOGLM_CACHE_DIR", str(root / "cache"))
        assert main(["evaluate", str(run), "--no-progress"]) == 0
    return run


def tiny_evaluated_document(run) -> str:
    """The test split of :func:`tiny_evaluated_run` without its leading blank line."""
    return (run.parent / "tiny" / "test.txt").read_text().removeprefix("\n")


def copied_run(run, tmp_path):
    """A copy of the shared, module-scoped run ``run`` in ``tmp_path / "run"``, for a test that changes it."""
    import shutil

    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def dyneval_report(run, tag):
    """The report ``moglm dyneval`` wrote under ``tag`` (``full``, ``sparse-first100`` ...): ``dyneval/<tag>.json``,
    or ``<tag>-rejected.json`` where adapting scored worse than static or rolled back (tiny test models may)."""
    import json

    found = [p for p in (run / "dyneval" / f"{tag}.json", run / "dyneval" / f"{tag}-rejected.json") if p.is_file()]
    assert len(found) == 1, f"expected one of {tag}.json and {tag}-rejected.json, found {found}"
    return json.loads(found[0].read_text())


def write_music_corpus(path, songs_per_split=(12, 4, 4), seed=0):
    """Songs that repeat a short random chord progression (so adapting to a song pays), C3-C5 chords."""
    rng = random.Random(seed)
    data = {}
    for split, count in zip(("train", "valid", "test"), songs_per_split):
        songs = []
        for _ in range(count):
            motif = [tuple(sorted(rng.sample(range(48, 72), 3))) for _ in range(rng.randint(2, 4))]
            length = rng.randint(10, 24)
            songs.append([list(motif[t % len(motif)]) for t in range(length)])
        data[split] = songs
    path.write_text(json.dumps(data))
    return path


def tiny_music_config(corpus, **train):
    """A tiny RNN-NADE config over :func:`write_music_corpus`'s songs."""
    from moglm.music.config import validate_music

    return validate_music({
        "kind": "music", "name": "tiny",
        "data": {"path": str(corpus)},
        "model": {"architecture": "lstm", "hidden_size": 12, "num_layers": 1, "nade_hidden": 8,
                  "nade_dropout": 0.1, "output_dropout": 0.1},
        "train": {"optimizer": "adam", "learning_rate": 0.01, "batch_size": 4, "max_steps": 12, "eval_every": 4,
                  "threads": 1} | train,
        "evaluation": {"batch_size": 4},
        "sample": {"num_frames": 0},
    })


def tiny_text_file(path):
    """600 lines of random words from a 13-word vocabulary (the experiments' tiny corpus)."""
    rng = random.Random(0)
    words = "the cat sat on a mat and dog ran far away from home".split()
    path.write_text("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(600))
                    + "\n")
    return path


class FakeCuda:
    """What a CUDA-graph capture touches of torch.cuda, faked so that the graph path runs on CPU tensors: every
    window applies while graphs are on (even after a failed capture: the graph path itself must then run it
    plain), the stream calls are recorded in ``calls``, and ``capture(window)`` stands in for
    ``torch.cuda.make_graphed_callables`` (counted in ``captures``)."""

    def __init__(self, monkeypatch, capture):
        from moglm.recurrence import cuda_graphs

        self.calls: list[str] = []
        self.captures = 0
        monkeypatch.setattr(cuda_graphs, "unavailable", lambda: None)
        monkeypatch.setattr(cuda_graphs, "applies", lambda xs: cuda_graphs.enabled())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: "the stream")
        monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: self.calls.append(f"set_stream({stream})"))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: self.calls.append("synchronize"))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "default_generators", (_FakeGenerator(self.calls),))

        def make_graphed_callables(window, sample_args):
            self.captures += 1
            return capture(window)

        monkeypatch.setattr(torch.cuda, "make_graphed_callables", make_graphed_callables)


class _FakeGenerator:
    """The device's random generator as a failed capture leaves it: ``graphsafe_set_state(clone_state())`` is
    recorded in ``calls`` as taking it out of capture mode."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def clone_state(self):
        return "a copy of its state"

    def graphsafe_set_state(self, state):
        self.calls.append(f"random generator set to {state}")


def refuse_capture(window):
    """A capture that fails as a CUDA graph capture does."""
    raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors might be "
                       "asynchronously reported")


@pytest.fixture
def fake_cuda(monkeypatch):
    """``fake_cuda(capture)``: a :class:`FakeCuda`; afterwards the graphs' state is forgotten (cache, failure)."""
    from moglm.recurrence import cuda_graphs

    yield lambda capture: FakeCuda(monkeypatch, capture)
    cuda_graphs.enable(False)
