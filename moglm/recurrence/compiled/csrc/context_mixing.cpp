// The context mixer's arithmetic per step, compiled (moglm/compression/compiled_mixing.py; the plain numpy
// mixer, moglm/compression/context_mixing.py, is its reference twin and the arithmetic of files of version 10
// and older).
//
// For one block, with p its model distribution (normalised), lp = log p, and table k's row of counts n_k
// (N_k in all), the estimate q_k = (n_k + alpha p) / (N_k + alpha) is, where n_k(v) = 0, p(v) times a constant:
// log q_k(v) = lp(v) + c_k with c_k = log(alpha / (N_k + alpha)). So only the few tokens a row has counted need a
// logarithm of their own: D_k(v) = log q_k(v) - lp(v) - c_k, nonzero where n_k(v) > 0. A weight set w then mixes
//
//     L(v) = sum_m w_m log q_m(v) = (sum_m w_m) lp(v) + sum_k w_{k+1} D_k(v) + const,
//
// and the constant cancels when L is normalised (log-sum-exp). Its gradient on the token y read,
// log q_m(y) - E_{exp L}[log q_m], loses c_k the same way: lp(y) + D_k(y) - E[lp] - E[D_k]. Per block and step
// that is V logarithms, a few more, and S x V multiply-adds and exponentials, where the numpy mixer takes the
// logarithm of every estimate ((K + 1) x V) and mixes every input in full. Both sides of a file run this same
// code, with the header's threads (the blocks are shared out between them; each block's arithmetic is the same
// whichever thread runs it). exp and log are written out here (branch-free polynomials that the compiler
// vectorises), so they round the same whatever the C library.

#include "window.h"  // MOGLM_HAS_MXCSR, ready_threads

#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace moglm {
namespace {

using i64 = int64_t;

constexpr double TINY = 1e-300;  // the numpy mixer's floor of a probability before its logarithm
constexpr double SHIFTER = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer held in the low bits
constexpr double LOG2E = 1.4426950408889634;
constexpr double LN2_HI = 0.6931471803691238;  // ln 2 to 32 bits: n * LN2_HI is exact for |n| < 2^21
constexpr double LN2_LO = 1.9082149292705877e-10;
constexpr i64 APM_BINS = 12;
constexpr size_t WORK = 9;  // the workspace's tensors (made by compiled_mixing.py; context_mix says what each holds)

inline uint64_t bits_of(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

inline double from_bits(uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// e^x to about 1 ulp; 0 below -708 (where e^x leaves the normal doubles). Branch-free.
inline double exp_d(double x) {
  const double c = std::min(std::max(x, -708.0), 709.0);
  const double t = c * LOG2E + SHIFTER;
  const double n = t - SHIFTER;  // round(c / ln 2), in [-1022, 1023]
  const double r = (c - n * LN2_HI) - n * LN2_LO;  // |r| <= ln(2) / 2
  double q = 1.0 / 6227020800.0;  // Taylor to r^13: the remainder is below 2^-60 on |r| <= 0.35
  q = q * r + 1.0 / 479001600.0;
  q = q * r + 1.0 / 39916800.0;
  q = q * r + 1.0 / 3628800.0;
  q = q * r + 1.0 / 362880.0;
  q = q * r + 1.0 / 40320.0;
  q = q * r + 1.0 / 5040.0;
  q = q * r + 1.0 / 720.0;
  q = q * r + 1.0 / 120.0;
  q = q * r + 1.0 / 24.0;
  q = q * r + 1.0 / 6.0;
  q = q * r + 0.5;
  q = q * r + 1.0;
  q = q * r + 1.0;
  const uint64_t scale = (bits_of(t) - bits_of(SHIFTER) + 1023) << 52;  // 2^n
  const double y = q * from_bits(scale);
  return x < -708.0 ? 0.0 : y;
}

// log x for a normal, finite x > 0, to about 1 ulp: x = 2^e m with m in [sqrt(2)/2, sqrt(2)), and
// log m = 2 atanh(s), s = (m - 1) / (m + 1), as its odd series to s^21 (|s| <= 0.172). Branch-free.
inline double log_d(double x) {
  const uint64_t u = bits_of(x);
  const uint64_t mantissa = (u & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull;  // m in [1, 2)
  double m = from_bits(mantissa);
  const bool high = m > 1.4142135623730951;
  m = high ? 0.5 * m : m;
  const double e = from_bits(bits_of(SHIFTER) + (u >> 52) - 1023 + (high ? 1 : 0)) - SHIFTER;
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double q = 1.0 / 21.0;
  q = q * z + 1.0 / 19.0;
  q = q * z + 1.0 / 17.0;
  q = q * z + 1.0 / 15.0;
  q = q * z + 1.0 / 13.0;
  q = q * z + 1.0 / 11.0;
  q = q * z + 1.0 / 9.0;
  q = q * z + 1.0 / 7.0;
  q = q * z + 1.0 / 5.0;
  q = q * z + 1.0 / 3.0;
  const double atanh2 = 2.0 * s + 2.0 * s * (z * q);
  return e * LN2_HI + (e * LN2_LO + atanh2);
}

// Sums, dot products and maxima over a row in LANES interleaved partial results, combined in a fixed order: a
// plain loop's one accumulator is a chain the compiler may not reorder (without -ffast-math), so it would not
// vectorise; these do, and round the same on every call.
constexpr i64 LANES = 8;

inline double lane_dot(const double* x, const double* y, i64 V) {
  double acc[LANES] = {0.0};
  i64 v = 0;
  for (; v + LANES <= V; v += LANES)
    for (i64 j = 0; j < LANES; ++j) acc[j] += x[v + j] * y[v + j];
  for (i64 j = 0; v + j < V; ++j) acc[j] += x[v + j] * y[v + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

inline double lane_sum(const double* x, i64 V) {
  double acc[LANES] = {0.0};
  i64 v = 0;
  for (; v + LANES <= V; v += LANES)
    for (i64 j = 0; j < LANES; ++j) acc[j] += x[v + j];
  for (i64 j = 0; v + j < V; ++j) acc[j] += x[v + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

inline double lane_max(const double* x, i64 V) {
  double acc[LANES];
  for (i64 j = 0; j < LANES; ++j) acc[j] = x[0];
  i64 v = 0;
  for (; v + LANES <= V; v += LANES)
    for (i64 j = 0; j < LANES; ++j) acc[j] = acc[j] > x[v + j] ? acc[j] : x[v + j];
  for (i64 j = 0; v + j < V; ++j) acc[j] = std::max(acc[j], x[v + j]);
  double top = acc[0];
  for (i64 j = 1; j < LANES; ++j) top = std::max(top, acc[j]);
  return top;
}

// While alive, this thread computes with subnormal floats as IEEE 754 says (MXCSR's flush-to-zero and
// denormals-are-zero cleared, as numpy computes), whatever it inherited or the compiled windows' switch says; then
// the old setting is back. So no block's bits depend on the thread that ran it.
struct IeeeScope {
#if MOGLM_HAS_MXCSR
  unsigned int saved;
  IeeeScope() : saved(_mm_getcsr()) { _mm_setcsr(saved & ~0x8040u); }
  ~IeeeScope() { _mm_setcsr(saved); }
#endif
};

// a row's log-sum-exp normalisation: L -= max, P = exp(L), L -= log sum P, P /= sum P
inline void normalise(double* L, double* P, i64 V) {
  const double top = lane_max(L, V);
  for (i64 v = 0; v < V; ++v) P[v] = exp_d(L[v] - top);
  const double sum = lane_sum(P, V);
  const double shift = top + log_d(sum), inverse = 1.0 / sum;
  for (i64 v = 0; v < V; ++v) {
    L[v] -= shift;
    P[v] *= inverse;
  }
}

// The rows are read at random from tables of hundreds of MB, so each is a miss to memory: a loop asks for the rows
// AHEAD of the one it reads, so that their misses overlap.
constexpr i64 AHEAD = 8;

inline void prefetch_row(const uint16_t* row, i64 V) {
  for (i64 v = 0; v < V; v += 32) __builtin_prefetch(row + v);  // 32 counts: one 64-byte line
}

// The tokens a row of counts ``n`` [V] has counted, in increasing order, into ``idx``; returns how many. With
// AVX-512, sixteen cells at a time (a mask of the nonzero ones compresses their indices in a register, stored
// under a mask: compressing straight to memory is slow on some CPUs); else four empty cells skipped at a time.
inline int32_t counted_tokens(const uint16_t* n, i64 V, int32_t* idx) {
  int32_t j = 0;
  i64 v = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (; v + 16 <= V; v += 16) {
    const __m256i cells = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(n + v));
    const __mmask16 nonzero = _mm256_test_epi16_mask(cells, cells);
    if (!nonzero) continue;
    const __m512i at = _mm512_maskz_compress_epi32(nonzero, _mm512_add_epi32(lanes, _mm512_set1_epi32(int32_t(v))));
    const int found = __builtin_popcount(nonzero);
    _mm512_mask_storeu_epi32(idx + j, static_cast<__mmask16>((1u << found) - 1u), at);
    j += found;
  }
#endif
  for (; v < V; v += 4) {  // rows are sparse: skip four empty cells at a time
    uint64_t four = 0;
    if (v + 4 <= V) std::memcpy(&four, n + v, sizeof four);
    else four = 1;
    if (four == 0) continue;
    for (i64 u = v; u < std::min(v + 4, V); ++u)
      if (n[u]) idx[j++] = static_cast<int32_t>(u);
  }
  return j;
}

// [K, B]: the count of every table's row (tables [K, S, V] uint16, rows [K, B])
at::Tensor context_totals(const at::Tensor& tables, const at::Tensor& rows) {
  const i64 K = rows.size(0), B = rows.size(1), S = tables.size(1), V = tables.size(2);
  TORCH_CHECK(tables.is_contiguous() && rows.is_contiguous(), "moglm context mixer: an input is not contiguous");
  const auto* counts = static_cast<const uint16_t*>(tables.data_ptr());
  const i64* row = rows.data_ptr<i64>();
  at::Tensor totals = at::empty({K, B}, rows.options());
  i64* out = totals.data_ptr<i64>();
  ready_threads();
  at::parallel_for(0, K * B, 64, [&](i64 begin, i64 end) {  // integer sums: the same whichever thread
    for (i64 i = begin; i < end; ++i) {
      if (i + AHEAD < end) prefetch_row(counts + (((i + AHEAD) / B) * S + row[i + AHEAD]) * V, V);
      const uint16_t* n = counts + ((i / B) * S + row[i]) * V;
      i64 total = 0;
      for (i64 v = 0; v < V; ++v) total += n[v];
      out[i] = total;
    }
  });
  return totals;
}

// One step's mixture of every block (see the top of this file), into the workspace that context_learn reads:
// stats [B, S (K + 2) + 12] what the gradients need that does not depend on the token read (per set: E[lp], E[D_k]
// for each table, the second layer's E_mixed[L_s]; then the map's refined probability summed by bin), lp [B, V] the
// model's log-probabilities (p normalised here), counted [B, K] and the lists (index [B, K, V] int32, delta
// [B, K, V]) of each table's counted tokens and their D_k, logs [S, B, V] each set's normalised log-mixture, mixed
// [B, V] the second layer's (the one set's without it) distribution, cells [B, V] int64 and refined [B, V] the
// adaptive probability map's (the distribution to code: refined with the map, else mixed). The expectations are
// taken here, while a block's rows are in cache, so that context_learn reads a few numbers a block. Every thread
// computes in IEEE mode (IeeeScope).
void context_mix(const at::Tensor& tables, const at::Tensor& rows, const at::Tensor& totals,
                 const at::Tensor& p, const at::Tensor& weights, const at::Tensor& final_weights,
                 const at::Tensor& corrections, const at::Tensor& before, double alpha, bool second_layer,
                 bool refine, at::TensorList work) {
  const i64 K = rows.size(0), B = rows.size(1), S_rows = tables.size(1), V = tables.size(2);
  const i64 S = weights.size(0), M = weights.size(2), STATS = S * (K + 2) + APM_BINS;
  TORCH_CHECK(M == K + 1 && p.size(0) == B && p.size(1) == V && work.size() == WORK && work[0].size(1) == STATS,
              "moglm context mixer: inconsistent sizes");
  for (const at::Tensor& t : {tables, rows, totals, p, weights, final_weights, corrections, before})
    TORCH_CHECK(t.is_contiguous(), "moglm context mixer: an input is not contiguous");
  for (const at::Tensor& t : work) TORCH_CHECK(t.is_contiguous(), "moglm context mixer: a buffer is not contiguous");
  const auto* counts = static_cast<const uint16_t*>(tables.data_ptr());
  const i64 *row = rows.data_ptr<i64>(), *total = totals.data_ptr<i64>(), *prior = before.data_ptr<i64>();
  const double *model = p.data_ptr<double>(), *w = weights.data_ptr<double>(), *f = final_weights.data_ptr<double>();
  const double* correction = refine ? corrections.data_ptr<double>() : nullptr;
  double *stats = work[0].data_ptr<double>(), *lp = work[1].data_ptr<double>();
  int32_t *counted = work[2].data_ptr<int32_t>(), *index = work[3].data_ptr<int32_t>();
  double *delta = work[4].data_ptr<double>(), *logs = work[5].data_ptr<double>(), *mixed = work[6].data_ptr<double>();
  i64* cells = work[7].data_ptr<i64>();
  double* refined = work[8].data_ptr<double>();
  const double log_alpha = log_d(alpha);
  ready_threads();
  at::parallel_for(0, B, 1, [&](i64 begin, i64 end) {
    IeeeScope ieee;
    // this thread's: estimates or log p_out, lp + c_k of the counted tokens, p, exp L_s
    std::vector<double> scratch(V), gathered(V), pn(V), probs(S * V), weight(S);
    for (i64 b = begin; b < end; ++b) {
      if (b + 1 < end)
        for (i64 k = 0; k < K; ++k) prefetch_row(counts + (k * S_rows + row[k * B + b + 1]) * V, V);
      double *pb = pn.data(), *lb = lp + b * V, *st = stats + b * STATS;
      const double sum = lane_sum(model + b * V, V);  // > 0 and finite: the predictor makes such a row uniform
      for (i64 v = 0; v < V; ++v) {
        pb[v] = model[b * V + v] / sum;
        lb[v] = log_d(std::max(pb[v], TINY));
      }
      // each set's L starts as (sum_m w_m) lp, written here so that its vector stores have long left the store
      // queue when the sparse sums below read it back one element at a time (a narrow load of a wide store still
      // in flight waits for it)
      for (i64 s = 0; s < S; ++s) {
        const double* ws = w + (s * B + b) * M;
        double* L = logs + (s * B + b) * V;
        double all = 0.0;
        for (i64 m = 0; m < M; ++m) all += ws[m];  // M is small: one chain
        for (i64 v = 0; v < V; ++v) L[v] = all * lb[v];
      }
      for (i64 k = 0; k < K; ++k) {  // each table's counted tokens and their D_k
        const i64 N = total[k * B + b];
        const uint16_t* n = counts + (k * S_rows + row[k * B + b]) * V;
        int32_t* idx = index + (b * K + k) * V;
        double* d = delta + (b * K + k) * V;
        int32_t j = 0;
        if (N > 0) {
          const double denominator = N + alpha, c = log_alpha - log_d(denominator);
          j = counted_tokens(n, V, idx);
          // the counted tokens' estimates and lp + c, gathered so that D_k's logarithms vectorise in one loop
          double *estimate = scratch.data(), *base = gathered.data();
          for (int32_t i = 0; i < j; ++i) {
            estimate[i] = std::max((n[idx[i]] + alpha * pb[idx[i]]) / denominator, TINY);
            base[i] = lb[idx[i]] + c;
          }
          for (int32_t i = 0; i < j; ++i) d[i] = log_d(estimate[i]) - base[i];
        }
        counted[b * K + k] = j;
      }
      // each set's mixture: L_s (= (sum w) lp) gains every table's sparse terms, table by table; all the sets in
      // one pass over each table's counted tokens (each L_s[v] still sums its terms in table order)
      for (i64 k = 0; k < K; ++k) {
        const int32_t* idx = index + (b * K + k) * V;
        const double* d = delta + (b * K + k) * V;
        for (i64 s = 0; s < S; ++s) weight[s] = w[(s * B + b) * M + k + 1];
        for (int32_t i = 0; i < counted[b * K + k]; ++i) {
          const i64 v = idx[i];
          const double dv = d[i];
          for (i64 s = 0; s < S; ++s) logs[(s * B + b) * V + v] += weight[s] * dv;
        }
      }
      for (i64 s = 0; s < S; ++s) {  // normalised, and its expectation of lp
        double *P = probs.data() + s * V, *es = st + s * (K + 2);
        normalise(logs + (s * B + b) * V, P, V);
        es[0] = lane_dot(P, lb, V);
        es[K + 1] = 0.0;
      }
      // every set's expectation of each D_k, each one running sum as it always was: summed into an array shared by
      // the sets in one pass, GCC fused its multiply-adds where it had kept them apart (its tuning for this CPU
      // avoids FMA in a register's chain of sums), and the mixtures, so the files, changed
      for (i64 k = 0; k < K; ++k) {
        const int32_t* idx = index + (b * K + k) * V;
        const double* d = delta + (b * K + k) * V;
        for (i64 s = 0; s < S; ++s) {
          const double* P = probs.data() + s * V;
          double e = 0.0;
          for (int32_t i = 0; i < counted[b * K + k]; ++i) e += P[idx[i]] * d[i];
          st[s * (K + 2) + 1 + k] = e;
        }
      }
      double* out = mixed + b * V;
      double* log_out = scratch.data();
      if (second_layer) {
        for (i64 v = 0; v < V; ++v) log_out[v] = 0.0;
        for (i64 s = 0; s < S; ++s) {
          const double* L = logs + (s * B + b) * V;
          for (i64 v = 0; v < V; ++v) log_out[v] += f[s] * L[v];
        }
        normalise(log_out, out, V);
        for (i64 s = 0; s < S; ++s) st[s * (K + 2) + K + 1] = lane_dot(out, logs + (s * B + b) * V, V);
      } else {
        std::memcpy(log_out, logs + b * V, V * sizeof(double));
        std::memcpy(out, probs.data(), V * sizeof(double));
      }
      double* by_bin = st + S * (K + 2);
      for (i64 j = 0; j < APM_BINS; ++j) by_bin[j] = 0.0;
      if (refine) {  // the map: log p + its correction for (token before, bin of log p)
        i64* cb = cells + b * V;
        double* rb = refined + b * V;
        // the cells first (selects, which vectorise), then the corrections; through local copies of the count and
        // the map, as a store through cb could otherwise be the captured V or pointer, and no loop would vectorise
        const i64 base = prior[b] * APM_BINS, n = V;
        const double* map = correction;
        for (i64 v = 0; v < n; ++v) {
          double bin = std::ceil(log_out[v]);
          bin = bin > 0.0 ? 0.0 : bin;
          bin = bin >= -11.0 ? bin + 11.0 : 0.0;  // below the edges, or NaN (weights gone non-finite): bin 0
          cb[v] = base + static_cast<i64>(bin);
        }
        for (i64 v = 0; v < n; ++v) log_out[v] += map[cb[v]];
        normalise(log_out, rb, V);
        double part[4][APM_BINS] = {};  // four histograms of v mod 4, so that runs of one bin do not chain the adds
        for (i64 v = 0; v < V; ++v) part[v & 3][cb[v] - base] += rb[v];
        for (i64 j = 0; j < APM_BINS; ++j) by_bin[j] = (part[0][j] + part[1][j]) + (part[2][j] + part[3][j]);
      }
    }
  });
}

// The step's gradients once ``read`` ([B]) is known, from context_mix's workspace: returns [S, B, M], every
// set's gradient of its code length's negative (lp(y) + D_k(y) - E[lp] - E[D_k]), and [B, S], the second layer's
// (L_s(y) - E_mixed[L_s]); with the map, steps its corrections by apm_lr times their summed gradients
// (1[v = y] - refined(v), summed by cell over every block and token: per block, 1 in y's bin less the bins' sums).
std::vector<at::Tensor> context_learn(const at::Tensor& read, at::Tensor corrections, double apm_lr, bool second_layer,
                                      bool refine, i64 S, i64 K, at::TensorList work) {
  const i64 B = read.size(0), V = work[1].size(1), M = K + 1, STATS = S * (K + 2) + APM_BINS;
  TORCH_CHECK(work.size() == WORK && read.is_contiguous() && corrections.is_contiguous() && work[1].size(0) == B &&
              work[0].size(1) == STATS, "moglm context mixer: inconsistent workspace or inputs");
  const i64* y = read.data_ptr<i64>();
  for (i64 b = 0; b < B; ++b)
    TORCH_CHECK(y[b] >= 0 && y[b] < V, "moglm context mixer: a token outside the vocabulary");
  const double *stats = work[0].data_ptr<double>(), *lp = work[1].data_ptr<double>();
  const int32_t *counted = work[2].data_ptr<int32_t>(), *index = work[3].data_ptr<int32_t>();
  const double *delta = work[4].data_ptr<double>(), *logs = work[5].data_ptr<double>();
  const i64* cells = work[7].data_ptr<i64>();
  at::Tensor grads = at::empty({S, B, M}, work[1].options());
  at::Tensor final_grads = at::zeros({B, S}, work[1].options());
  double *g = grads.data_ptr<double>(), *gf = final_grads.data_ptr<double>();
  std::vector<double> d_read(K);  // D_k(y) of one block
  for (i64 b = 0; b < B; ++b) {  // a few numbers a block: not worth the threads
    const i64 token = y[b];
    const double lb = lp[b * V + token], *st = stats + b * STATS;
    for (i64 k = 0; k < K; ++k) {
      const int32_t* idx = index + (b * K + k) * V;
      d_read[k] = 0.0;
      for (int32_t i = 0; i < counted[b * K + k]; ++i)
        if (idx[i] == token) d_read[k] = delta[(b * K + k) * V + i];
    }
    for (i64 s = 0; s < S; ++s) {
      const double* es = st + s * (K + 2);
      double* gs = g + (s * B + b) * M;
      gs[0] = lb - es[0];
      for (i64 k = 0; k < K; ++k) gs[k + 1] = (lb + d_read[k]) - (es[0] + es[1 + k]);
      if (second_layer) gf[b * S + s] = logs[(s * B + b) * V + token] - es[K + 1];
    }
  }
  if (refine) {
    double* correction = corrections.data_ptr<double>();
    std::vector<double> summed(corrections.numel(), 0.0);
    std::vector<char> touched(corrections.numel(), 0);
    for (i64 b = 0; b < B; ++b) {  // in block order, so both sides sum alike
      const i64 base = (cells[b * V] / APM_BINS) * APM_BINS, hit = cells[b * V + y[b]] - base;
      const double* by_bin = stats + b * STATS + S * (K + 2);
      for (i64 j = 0; j < APM_BINS; ++j) {
        summed[base + j] += (j == hit ? 1.0 : 0.0) - by_bin[j];
        touched[base + j] = 1;
      }
    }
    for (i64 c = 0; c < corrections.numel(); ++c)
      if (touched[c]) correction[c] += apm_lr * summed[c];
  }
  return {grads, final_grads};
}

// weights[rows[b]] += lr * gradient[b] for every block b (weights [R, M], rows [B], gradient [B, M]), the blocks
// that share a row summed first in block order (with ``mean``, their mean): context_mixing._step's arithmetic.
void context_step(at::Tensor weights, const at::Tensor& rows, const at::Tensor& gradient, double lr, bool mean) {
  const i64 B = rows.size(0), M = weights.size(1), R = weights.size(0);
  TORCH_CHECK(weights.is_contiguous() && rows.is_contiguous() && gradient.is_contiguous() && gradient.size(0) == B &&
              gradient.size(1) == M, "moglm context mixer: inconsistent weights or gradient");
  const i64* row = rows.data_ptr<i64>();
  const double* g = gradient.data_ptr<double>();
  double* w = weights.data_ptr<double>();
  std::vector<i64> order(B);
  for (i64 b = 0; b < B; ++b) {
    TORCH_CHECK(row[b] >= 0 && row[b] < R, "moglm context mixer: a weight row outside the weights");
    order[b] = b;
  }
  std::stable_sort(order.begin(), order.end(), [&](i64 a, i64 b) { return row[a] < row[b]; });
  std::vector<double> total(M);
  for (i64 i = 0; i < B;) {
    i64 j = i;
    for (i64 m = 0; m < M; ++m) total[m] = g[order[i] * M + m];
    for (++j; j < B && row[order[j]] == row[order[i]]; ++j)
      for (i64 m = 0; m < M; ++m) total[m] += g[order[j] * M + m];
    double* target = w + row[order[i]] * M;
    const double count = static_cast<double>(j - i);
    for (i64 m = 0; m < M; ++m) target[m] += lr * (mean ? total[m] / count : total[m]);
    i = j;
  }
}

// context_learn, then every set's context_step (weights[s] [R_s, M], its rows chosen[s] [B], mean with the second
// layer): one call a step. Returns the second layer's gradients [B, S].
at::Tensor context_learn_step(const at::Tensor& read, at::Tensor corrections, double apm_lr, bool second_layer,
                              bool refine, i64 S, i64 K, at::TensorList work, at::TensorList weights,
                              const at::Tensor& chosen, double lr) {
  TORCH_CHECK(static_cast<i64>(weights.size()) == S && chosen.dim() == 2 && chosen.size(0) == S,
              "moglm context mixer: inconsistent weight sets");
  std::vector<at::Tensor> grads = context_learn(read, corrections, apm_lr, second_layer, refine, S, K, work);
  for (i64 s = 0; s < S; ++s) context_step(weights[s], chosen[s], grads[0][s], lr, second_layer);
  return grads[1];
}

// Count the tokens ``read`` ([B]) in every table's row ``rows`` ([K, B]) of ``tables`` ([K, S, V] uint16): a row
// with a cell about to be counted that has reached ``limit - most`` is halved first (once, however many blocks read
// it), then each cell gains the blocks that read it, at most ``most``: context_mixing.ContextMixer._count's.
void context_count(at::Tensor tables, const at::Tensor& rows, const at::Tensor& read, i64 most, i64 limit) {
  const i64 K = rows.size(0), B = rows.size(1), S = tables.size(1), V = tables.size(2);
  TORCH_CHECK(tables.is_contiguous() && rows.is_contiguous() && read.is_contiguous() && read.size(0) == B,
              "moglm context mixer: inconsistent tables or tokens");
  auto* counts = static_cast<uint16_t*>(tables.data_ptr());
  const i64 *row = rows.data_ptr<i64>(), *token = read.data_ptr<i64>();
  for (i64 b = 0; b < B; ++b)
    TORCH_CHECK(token[b] >= 0 && token[b] < V, "moglm context mixer: a token outside the vocabulary");
  for (i64 i = 0; i < K * B; ++i)
    TORCH_CHECK(row[i] >= 0 && row[i] < S, "moglm context mixer: a row outside its table");
  std::vector<i64> full, cells(K * B);
  for (i64 k = 0; k < K; ++k)
    for (i64 b = 0; b < B; ++b) {
      const i64 slot = k * S + row[k * B + b];
      cells[k * B + b] = slot * V + token[b];
      if (counts[cells[k * B + b]] >= limit - most) full.push_back(slot);
    }
  std::sort(full.begin(), full.end());
  full.erase(std::unique(full.begin(), full.end()), full.end());
  for (const i64 slot : full)
    for (i64 v = 0; v < V; ++v) counts[slot * V + v] /= 2;
  std::sort(cells.begin(), cells.end());
  for (i64 i = 0; i < K * B;) {
    i64 j = i + 1;
    while (j < K * B && cells[j] == cells[i]) ++j;
    counts[cells[i]] += static_cast<uint16_t>(std::min(j - i, most));
    i = j;
  }
}

// exp_d and log_d of every element of a float64 tensor, for their tests against the C library's
std::vector<at::Tensor> context_exp_log(const at::Tensor& x) {
  const at::Tensor in = x.contiguous();
  at::Tensor e = at::empty_like(in), l = at::empty_like(in);
  const double* v = in.data_ptr<double>();
  double *pe = e.data_ptr<double>(), *pl = l.data_ptr<double>();
  for (i64 i = 0; i < in.numel(); ++i) {
    pe[i] = exp_d(v[i]);
    pl[i] = log_d(std::max(v[i], TINY));
  }
  return {e, l};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(moglm, m) {
  m.def("context_totals(Tensor tables, Tensor rows) -> Tensor", &context_totals);
  m.def("context_mix(Tensor tables, Tensor rows, Tensor totals, Tensor p, Tensor weights, Tensor final_weights, "
        "Tensor corrections, Tensor before, float alpha, bool second_layer, bool refine, Tensor(a!)[] work) -> ()",
        &context_mix);
  m.def("context_learn_step(Tensor read, Tensor(a!) corrections, float apm_lr, bool second_layer, bool refine, "
        "int S, int K, Tensor[] work, Tensor(b!)[] weights, Tensor chosen, float lr) -> Tensor",
        &context_learn_step);
  m.def("context_exp_log(Tensor x) -> Tensor[]", &context_exp_log);
  m.def("context_count(Tensor(a!) tables, Tensor rows, Tensor read, int most, int limit) -> ()", &context_count);
}

}  // namespace moglm
