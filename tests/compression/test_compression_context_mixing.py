"""The context mixer (:mod:`moglm.compression.context_mixing`): the file's own order-k statistics, mixed
geometrically with the model's distribution by weights learnt while coding; and files coded with it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("constriction", reason="the compress extra (constriction) is not installed")

from conftest import coded_round_trip, tiny_format_run  # noqa: E402
from moglm.compression import container, read_header  # noqa: E402
from moglm.compression.context_mixing import (APM_EDGES, COUNT_BINS, KINDS, LINE_WIDTH, MAX_ORDER,  # noqa: E402
                                              MAX_WORD_LENGTH, MIXER_CONTEXTS, SPARSE_CONTEXTS, ContextMixer,
                                              ContextSettings, kinds, letters, map_bins, table_bits)
from moglm.compression.compiled_mixing import CompiledContextMixer, context_mixer, kernel_available  # noqa: E402
from moglm.compression.context_mixing import KERNELS  # noqa: E402
from moglm.dynamic_evaluation import Hyperparameters  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402

V = 7  # the tiny vocabulary of the unit tests


def _needs(kernel: str) -> None:
    if kernel == "compiled" and not kernel_available():
        pytest.skip("the compiled library cannot be built here")


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("byte"), "byte", hidden_size=16)


class ReferenceMixer:
    """The reference twin, a plain loop over blocks, tables, tokens and inputs: each table's counts in a dict
    per row (the row named by the same hash of the block's last k tokens, or of its words), the estimates, the
    weighted sum of their logarithms, and the weights' steps one block after another; with ``mixers``, each
    weight set's mixture on its own, normalised, their weighted sum of logarithms, and every set's step on its
    own code length and the second layer's on the final one, each row stepped by the mean gradient of the blocks
    that share it; with ``sparse``, the tables of the token above and its column, the two above and the last
    token, and the second and third tokens back, from each block's lines kept as lists."""

    def __init__(self, settings: ContextSettings, streams: int, vocab: int, letter_of: list[int],
                 kind_of: list[int], newline: int = -1) -> None:
        self.s, self.streams, self.vocab, self.letter_of, self.kind_of = settings, streams, vocab, letter_of, kind_of
        self.newline = newline  # the token that ends a line (-1: none)
        self.lines = [[[], []] for _ in range(streams)]  # per block: the line before and this one, token + 1 each
        self.last = [KINDS - 1] * streams
        self.before = [vocab] * streams  # each block's last token (vocab: none yet)
        self.corrections = [0.0] * ((vocab + 1) * (len(APM_EDGES) + 1))
        self.bits = table_bits(vocab)
        self.tables = len(settings.orders) + settings.words + len(settings.sparse)
        self.counts = [{} for _ in range(self.tables)]  # per table: row -> [V] counts
        self.recent = [[0] * max(settings.orders[-1], 3) for _ in range(streams)]  # token + 1, 0 before the start
        self.words = [[0, 0] for _ in range(streams)]  # hashes of the current and the previous word
        self.weights = [[1.0 / (self.tables + 1)] * (self.tables + 1)
                        for _ in range((self.tables + 1) * COUNT_BINS * KINDS)]
        self.sets = [{} for _ in settings.mixers]  # per further set: row -> its weights
        self.final = [1.0 / (len(settings.mixers) + 1)] * (len(settings.mixers) + 1)
        self.last2, self.before2, self.length = [KINDS - 1] * streams, [vocab] * streams, [0] * streams

    def set_row(self, name: str, b: int, count_bin: int) -> int:
        if name == "token":
            return self.before[b]
        if name == "order2":
            return self.before[b] * (self.vocab + 1) + self.before2[b]  # (V + 1)^2 rows, fewer than 2^16
        if name == "kinds":
            return (count_bin * KINDS + self.last[b]) * KINDS + self.last2[b]
        return min(self.length[b], MAX_WORD_LENGTH) * KINDS + self.last[b]

    def mixture(self, w, logs):
        mixed = [math.exp(sum(w[j] * logs[j][v] for j in range(len(w)))) for v in range(self.vocab)]
        return [m / sum(mixed) for m in mixed]

    def sparse_key(self, b: int, name: str) -> int:
        m, before, line = 2**64, *self.lines[b]
        column = min(len(line), LINE_WIDTH)

        def above(c: int) -> int:
            return before[c] if c < min(len(before), LINE_WIDTH) else 0

        if name == "above":
            key = (above(column) * 1_000_003 + column) % m
        elif name == "above_pair":
            key = (((above(column) * 1_000_003 + above(column + 1)) % m) * 1_000_003 + self.recent[b][-1]) % m
        else:
            key = (self.recent[b][-2] * 1_000_003 + self.recent[b][-3]) % m
        return (key * 1_000_003 + MAX_ORDER + 3 + SPARSE_CONTEXTS.index(name)) % m

    def row(self, b: int, table: int) -> int:
        m = 2**64
        words_end = len(self.s.orders) + self.s.words
        if table >= words_end:
            key = self.sparse_key(b, self.s.sparse[table - words_end])
        elif table < len(self.s.orders):
            k = self.s.orders[table]
            key = 0
            for token in reversed(self.recent[b][-k:]):  # the most recent first
                key = (key * 1_000_003 + token) % m
            key = (key * 1_000_003 + k) % m
        elif table == len(self.s.orders):
            key = (self.words[b][0] * 1_000_003 + MAX_ORDER + 1) % m
        else:
            key = (((self.words[b][0] * 1_000_003 + self.words[b][1]) % m) * 1_000_003 + MAX_ORDER + 2) % m
        return ((key * 0x9E3779B97F4A7C15) % m) >> (64 - self.bits)

    def mix(self, p: np.ndarray) -> np.ndarray:
        out, self.saved = np.zeros_like(p), []
        for b in range(self.streams):
            base = [x / sum(p[b]) for x in p[b]]
            estimates, totals = [base], []
            for i in range(self.tables):
                n = self.counts[i].get(self.row(b, i), [0] * self.vocab)
                total = sum(n)
                totals.append(total)
                estimates.append([(n[v] + self.s.alpha * base[v]) / (total + self.s.alpha) for v in range(self.vocab)])
            top = max([i + 1 for i, t in enumerate(totals) if t > 0], default=0)
            count_bin = 0 if top == 0 else min(COUNT_BINS - 1, math.floor(math.log2(totals[top - 1] + 1) / 1.5))
            context = (top * COUNT_BINS + count_bin) * KINDS + self.last[b]
            logs = [[math.log(max(q, 1e-300)) for q in estimate] for estimate in estimates]
            rows = [self.set_row(name, b, count_bin) for name in self.s.mixers]
            each = [self.mixture(self.weights[context], logs)]
            for row, weights in zip(rows, self.sets):
                each.append(self.mixture(weights.setdefault(row, [1.0 / len(logs)] * len(logs)), logs))
            if self.s.mixers:
                set_logs = [[math.log(q) for q in one] for one in each]
                mixed = self.mixture(self.final, set_logs)
            else:
                set_logs, mixed = None, each[0]
            cells = None
            if self.s.apm_lr:
                cells = [self.before[b] * (len(APM_EDGES) + 1) + sum(1 for e in APM_EDGES if e < math.log(m))
                         for m in mixed]
                refined = [math.exp(math.log(m) + self.corrections[c]) for m, c in zip(mixed, cells)]
                out[b] = [r / sum(refined) for r in refined]
            else:
                out[b] = mixed
            self.saved.append((context, logs, mixed, cells, out[b].copy(), rows, each, set_logs))
        return out

    def append(self, tokens) -> None:
        steps, final_step = {}, [0.0] * len(self.final)  # with mixers: (set, row) -> (gradient sum, blocks)
        for b, y in enumerate(tokens):
            context, logs, mixed, cells, refined, rows, each, set_logs = self.saved[b]
            if cells is not None:
                for v, cell in enumerate(cells):
                    self.corrections[cell] += self.s.apm_lr * ((v == y) - refined[v])
            if set_logs is None:  # one set: every block's step in turn
                for j in range(len(logs)):
                    expected = sum(mixed[v] * logs[j][v] for v in range(self.vocab))
                    self.weights[context][j] += self.s.lr * (logs[j][y] - expected)
                continue
            for s in range(len(set_logs)):  # the second layer: the mean of the blocks' gradients
                expected = sum(mixed[v] * set_logs[s][v] for v in range(self.vocab))
                final_step[s] += self.s.final_lr * (set_logs[s][y] - expected) / self.streams
            for key, own in zip([(-1, context)] + list(enumerate(rows)), each):  # each set on its own code
                gradient = [logs[j][y] - sum(own[v] * logs[j][v] for v in range(self.vocab)) for j in range(len(logs))]
                total, blocks = steps.get(key, ([0.0] * len(logs), 0))
                steps[key] = ([t + g for t, g in zip(total, gradient)], blocks + 1)
        for (index, row), (total, blocks) in steps.items():  # the blocks that share a row: their mean gradient
            initial = [1.0 / len(total)] * len(total)
            weights = self.weights[row] if index < 0 else self.sets[index].setdefault(row, initial)
            for j, t in enumerate(total):
                weights[j] += self.s.lr * t / blocks
        self.final = [w + d for w, d in zip(self.final, final_step)]
        for b, y in enumerate(tokens):
            for i in range(self.tables):
                self.counts[i].setdefault(self.row(b, i), [0] * self.vocab)[int(y)] += 1
        for b, y in enumerate(tokens):
            self.last2[b], self.before2[b] = self.last[b], self.before[b]
            self.length[b] = self.length[b] + 1 if self.letter_of[int(y)] >= 0 else 0
            self.recent[b] = self.recent[b][1:] + [int(y) + 1]
            self.lines[b] = [self.lines[b][1], []] if int(y) == self.newline else [self.lines[b][0],
                                                                                     self.lines[b][1] + [int(y) + 1]]
            self.last[b] = self.kind_of[int(y)]
            self.before[b] = int(y)
            letter = self.letter_of[int(y)]
            if letter >= 0:
                self.words[b][0] = (self.words[b][0] * 1_000_003 + letter + 1) % 2**64
            elif self.words[b][0]:
                self.words[b] = [0, self.words[b][0]]


CHARS = {0: "a", 1: "B", 2: " ", 3: "b", 4: ".", 5: "\u00e9", 6: "7"}  # token id -> character


def test_letters_fold_case_within_the_vocabulary_and_leave_out_what_is_not_a_letter():
    assert letters(CHARS, V).tolist() == [0, 3, -1, 3, -1, 5, -1]
    assert letters({0: "A"}, 2).tolist() == [0, -1]  # no lower case in the vocabulary: itself


def test_every_token_has_a_kind_for_the_mixers_context():
    assert kinds(CHARS, V).tolist() == [0, 0, 1, 0, 4, 0, 3]
    assert kinds({0: "\n", 1: "\r", 2: "9"}, 4).tolist() == [2, 2, 3, 4]  # token 3 has no character: other


def test_the_maps_bin_is_the_count_of_edges_below_a_log_probability_on_and_between_the_edges():
    rng = np.random.default_rng(0)
    edges = np.arange(-15.0, 1.0)  # [16]: every integer around the edges, on them and just either side
    log_p = np.concatenate([rng.uniform(-30.0, 0.0, 10_000), edges, np.nextafter(edges, -np.inf),
                            np.nextafter(edges, np.inf), [-0.0, -1e-300, -700.0]])
    bins = map_bins(log_p)
    assert bins.dtype == np.int64 and bins.min() == 0 and bins.max() == len(APM_EDGES)
    np.testing.assert_array_equal(bins, np.searchsorted(APM_EDGES, log_p))


LINES = {**CHARS, 4: "\n"}  # the same alphabet with a line break in place of the full stop


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("words, apm_lr, mixers, sparse", [
    (0, 0.0, (), ()), (1, 0.1, (), ()), (2, 0.1, (), ()), (2, 0.1, MIXER_CONTEXTS, ()),
    (0, 0.0, ("kinds", "token"), ()), (2, 0.1, MIXER_CONTEXTS, SPARSE_CONTEXTS), (0, 0.0, (), ("skip",)),
    (1, 0.0, ("word",), ("above_pair", "above"))])
def test_the_mixer_agrees_with_a_plain_loop_at_every_step(words, apm_lr, mixers, sparse, kernel):
    """Random distributions and tokens over a small alphabet with letters and separators (contexts and words
    repeat often, so every mixer context and count bin is met; with sparse contexts the separator is a line break,
    so lines are short and each has one above): every step's mixed distributions equal the reference loop's, and
    so do the weights, every further set's and the second layer's, with numpy's arithmetic and the compiled
    kernel's (which takes the logarithms of the counted tokens' estimates alone, with its own exp and log)."""
    _needs(kernel)
    rng = np.random.default_rng(words + 10 * len(sparse))
    settings = ContextSettings(orders=(1, 2, 4) if sparse != ("skip",) else (1,), words=words, alpha=0.7, lr=0.05,
                               apm_lr=apm_lr, mixers=mixers, final_lr=0.02, sparse=sparse, kernel=kernel)
    chars = LINES if sparse else CHARS
    fast = context_mixer(settings, 3, V, chars)
    assert isinstance(fast, CompiledContextMixer) == (kernel == "compiled")
    slow = ReferenceMixer(settings, 3, V, letters(chars, V).tolist(), kinds(chars, V).tolist(), 4 if sparse else -1)
    for _ in range(150):
        p = rng.random((3, V)) + 0.01
        np.testing.assert_allclose(fast.mix(p), slow.mix(p), rtol=1e-12, atol=1e-15)
        tokens = rng.choice([0, 1, 2, 3, 4, 6], 3, p=[0.3, 0.15, 0.2, 0.2, 0.1, 0.05])
        fast.append(tokens)
        slow.append(tokens)
    np.testing.assert_allclose(fast._weights, np.array(slow.weights), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(fast._corrections, slow.corrections, rtol=1e-12, atol=1e-15)
    assert (np.count_nonzero(fast._corrections) > 20) == (apm_lr > 0)
    for weights, rows in zip(fast._sets, slow.sets):
        assert len(rows) > 3
        initial = np.full(weights.shape[1], 1.0 / weights.shape[1])
        for row in range(len(weights)):
            np.testing.assert_allclose(weights[row], rows.get(row, initial), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(fast._final, slow.final, rtol=1e-12, atol=1e-15)
    assert (abs(fast._final - fast._final[0]).max() > 1e-3) == bool(mixers)
    assert len({c for c in range(len(slow.weights)) if slow.weights[c] != slow.weights[-1]}) > 5


def test_a_repeated_pattern_is_learnt_well_beyond_a_uniform_model():
    mixer = ContextMixer(ContextSettings(), 2, V, CHARS)
    cycle = [0, 3, 1, 4, 1, 5]
    right = []
    for t in range(300):
        p = mixer.mix(np.ones((2, V)))
        right.append(p[0, cycle[t % 6]])
        mixer.append(np.array([cycle[t % 6], cycle[(t + 2) % 6]]))
    assert right[0] == pytest.approx(1 / V) and min(right[-30:]) > 0.9
    assert np.allclose(p.sum(axis=1), 1.0)


def test_the_weights_learn_to_keep_a_model_that_is_already_right():
    """Tokens drawn from the model's own skewed distribution: the counts only add noise, and over 3,000 steps the
    mixed code is within 3% of the model's own (the entropy)."""
    rng = np.random.default_rng(1)
    truth = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.02])
    mixer = ContextMixer(ContextSettings(), 4, V, CHARS)
    mixed_bits = model_bits = 0.0
    for _ in range(3000):
        p = mixer.mix(np.tile(truth, (4, 1)))
        tokens = rng.choice(V, 4, p=truth)
        mixed_bits -= np.log2(p[np.arange(4), tokens]).sum()
        model_bits -= np.log2(truth[tokens]).sum()
        mixer.append(tokens)
    assert mixed_bits < 1.03 * model_bits


def test_the_previous_word_predicts_past_what_the_orders_see():
    """Two-letter words of a and b, each followed by a space and starting with the letter that ended the word
    before: an order-1 context sees only the space, the word context with the previous word sees that letter."""
    rng = np.random.default_rng(4)
    first_letter = {}
    for words in (0, 2):
        mixer = ContextMixer(ContextSettings(orders=(1,), words=words), 1, V, CHARS)
        probabilities, last = [], 0
        for _ in range(200):
            word = [last, int(rng.choice([0, 3]))]  # tokens 0 and 3 are a and b
            for position, token in enumerate(word + [2]):
                p = mixer.mix(np.ones((1, V)))
                if position == 0:
                    probabilities.append(p[0, token])
                mixer.append(np.array([token]))
            last = word[-1]
        first_letter[words] = np.mean(probabilities[-20:])
    assert first_letter[2] > 0.85 and first_letter[0] < 0.6, first_letter


@pytest.mark.parametrize("sparse", [(), ("above",)])
def test_the_token_above_predicts_a_line_that_repeats_the_one_before(sparse):
    """Lines of six random letters, each line the one before it: order 1 sees a random letter, the token above
    (same column, line before) is the answer."""
    rng = np.random.default_rng(6)
    mixer = ContextMixer(ContextSettings(orders=(1,), words=0, sparse=sparse), 1, V, LINES)
    right = []
    for _ in range(40):
        line = [int(t) for t in rng.choice([0, 1, 3, 5], 6)] if not right else line
        for token in line + [4]:  # 4: a line break
            right.append(mixer.mix(np.ones((1, V)))[0, token])
            mixer.append(np.array([token]))
    late = np.mean(right[-70:])
    assert (late > 0.8) if sparse else (late < 0.6), late


@pytest.mark.parametrize("sparse", [(), ("skip",)])
def test_the_tokens_two_and_three_back_predict_past_a_random_one_in_between(sparse):
    """Triplets (a, noise, f(a)): before f(a) the last token is noise, the skip context (a and the token before it)
    predicts it."""
    rng = np.random.default_rng(7)
    mixer = ContextMixer(ContextSettings(orders=(1,), words=0, sparse=sparse), 1, V, CHARS)
    follows, right = {0: 3, 1: 5, 6: 0}, []
    for _ in range(300):
        a, noise = int(rng.choice([0, 1, 6])), int(rng.choice([2, 4]))
        for position, token in enumerate((a, noise, follows[a])):
            p = mixer.mix(np.ones((1, V)))
            if position == 2:
                right.append(p[0, token])
            mixer.append(np.array([token]))
    late = np.mean(right[-50:])
    assert (late > 0.8) if sparse else (late < 0.6), late


def test_only_the_vocabularys_line_feed_ends_a_line_and_ids_outside_it_are_ignored():
    """As for the letters and kinds: a character of an id outside the vocabulary is ignored, and a carriage return
    does not end a line (a CRLF file would otherwise have an empty line above every line)."""
    mixer = ContextMixer(ContextSettings(orders=(1,), words=0, sparse=("above",)), 1, V,
                         {**LINES, 2: "\r", V: "\n", -1: "\n"})
    assert mixer._newline.tolist() == [False, False, False, False, True, False, False]


def test_a_line_longer_than_the_width_has_nothing_above_past_it():
    """Columns from LINE_WIDTH on are not remembered: a block's column keeps counting, its line stops growing, and
    what it reads there leaves the line kept for the next one as it was."""
    mixer = ContextMixer(ContextSettings(orders=(1,), words=0, sparse=("above",)), 1, V, LINES)
    for t in range(LINE_WIDTH + 10):
        mixer.mix(np.ones((1, V)))
        mixer.append(np.array([t % 2]))
    assert mixer._column.tolist() == [LINE_WIDTH + 10] and mixer._line[0, LINE_WIDTH] == 0
    mixer.mix(np.ones((1, V)))
    mixer.append(np.array([4]))
    assert mixer._column.tolist() == [0] and mixer._line.sum() == 0
    assert mixer._above[0, :LINE_WIDTH].tolist() == [t % 2 + 1 for t in range(LINE_WIDTH)]


def test_without_characters_no_token_is_a_letter_and_the_word_contexts_stay_empty():
    mixer = ContextMixer(ContextSettings(orders=(1,), words=2), 1, V)
    for token in [0, 1, 2, 3]:
        mixer.mix(np.ones((1, V)))
        mixer.append(np.array([token]))
    assert mixer._word.tolist() == [[0, 0]] and mixer._last.tolist() == [KINDS - 1]


@pytest.mark.parametrize("kernel", KERNELS)
def test_blocks_share_their_statistics_and_the_tables_fit_their_bounds(kernel):
    _needs(kernel)
    """What block 0 read teaches block 1: after block 0 reads 2 6 2 6 ..., block 1's first 2 predicts 6."""
    mixer = context_mixer(ContextSettings(kernel=kernel, orders=(1,), words=0), 2, V)
    for t in range(40):
        mixer.mix(np.ones((2, V)))
        mixer.append(np.array([[2, 6][t % 2], 0]))
    mixer.mix(np.ones((2, V)))
    mixer.append(np.array([2, 2]))
    p = mixer.mix(np.ones((2, V)))
    assert p[1].argmax() == 6 and p[1, 6] > 0.5
    assert table_bits(256) == 16 and table_bits(7) == 16 and table_bits(10**6) == 8
    assert mixer._tables[0].shape == (1 << 16, V) and mixer._tables[0].dtype == np.uint16


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_count_that_would_overflow_halves_its_row(kernel):
    _needs(kernel)
    mixer = context_mixer(ContextSettings(kernel=kernel, orders=(1,), words=0), 1, V)
    for _ in range(3):
        mixer.mix(np.ones((1, V)))
        mixer.append(np.array([3]))
    row = mixer._rows()[0][0]
    mixer._tables[0][row, 3] = np.iinfo(np.uint16).max - 1
    mixer._tables[0][row, 5] = 9
    mixer.mix(np.ones((1, V)))
    mixer.append(np.array([3]))
    assert mixer._tables[0][row, 3] == (np.iinfo(np.uint16).max - 1) // 2 + 1 and mixer._tables[0][row, 5] == 4


@pytest.mark.parametrize("kernel", KERNELS)
def test_more_blocks_than_a_count_can_hold_never_wrap_a_count(kernel):
    _needs(kernel)
    """40,000 blocks reading the same token in the same context: a cell gains at most 32,767 a step, and is halved
    before it could pass 65,535 (uint16 would wrap silently)."""
    blocks = 40_000
    mixer = context_mixer(ContextSettings(kernel=kernel, orders=(1,), words=0, apm_lr=0.0), blocks, V)
    for _ in range(6):
        mixer.mix(np.ones((blocks, V)))
        mixer.append(np.zeros(blocks, dtype=np.int64))
    row = mixer._rows()[0, 0]
    assert mixer._tables[0][row, 0] == np.iinfo(np.uint16).max // 2 * 2


@pytest.mark.parametrize("bad", [{"orders": ()}, {"orders": (2, 1)}, {"orders": (1, 1)}, {"orders": (0, 1)},
                                 {"orders": (1, 17)}, {"orders": tuple(range(1, 10))}, {"orders": (1.5,)},
                                 {"orders": "12"}, {"alpha": 0}, {"alpha": -1}, {"alpha": float("nan")},
                                 {"lr": -1e-3}, {"lr": 2.0}, {"lr": True}, {"words": 3}, {"words": -1},
                                 {"words": 1.0}, {"words": False}, {"apm_lr": -0.1}, {"apm_lr": 1.5},
                                 {"mixers": ("token", "token")}, {"mixers": ("order3",)}, {"mixers": "token"},
                                 {"final_lr": -1.0}, {"final_lr": "0.1"}, {"sparse": ("skip", "skip")},
                                 {"sparse": ("column",)}, {"sparse": "skip"}, {"sparse": [["skip"]]}])
def test_bad_settings_are_one_line_errors(bad):
    with pytest.raises(MoglmError, match="context"):
        ContextSettings(**bad)


def test_settings_read_back_from_json_as_they_were():
    settings = ContextSettings(orders=(1, 3), words=1, alpha=2, lr=0.0, apm_lr=0.5, mixers=("word", "token"),
                               sparse=("skip", "above"))
    assert ContextSettings(**json.loads(json.dumps(vars(settings)))) == settings


@pytest.mark.parametrize("hp", [None, Hyperparameters(rule="sgd", lr=0.3, segment_length=5)],
                         ids=["static", "dynamic"])
def test_text_with_its_own_vocabulary_codes_smaller_with_the_mixer_and_round_trips(byte_run, hp):
    """Words of a made-up vocabulary in random order, eight blocks: the tiny model never saw them, the counts
    learn their spellings; the header records the settings."""
    rng = np.random.default_rng(2)
    words = [b"zqx", b"vrbol", b"kw", b"jjyup", b"ohmz"]
    data = b" ".join(words[i] for i in rng.integers(0, len(words), 150))[:512]
    with_mixer, mixed = coded_round_trip(byte_run, data, hp, contexts=ContextSettings())
    without, plain = coded_round_trip(byte_run, data, hp, contexts=None)
    assert mixed.blocks == plain.blocks == 8
    assert mixed.model_bits < 0.8 * plain.model_bits
    recorded = {"orders": [1, 2, 3, 4, 6], "words": 2, "alpha": 0.25, "lr": 0.001, "apm_lr": 0.02, "mixers": [],
                "final_lr": 0.005, "sparse": [], "kernel": "numpy"}  # the dataclass's own: one set, no sparse contexts
    assert read_header(with_mixer)[0]["contexts"] == recorded and read_header(without)[0]["contexts"] is None
    assert ContextSettings(**mixed.contexts) == ContextSettings() and plain.contexts is None


def test_a_header_before_version_7_has_no_mixer_and_one_of_version_7_must_say():
    header = {"run": "r", "factor": 1.0, "adapt": None, "adapt_digest": None, "cache": None, "match": None,
              "tokens": 3, "bytes": 3, "sha256": "", "blocks": 1, "block_size": 4096, "threads": 1, "gaps": False}
    assert container._parse_header(json.dumps(header).encode(), "f", 6)["contexts"] is None
    with pytest.raises(MoglmError, match="damaged header"):
        container._parse_header(json.dumps(header).encode(), "f", 7)
    assert container._parse_header(json.dumps({**header, "contexts": None}).encode(), "f", 7)["contexts"] is None
    older = {k: v for k, v in header.items() if k not in ("cache", "match")}
    assert container._parse_header(json.dumps(older).encode(), "f", 2)["match"] is None
    with pytest.raises(MoglmError, match="damaged header"):
        container._parse_header(json.dumps(older).encode(), "f", 6)


@pytest.mark.parametrize("hp", [None, Hyperparameters(rule="sgd", lr=0.3, segment_length=5)],
                         ids=["static", "dynamic"])
def test_the_default_mixer_of_five_weight_sets_and_sparse_contexts_round_trips_and_is_recorded(byte_run, hp):
    from moglm.compression.run import CONTEXTS

    assert CONTEXTS.mixers == MIXER_CONTEXTS and CONTEXTS.sparse == SPARSE_CONTEXTS
    data = b"the mixer's weight sets,\n  chosen by their own contexts;\n" * 12
    blob, report = coded_round_trip(byte_run, data, hp, contexts=CONTEXTS)
    assert read_header(blob)[0]["contexts"]["mixers"] == list(MIXER_CONTEXTS)
    assert read_header(blob)[0]["contexts"]["sparse"] == list(SPARSE_CONTEXTS)
    assert ContextSettings(**report.contexts) == CONTEXTS


@pytest.mark.parametrize("version, mixers, sparse, dropped, data", [
    (8, (), (), ("mixers", "final_lr", "sparse", "kernel"), b"one set of weights, as version 8 mixed. " * 10),
    (9, MIXER_CONTEXTS, (), ("sparse", "kernel"),
     b"five sets of weights and no sparse contexts,\nas version 9 mixed.\n" * 6),
    (10, MIXER_CONTEXTS, SPARSE_CONTEXTS, ("kernel",),
     b"The numpy arithmetic,\n  as version 10 mixed.\n" * 8)], ids=["8", "9", "10"])
def test_an_older_files_header_reads_as_its_mixer_was_and_decodes(byte_run, version, mixers, sparse, dropped, data):
    """A header of an older version leaves out the context settings later versions added: version 8's has no
    ``mixers`` or ``final_lr`` (one set, no second layer), version 9's no ``sparse`` (none), version 10's no
    ``kernel`` (numpy's arithmetic). Each reads as its mixer was, so a file coded that way decodes; a header of
    this version without those fields is damaged."""
    from dataclasses import replace

    from moglm.compression import decompress
    from moglm.runs.language_model import load_run

    from test_compression import forged

    settings = ContextSettings(mixers=mixers, sparse=sparse)
    blob, _ = coded_round_trip(byte_run, data, contexts=settings)
    old = {k: v for k, v in read_header(blob)[0]["contexts"].items() if k not in dropped}
    older = forged(blob, version=version, contexts=old, drop=("path",))  # before version 12: auto's own path
    read = ContextSettings(**read_header(older)[0]["contexts"])
    assert older[6] == version and read == (replace(settings, final_lr=0.0) if version == 8 else settings)
    trained = load_run(byte_run)
    assert decompress(older, trained.model, trained.vocab, progress=False) == data
    with pytest.raises(MoglmError, match="contexts settings are not settings"):
        decompress(forged(blob, contexts=old), trained.model, trained.vocab, progress=False)


def test_many_blocks_that_share_the_weights_rows_learn_as_one_block_does():
    """The blocks that share a row of the further sets (and every block the second layer) step it by their mean
    gradient: 128 blocks reading the same noisy text code each token about as one block does (a sum of their
    steps, 128 times one block's, ran away on a file of 121 blocks; here its second layer's weights pass 100)."""
    rng = np.random.default_rng(5)
    text = [int(t) for t in rng.choice([0, 1, 2, 3, 4, 6], 600, p=[0.3, 0.15, 0.2, 0.2, 0.1, 0.05])]
    model = np.array([0.2, 0.1, 0.2, 0.2, 0.1, 0.1, 0.1])
    settings = ContextSettings(lr=4e-3, apm_lr=0.0, mixers=MIXER_CONTEXTS, final_lr=5e-3)  # the weights alone
    bits = {}
    for blocks in (1, 128):
        mixer, total = ContextMixer(settings, blocks, V, CHARS), 0.0
        for token in text:
            p = mixer.mix(np.tile(model, (blocks, 1)))
            total -= np.log2(p[0, token])
            mixer.append(np.full(blocks, token))
        bits[blocks] = total / len(text)
        assert np.isfinite(mixer._final).all() and abs(mixer._final).max() < 5
    assert bits[128] < 1.1 * bits[1], bits
