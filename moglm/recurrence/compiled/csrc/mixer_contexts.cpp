// The context mixer's contexts per step, compiled (moglm/compression/compiled_mixing.py; the numpy mixer's
// ContextMixer._rows, _chosen_rows and _move_on, in moglm/compression/context_mixing.py, are the reference twin):
// hashing every table's row for every block, choosing every weight set's row, and moving every block's
// contexts on after the tokens read. Integer arithmetic only, so both give the same bits; the count bin's
// floor(log2(N + 1) / 1.5) is its integer thresholds (tests/compression/test_compression_compiled_mixing.py).
//
// The state is the numpy mixer's arrays, shared as tensors and updated in place: recent [B, k] (token + 1, 0 before
// the start; uint64 viewed as int64), word [B, 2] (the hashes of the current and the previous word), column [B],
// line and above [B, W + 1] (this line's and the line before's token + 1 by column), and per block the kinds of
// the last two tokens, the last two tokens (V: none yet) and the current word's length ("recent" below).

#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace moglm {
namespace {

using i64 = int64_t;
using u64 = uint64_t;

constexpr u64 PRIME = 1000003ull;  // hashing.PRIME
constexpr u64 GOLDEN = 0x9E3779B97F4A7C15ull;  // hashing._GOLDEN
constexpr u64 MAX_ORDER = 16;  // context_mixing.MAX_ORDER: the tags of the word and sparse contexts follow it
constexpr i64 LINE_WIDTH = 256;  // context_mixing.LINE_WIDTH
constexpr i64 COUNT_BINS = 4, KINDS = 5, MAX_WORD_LENGTH = 15;  // context_mixing's
enum Sparse : i64 { ABOVE = 0, ABOVE_PAIR = 1, SKIP = 2 };  // context_mixing.SPARSE_CONTEXTS
enum Mixer : i64 { TOKEN = 0, ORDER2 = 1, KIND_PAIR = 2, WORD = 3 };  // context_mixing.MIXER_CONTEXTS

inline u64* words_of(const at::Tensor& t) { return reinterpret_cast<u64*>(t.data_ptr<i64>()); }

void check(const at::Tensor& t, i64 B, const char* what) {
  TORCH_CHECK(t.is_contiguous() && t.scalar_type() == at::kLong && t.size(0) == B,
              "moglm context mixer: inconsistent ", what);
}

// [K, B]: each table's row for every block's context (ContextMixer._rows): its last k tokens (a polynomial from
// the most recent back) hashed with k for every order, then the current word, then it and the previous word,
// then the sparse contexts, each key times PRIME plus its tag, multiplicatively hashed to ``bits`` bits.
at::Tensor context_rows(const at::Tensor& recent, const at::Tensor& word, const at::Tensor& column,
                        const at::Tensor& above, at::IntArrayRef orders, i64 words, at::IntArrayRef sparse, i64 bits) {
  const i64 B = recent.size(0), history = recent.size(1), longest = orders.back();
  check(recent, B, "recent tokens");
  check(word, B, "words");
  check(column, B, "columns");
  check(above, B, "lines above");
  const bool skip = std::find(sparse.begin(), sparse.end(), i64{SKIP}) != sparse.end();
  TORCH_CHECK(longest <= history && history >= (skip ? 3 : 1) && above.size(1) == LINE_WIDTH + 1 && bits >= 1 &&
                  bits <= 63,
              "moglm context mixer: inconsistent contexts");
  const i64 K = static_cast<i64>(orders.size()) + words + static_cast<i64>(sparse.size());
  at::Tensor rows = at::empty({K, B}, recent.options());
  i64* out = rows.data_ptr<i64>();
  const u64 *r = words_of(recent), *w = words_of(word), *up = words_of(above);
  const i64* col = column.data_ptr<i64>();
  const int shift = static_cast<int>(64 - bits);
  for (i64 b = 0; b < B; ++b) {
    const u64* mine = r + b * history;
    i64 k = 0;
    u64 suffix = 0;
    for (i64 j = 1, o = 0; j <= longest; ++j) {
      suffix = suffix * PRIME + mine[history - j];
      if (orders[o] == j) {
        out[k++ * B + b] = static_cast<i64>(((suffix * PRIME + static_cast<u64>(j)) * GOLDEN) >> shift);
        ++o;
      }
    }
    const u64 current = w[2 * b], previous = w[2 * b + 1];
    if (words >= 1) out[k++ * B + b] = static_cast<i64>(((current * PRIME + (MAX_ORDER + 1)) * GOLDEN) >> shift);
    if (words >= 2)
      out[k++ * B + b] =
          static_cast<i64>((((current * PRIME + previous) * PRIME + (MAX_ORDER + 2)) * GOLDEN) >> shift);
    const i64 c = std::min(col[b], LINE_WIDTH);
    const u64 over = up[b * (LINE_WIDTH + 1) + c];
    for (const i64 name : sparse) {
      u64 key;
      if (name == ABOVE) {
        key = over * PRIME + static_cast<u64>(c);
      } else if (name == ABOVE_PAIR) {
        const u64 next = up[b * (LINE_WIDTH + 1) + std::min(c + 1, LINE_WIDTH)];
        key = (over * PRIME + next) * PRIME + mine[history - 1];
      } else {
        key = mine[history - 2] * PRIME + mine[history - 3];
      }
      const u64 tag = MAX_ORDER + 3 + static_cast<u64>(name);
      out[k++ * B + b] = static_cast<i64>(((key * PRIME + tag) * GOLDEN) >> shift);
    }
  }
  return rows;
}

// min(COUNT_BINS - 1, floor(log2(N + 1) / 1.5)) by its thresholds: N + 1 below 2^1.5, 2^3, 2^4.5
inline i64 count_bin(i64 N) { return N <= 1 ? 0 : N <= 6 ? 1 : N <= 21 ? 2 : 3; }

// [S, B]: the row of every weight set that each block's context chooses (ContextMixer._chosen_rows; ``totals``
// [K, B] each table's count in the block's row; ``recent`` [5, B]: the kinds of the last two tokens, the last
// two tokens, the word's length; ``sizes``: each further set's rows), and ``gathered`` [S, B, M] those rows of
// the ``weights``.
at::Tensor context_choose(const at::Tensor& totals, const at::Tensor& recent, at::IntArrayRef mixers,
                          at::IntArrayRef sizes, i64 vocab, at::TensorList weights, at::Tensor gathered) {
  const i64 K = totals.size(0), B = totals.size(1), S = static_cast<i64>(mixers.size()) + 1;
  TORCH_CHECK(totals.is_contiguous() && recent.is_contiguous() && recent.size(0) == 5 && recent.size(1) == B &&
                  static_cast<i64>(weights.size()) == S && static_cast<i64>(sizes.size()) == S - 1 &&
                  gathered.is_contiguous() && gathered.size(0) == S && gathered.size(1) == B,
              "moglm context mixer: inconsistent choice of weights");
  const i64 M = gathered.size(2);
  for (const at::Tensor& w : weights)
    TORCH_CHECK(w.is_contiguous() && w.size(1) == M, "moglm context mixer: inconsistent weights");
  at::Tensor chosen = at::empty({S, B}, totals.options());
  i64* out = chosen.data_ptr<i64>();
  const i64 *total = totals.data_ptr<i64>(), *last = recent.data_ptr<i64>(), *last2 = last + B,
            *before = last + 2 * B, *before2 = last + 3 * B, *length = last + 4 * B;
  for (i64 b = 0; b < B; ++b) {
    i64 top = 0;  // the last table (1-based) whose row has counts, 0: none
    for (i64 k = K - 1; k >= 0 && top == 0; --k)
      if (total[k * B + b] > 0) top = k + 1;
    const i64 bin = count_bin(top > 0 ? total[(top - 1) * B + b] : 0);
    out[b] = (top * COUNT_BINS + bin) * KINDS + last[b];
    for (i64 s = 1; s < S; ++s) {
      const i64 name = mixers[s - 1];
      i64 row;
      if (name == TOKEN) row = before[b];
      else if (name == ORDER2) row = (before[b] * (vocab + 1) + before2[b]) % sizes[s - 1];
      else if (name == KIND_PAIR) row = (bin * KINDS + last[b]) * KINDS + last2[b];
      else row = std::min(length[b], MAX_WORD_LENGTH) * KINDS + last[b];
      out[s * B + b] = row;
    }
  }
  double* g = gathered.data_ptr<double>();
  for (i64 s = 0; s < S; ++s) {
    const double* w = weights[s].data_ptr<double>();
    const i64 rows = weights[s].size(0);
    for (i64 b = 0; b < B; ++b) {
      const i64 row = out[s * B + b];
      TORCH_CHECK(row >= 0 && row < rows, "moglm context mixer: a weight row outside the weights");
      std::copy(w + row * M, w + (row + 1) * M, g + (s * B + b) * M);
    }
  }
  return chosen;
}

// Every block's contexts after the tokens ``read`` ([B]; ContextMixer._move_on), in place: its last tokens, the
// kinds and tokens before, the current line (with ``sparse``) and the words; ``newline``, ``kinds`` and
// ``letters`` [V] say what each token is (a line's end; its kind; its letter, -1 for none).
void context_move_on(const at::Tensor& read, at::Tensor recent_tokens, at::Tensor recent, at::Tensor column,
                     at::Tensor line, at::Tensor above, at::Tensor word, const at::Tensor& newline,
                     const at::Tensor& kinds, const at::Tensor& letters, bool sparse, bool words) {
  const i64 B = read.size(0), history = recent_tokens.size(1), V = kinds.size(0);
  check(read, B, "tokens");
  check(recent_tokens, B, "recent tokens");
  check(column, B, "columns");
  check(line, B, "lines");
  check(above, B, "lines above");
  check(word, B, "words");
  TORCH_CHECK(recent.is_contiguous() && recent.size(0) == 5 && recent.size(1) == B && newline.size(0) == V &&
                  letters.size(0) == V && newline.scalar_type() == at::kBool,
              "moglm context mixer: inconsistent contexts");
  const i64 *y = read.data_ptr<i64>(), *kind = kinds.data_ptr<i64>(), *letter = letters.data_ptr<i64>();
  const bool* ends = newline.data_ptr<bool>();
  u64 *r = words_of(recent_tokens), *ln = words_of(line), *up = words_of(above), *w = words_of(word);
  i64 *last = recent.data_ptr<i64>(), *last2 = last + B, *before = last + 2 * B, *before2 = last + 3 * B,
      *length = last + 4 * B, *col = column.data_ptr<i64>();
  for (i64 b = 0; b < B; ++b) {
    const i64 token = y[b];
    TORCH_CHECK(token >= 0 && token < V, "moglm context mixer: a token outside the vocabulary");
    u64* mine = r + b * history;
    std::copy(mine + 1, mine + history, mine);
    mine[history - 1] = static_cast<u64>(token + 1);
    last2[b] = last[b], before2[b] = before[b];
    if (sparse) {
      u64 *now = ln + b * (LINE_WIDTH + 1), *prior = up + b * (LINE_WIDTH + 1);
      if (ends[token]) {
        std::copy(now, now + LINE_WIDTH + 1, prior);
        std::fill(now, now + LINE_WIDTH + 1, 0);
        col[b] = 0;
      } else {
        if (col[b] < LINE_WIDTH) now[col[b]] = static_cast<u64>(token + 1);
        ++col[b];
      }
    }
    last[b] = kind[token];
    before[b] = token;
    const i64 l = letter[token];
    length[b] = l >= 0 ? length[b] + 1 : 0;
    if (words) {
      u64 &current = w[2 * b], &previous = w[2 * b + 1];
      if (l >= 0) {
        current = current * PRIME + static_cast<u64>(l + 1);
      } else if (current != 0) {  // a word just ended
        previous = current;
        current = 0;
      }
    }
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(moglm, m) {
  m.def("context_rows(Tensor recent, Tensor word, Tensor column, Tensor above, int[] orders, int words, "
        "int[] sparse, int bits) -> Tensor",
        &context_rows);
  m.def("context_choose(Tensor totals, Tensor recent, int[] mixers, int[] sizes, int vocab, Tensor[] weights, "
        "Tensor(a!) gathered) -> Tensor",
        &context_choose);
  m.def("context_move_on(Tensor read, Tensor(a!) recent_tokens, Tensor(b!) recent, Tensor(c!) column, "
        "Tensor(d!) line, Tensor(e!) above, Tensor(f!) word, Tensor newline, Tensor kinds, Tensor letters, "
        "bool sparse, bool words) -> ()",
        &context_move_on);
}

}  // namespace moglm
