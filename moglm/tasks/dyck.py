"""Bounded Dyck-k, Dyck-(k, m): well-nested brackets of k types whose depth never exceeds m (Hewitt et al.
2020; the student report ``input-dependent-transitions-dyck-mmlstm``, sections 4.2 and 5), as a generator
and a corpus (training and WCPA: :mod:`moglm.tasks.dyck_training`, :mod:`moglm.tasks.wcpa`).

The generation process (:meth:`DyckLanguage.sample`) is Hewitt et al.'s probabilistic automaton over a
stack of open brackets, with its probabilities as parameters:

* empty stack: end the sequence with probability ``end_probability`` (1/2) once it has ``min_length``
  brackets, otherwise open a bracket;
* full stack (depth m): close the top bracket;
* otherwise: open a bracket with probability ``open_probability`` (1/2), else close the top one;
* an opened bracket's type is uniform over the k types; a sequence longer than ``max_length`` brackets
  is discarded and sampled again (so lengths are those of the process, cut to the range).

Lengths count brackets (the end is the corpus's ``<eos>``). The defaults give training and validation
sequences of 20-100 brackets (a minimum, so that long-distance pairs are not rare) and test sequences
of 102-200, longer than any seen in training (as Hewitt et al.'s 1-180 and 181-360); splits of 2000,
200 and 500 sequences. Bracket ids follow :meth:`moglm.DyckRNN.bracket_embedding`: ``0..k-1`` open
types, ``k..2k-1`` the matching closes; in corpus files they are ``( [ { <`` / ``) ] } >`` (then ``(4``/``4)``...).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import MoglmError
from ..atomic import atomic_write_text
from .wcpa import POSITIONS

_PAIRS = ("()", "[]", "{}", "<>")
SPLITS = ("train", "valid", "test")


def bracket_tokens(num_types: int) -> list[str]:
    """Token strings by bracket id: the k opening brackets, then their closing brackets."""
    pairs = [_PAIRS[i] if i < len(_PAIRS) else (f"({i}", f"{i})") for i in range(num_types)]
    return [p[0] for p in pairs] + [p[1] for p in pairs]


@dataclass(frozen=True)
class DyckLanguage:
    """Dyck-(k, m) with the sampling probabilities of the generation process (module docstring)."""

    num_types: int = 2
    max_depth: int = 4
    open_probability: float = 0.5
    end_probability: float = 0.5

    def __post_init__(self) -> None:
        if self.num_types < 1 or self.max_depth < 1:
            raise MoglmError(f"Dyck-(k, m) needs k >= 1 and m >= 1, got k={self.num_types}, m={self.max_depth}")
        for name in ("open_probability", "end_probability"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise MoglmError(f"{name} must be in (0, 1), got {getattr(self, name)}")

    def sample(self, rng: random.Random, min_length: int = 2, max_length: int = 100) -> list[int]:
        """One sequence of bracket ids with ``min_length <= len <= max_length`` (rejection sampling)."""
        if max_length < max(min_length, 2):
            raise MoglmError(f"no sequence has between {min_length} and {max_length} brackets")
        k = self.num_types
        while True:
            sequence: list[int] = []
            stack: list[int] = []
            while len(sequence) <= max_length:
                if not stack and len(sequence) >= min_length and rng.random() < self.end_probability:
                    return sequence
                if stack and (len(stack) == self.max_depth or rng.random() >= self.open_probability):
                    sequence.append(stack.pop() + k)  # close the top bracket
                else:
                    stack.append(rng.randrange(k))
                    sequence.append(stack[-1])

    def sample_many(self, count: int, lengths: tuple[int, int], seed: int | str) -> list[list[int]]:
        """``count`` sequences from ``random.Random(seed)``: the same seed gives the same sequences."""
        rng = random.Random(seed)
        return [self.sample(rng, *lengths) for _ in range(count)]


@dataclass
class DyckTask:
    """Everything that defines a Dyck-(k, m) corpus and how WCPA is measured (saved in ``config.json``)."""

    num_types: int = 2
    max_depth: int = 4
    open_probability: float = 0.5
    end_probability: float = 0.5
    train_sequences: int = 2000
    valid_sequences: int = 200
    test_sequences: int = 500
    train_lengths: tuple[int, int] = (20, 100)
    test_lengths: tuple[int, int] = (102, 200)
    seed: int = 1
    positions: str = "closing"

    def __post_init__(self) -> None:
        self.train_lengths, self.test_lengths = tuple(self.train_lengths), tuple(self.test_lengths)
        if self.positions not in POSITIONS:
            raise MoglmError(f"positions must be one of {POSITIONS}, got {self.positions!r}")

    @property
    def language(self) -> DyckLanguage:
        return DyckLanguage(self.num_types, self.max_depth, self.open_probability, self.end_probability)

    def splits(self) -> dict[str, list[list[int]]]:
        """The three splits; each from its own seed, the test split with its own lengths."""
        counts = {"train": self.train_sequences, "valid": self.valid_sequences, "test": self.test_sequences}
        return {s: self.language.sample_many(counts[s], self.test_lengths if s == "test" else self.train_lengths,
                                             f"dyck-{self.seed}-{s}") for s in SPLITS}


def write_corpus(directory: Path, splits: dict[str, list[list[int]]], num_types: int) -> None:
    """``train.txt``, ``valid.txt``, ``test.txt``: one sequence per line, brackets separated by spaces."""
    tokens = bracket_tokens(num_types)
    directory.mkdir(parents=True, exist_ok=True)
    for split, sequences in splits.items():
        atomic_write_text(directory / f"{split}.txt", "".join(" ".join(tokens[b] for b in s) + "\n" for s in sequences))


def read_sequences(path: Path, num_types: int) -> list[list[int]]:
    """Bracket ids of every line of a corpus file written by :func:`write_corpus`."""
    index = {t: i for i, t in enumerate(bracket_tokens(num_types))}
    return [[index[t] for t in line.split()] for line in path.read_text().splitlines() if line.strip()]


def prepare_corpus(task: DyckTask, directory: Path) -> None:
    """Write the task's corpus files into ``directory`` unless they are there already."""
    if not all((directory / f"{s}.txt").is_file() for s in SPLITS):
        write_corpus(directory, task.splits(), task.num_types)
