// The match model's step, compiled (moglm/compression/match.py: MatchModel is its reference twin, and this is
// CompiledMatchModel's arithmetic). Both give the same bits: the hashing is the same uint64 polynomial and
// multiplicative hash, and the few float64 operations (p_hit's ratio and clip, the scale of the other tokens)
// are the same single IEEE operations in the same order; numpy keeps the rows' normalisation (its pairwise
// sum). The state lives in the Python object's numpy arrays, shared with these ops as tensors.
//
// The per-block state: history [B, capacity] int32 (the tokens read), source [B] (the block a pointer names, -1:
// none), position [B] (the predicted token's position there), matched [B] (tokens matched so far); the shared
// state: table [2^bits] int64 (slot -> 1 + block * 2^40 + position; 0: empty), hits and trials [6, 8] float64 per
// (length bin, probability bin); pending [B, 3] int64 (per block: the token it predicted at the last mix, or -1,
// and that prediction's two bins).

#include <torch/library.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace moglm {
namespace {

using i64 = int64_t;

constexpr uint64_t PRIME = 1000003ull;  // hashing.PRIME
constexpr uint64_t GOLDEN = 0x9E3779B97F4A7C15ull;  // hashing._GOLDEN
constexpr i64 LENGTH_EDGES[] = {0, 8, 12, 16, 24, 32};  // match.LENGTH_EDGES
constexpr double PROBABILITY_EDGES[] = {0.0, 1e-3, 1e-2, 0.05, 0.2, 0.5, 0.8, 0.95};  // match.PROBABILITY_EDGES
constexpr i64 LENGTH_BINS = 6, PROBABILITY_BINS = 8;
constexpr i64 LONGEST = 32;  // match.LONGEST
constexpr double P_HIT_LOW = 1e-4, P_HIT_HIGH = 1.0 - 1e-4;  // match.P_HIT_RANGE
constexpr i64 POSITION_BITS = 40;

struct MatchState {
  int32_t* history;
  i64 capacity;
  i64 *source, *position, *matched;
  double *hits, *trials;
  i64* pending;
  i64 B;
};

MatchState state_of(const at::Tensor& history, const at::Tensor& source, const at::Tensor& position,
                    const at::Tensor& matched, const at::Tensor& hits, const at::Tensor& trials,
                    const at::Tensor& pending) {
  const i64 B = history.size(0);
  TORCH_CHECK(history.is_contiguous() && history.scalar_type() == at::kInt && source.size(0) == B &&
                  position.size(0) == B && matched.size(0) == B && pending.size(0) == B && pending.size(1) == 3 &&
                  hits.numel() == LENGTH_BINS * PROBABILITY_BINS && trials.numel() == hits.numel(),
              "moglm match model: inconsistent state");
  for (const at::Tensor& t : {source, position, matched, hits, trials, pending})
    TORCH_CHECK(t.is_contiguous(), "moglm match model: a state tensor is not contiguous");
  return {history.data_ptr<int32_t>(), history.size(1), source.data_ptr<i64>(), position.data_ptr<i64>(),
          matched.data_ptr<i64>(), hits.data_ptr<double>(), trials.data_ptr<double>(), pending.data_ptr<i64>(), B};
}

// hashing.table_slots of the polynomial in PRIME of ``n`` tokens
inline i64 slot_of(const int32_t* tokens, i64 n, int bits) {
  uint64_t key = 0;
  for (i64 j = 0; j < n; ++j) key = key * PRIME + static_cast<uint64_t>(static_cast<int64_t>(tokens[j]));
  return static_cast<i64>((key * GOLDEN) >> (64 - bits));
}

// np.searchsorted(edges, x, side="right") - 1 as numpy indexes with it: a NaN sorts after every edge, and a
// negative probability's -1 indexes the last bin
inline i64 probability_bin(double own) {
  if (std::isnan(own)) return PROBABILITY_BINS - 1;
  i64 n = 0;
  for (i64 j = 0; j < PROBABILITY_BINS; ++j) n += PROBABILITY_EDGES[j] <= own ? 1 : 0;
  return n > 0 ? n - 1 : PROBABILITY_BINS - 1;
}

inline i64 length_bin(i64 matched) {
  i64 n = 0;
  for (i64 j = 0; j < LENGTH_BINS; ++j) n += LENGTH_EDGES[j] <= matched ? 1 : 0;
  return n - 1;
}

// MatchModel.mix after its normalisation: every matched block's predicted token gets its bin's p_hit and the
// others are scaled to 1 - p_hit, in place in ``p`` ([B, V] float64, rows normalised); the predictions go in
// ``pending``. Returns how many blocks have a match.
i64 match_mix(at::Tensor p, const at::Tensor& history, const at::Tensor& source, const at::Tensor& position,
              const at::Tensor& matched, const at::Tensor& hits, const at::Tensor& trials, at::Tensor pending) {
  const MatchState s = state_of(history, source, position, matched, hits, trials, pending);
  TORCH_CHECK(p.is_contiguous() && p.scalar_type() == at::kDouble && p.size(0) == s.B,
              "moglm match model: inconsistent distributions");
  const i64 V = p.size(1);
  double* out = p.data_ptr<double>();
  i64 rows = 0;
  for (i64 b = 0; b < s.B; ++b) {
    i64* pend = s.pending + 3 * b;
    pend[0] = -1;
    if (s.source[b] < 0) continue;
    const i64 token = s.history[s.source[b] * s.capacity + s.position[b]];
    TORCH_CHECK(token >= 0 && token < V, "moglm match model: a predicted token outside the vocabulary");
    double* row = out + b * V;
    const double own = row[token];
    const i64 lb = length_bin(s.matched[b]), pb = probability_bin(own), bin = lb * PROBABILITY_BINS + pb;
    const double hit = std::min(std::max(s.hits[bin] / s.trials[bin], P_HIT_LOW), P_HIT_HIGH);
    const double scale = (1.0 - hit) / std::max(1.0 - own, 1e-12);
    for (i64 v = 0; v < V; ++v) row[v] *= scale;
    row[token] = hit;
    pend[0] = token, pend[1] = lb, pend[2] = pb;
    ++rows;
  }
  return rows;
}

// MatchModel.append for the tokens ``read`` ([B]) as its step ``i`` (the history already has room for column i):
// learn how the pending predictions fared, write the tokens, move the matches that held on and drop the others,
// remember every block's context that just gained its next token, and look up a match for every block without one.
void match_append(const at::Tensor& read, at::Tensor history, i64 i, at::Tensor table, at::Tensor source,
                  at::Tensor position, at::Tensor matched, at::Tensor hits, at::Tensor trials, at::Tensor pending,
                  i64 n, i64 bits) {
  const MatchState s = state_of(history, source, position, matched, hits, trials, pending);
  TORCH_CHECK(read.is_contiguous() && read.scalar_type() == at::kLong && read.size(0) == s.B && i >= 0 &&
                  i < s.capacity && table.is_contiguous() && table.numel() == (i64{1} << bits) && n >= 1 &&
                  n <= LONGEST,
              "moglm match model: inconsistent tokens or table");
  const i64* y = read.data_ptr<i64>();
  i64* slots = table.data_ptr<i64>();
  for (i64 b = 0; b < s.B; ++b) {  // in block order, as np.add.at adds
    const i64* pend = s.pending + 3 * b;
    if (pend[0] < 0) continue;
    const i64 bin = pend[1] * PROBABILITY_BINS + pend[2];
    s.trials[bin] += 1.0;
    s.hits[bin] += y[b] == pend[0] ? 1.0 : 0.0;
  }
  for (i64 b = 0; b < s.B; ++b) {
    s.pending[3 * b] = -1;
    s.history[b * s.capacity + i] = static_cast<int32_t>(y[b]);
  }
  for (i64 b = 0; b < s.B; ++b) {
    if (s.source[b] < 0) continue;
    if (s.history[s.source[b] * s.capacity + s.position[b]] == static_cast<int32_t>(y[b])) {
      ++s.position[b];
      ++s.matched[b];
    } else {
      s.source[b] = -1;
      s.matched[b] = 0;
    }
  }
  if (i >= n)  // every block's context ending at i - 1 is now followed by its token i; a shared slot: the last block's
    for (i64 b = 0; b < s.B; ++b)
      slots[slot_of(s.history + b * s.capacity + i - n, n, static_cast<int>(bits))] = 1 + (b << POSITION_BITS) + i;
  if (i + 1 < n) return;
  for (i64 b = 0; b < s.B; ++b) {  // a new match for every block without one, from its context ending at i
    if (s.source[b] >= 0) continue;
    const i64 entry = slots[slot_of(s.history + b * s.capacity + i + 1 - n, n, static_cast<int>(bits))];
    if (entry <= 0) continue;
    const i64 found = entry - 1, from = found >> POSITION_BITS, at = found & ((i64{1} << POSITION_BITS) - 1);
    if (at < n) continue;
    const int32_t *mine = s.history + b * s.capacity, *theirs = s.history + from * s.capacity;
    i64 same = 0;  // tokens equal back from the end of the contexts, up to LONGEST
    while (same < LONGEST && at - 1 - same >= 0 && i - same >= 0 && mine[i - same] == theirs[at - 1 - same]) ++same;
    if (same < n) continue;  // a hash collision
    s.source[b] = from, s.position[b] = at, s.matched[b] = same;
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(moglm, m) {
  m.def("match_mix(Tensor(a!) p, Tensor history, Tensor source, Tensor position, Tensor matched, Tensor hits, "
        "Tensor trials, Tensor(b!) pending) -> int",
        &match_mix);
  m.def("match_append(Tensor read, Tensor(a!) history, int i, Tensor(b!) table, Tensor(c!) source, "
        "Tensor(d!) position, Tensor(e!) matched, Tensor(f!) hits, Tensor(g!) trials, Tensor(h!) pending, int n, "
        "int bits) -> ()",
        &match_append);
}

}  // namespace moglm
