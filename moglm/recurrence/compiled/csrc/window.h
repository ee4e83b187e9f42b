// Shared parts of the compiled recurrences (moglm/recurrence/compiled/build.py builds and loads them).
//
// * GEMM routes, chosen at run time (compiled/routes.py probes them on the machine):
//     - ATen: at::mm_out / at::addmm_out on views of the caller's buffers (public API, any build);
//     - BLAS: the Fortran ``sgemm_`` / ``dgemm_`` that torch's CPU library exports when it links a BLAS
//       (MKL on x86). Declared weak, so a build without them loads and reports the route as absent;
//     - MKL packed: ``cblas_sgemm_pack``/``_compute``, the weight packed once per window;
//     - panels: our own, the weight packed once per window into column panels for a register-blocked
//       micro-kernel (``panels::gemm``);
//     - brgemm: oneDNN's batch-reduce GEMM ukernel, JIT-compiled for this CPU (AVX2 or AVX-512), as
//       torch exports it (``at::native::cpublas::brgemm``, float32; torch's own oneDNN, so no second
//       copy of the library or its threading runtime). The weight is packed once per window into panels
//       of 64 columns, shared by the threads (``PackCache``), one ukernel call per panel.
//   ``PackedB`` holds a window's fixed right operand for whichever route runs. Inside a batch-parallel
//   worker every product must be single-threaded; MKL is told so with its thread-local thread count
//   (``mkl_set_num_threads_local_``, the Fortran entry point: it takes a pointer). ``ThreadGemmScope``
//   does that for the worker's lifetime.
// * Batch-parallel loops: ``for_row_blocks`` gives each thread one block of batch rows, which it runs
//   through all T steps alone (rows of a recurrence are independent: no synchronisation in the loop).
// * Pointwise kernels: one loop per step for the LSTM cell and its derivative and for each mogrifier
//   round, written so that the compiler vectorises them (the float exp below is branch-free).
// * Sparse dynamic evaluation's adaptation ``h + M h``, applied after every step (``Adaptation``).

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#include "workspace.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define MOGLM_HAS_MXCSR 1
#else
#define MOGLM_HAS_MXCSR 0
#endif

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*) __attribute__((weak));
int mkl_set_num_threads_local_(const int*) __attribute__((weak));
// MKL's packed GEMM (CBLAS enums as ints: row-major 101, no-trans 111, trans 112, packed 151, B matrix 162)
size_t cblas_sgemm_pack_get_size(int, int, int, int) __attribute__((weak));
void cblas_sgemm_pack(int, int, int, int, int, int, float, const float*, int, float*) __attribute__((weak));
void cblas_sgemm_compute(int, int, int, int, int, int, const float*, int, const float*, int, float, float*, int)
    __attribute__((weak));
}

namespace moglm {

using i64 = int64_t;

// ---------------------------------------------------------------------------------------------------
// GEMM routes
// ---------------------------------------------------------------------------------------------------

enum Route : int64_t { ROUTE_ATEN = 0, ROUTE_BLAS = 1, ROUTE_PANELS = 2, ROUTE_MKL_PACKED = 3, ROUTE_BRGEMM = 4 };

// Whether this torch exports oneDNN's float32 brgemm (torch >= 2.6 on x86 and aarch64 builds with oneDNN;
// where its ukernel cannot run on the CPU, torch's brgemm computes the product with its own GEMM instead)
inline bool brgemm_available() {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  return true;
#else
  return false;
#endif
}

inline bool blas_available(at::ScalarType dtype) {
  return dtype == at::kFloat ? sgemm_ != nullptr : (dtype == at::kDouble ? dgemm_ != nullptr : false);
}

inline bool mkl_local_threads_available() { return mkl_set_num_threads_local_ != nullptr; }

// Denormals are zero inside the windows. A trained model's steps can make subnormal floats (below 1.2e-38 in
// float32; measured on text with tokens its training never saw, whose embedding rows the L2 penalty decayed), and
// every multiply-add that reads or makes one takes a microcode assist, about a hundred cycles: a few subnormals in
// a step's batch slow its whole product (docs/fused-recurrence.md, "Subnormals"). While alive, a DenormalScope sets
// this thread's SSE/AVX control word (MXCSR) to flush subnormal results to zero (FTZ) and read subnormal operands
// as zero (DAZ), or, with the process-wide switch off (``set_flush_denormals``; on by default), clears both, so
// that the window computes with subnormals as IEEE 754 says whatever the thread inherited; then it puts the old
// value back. The switch is for what must round as before the flush existed (a compressed file written then). An
// op's entry first makes sure torch's thread pool is running (``ready_threads``), so that no worker is created
// inside a scope and keeps its setting for the rest of the process. x86-64 only; elsewhere the scope does nothing.
inline std::atomic<bool>& flush_denormals_switch() {
  static std::atomic<bool> on{true};
  return on;
}

struct DenormalScope {
#if MOGLM_HAS_MXCSR
  static constexpr unsigned int BITS = 0x8040u;  // FTZ (bit 15) | DAZ (bit 6)
  unsigned int saved;
  DenormalScope() : saved(_mm_getcsr()) {
    const bool on = flush_denormals_switch().load(std::memory_order_relaxed);
    _mm_setcsr(on ? (saved | BITS) : (saved & ~BITS));
  }
  ~DenormalScope() { _mm_setcsr(saved); }
#else
  DenormalScope() = default;
#endif
  DenormalScope(const DenormalScope&) = delete;
  DenormalScope& operator=(const DenormalScope&) = delete;
};

// Start torch's worker threads, if they are not running yet, outside any DenormalScope (a thread inherits
// its creator's MXCSR).
inline void ready_threads() {
  if (!at::in_parallel_region() && at::get_num_threads() > 1)
    at::parallel_for(0, at::get_num_threads(), 1, [](int64_t, int64_t) {});
}

// While alive inside a parallel worker: BLAS calls on this thread use one thread.
struct ThreadGemmScope {
  bool active = false;
  explicit ThreadGemmScope(bool single) {
    if (single && mkl_set_num_threads_local_ != nullptr) {
      const int one = 1;
      mkl_set_num_threads_local_(&one);
      active = true;
    }
  }
  ~ThreadGemmScope() {
    if (active) {
      const int zero = 0;  // 0: back to the global setting
      mkl_set_num_threads_local_(&zero);
    }
  }
};

template <typename T>
inline void blas_gemm(char ta, char tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb,
                      T beta, T* c, int ldc);

template <>
inline void blas_gemm<float>(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda,
                             const float* b, int ldb, float beta, float* c, int ldc) {
  sgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

template <>
inline void blas_gemm<double>(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda,
                              const double* b, int ldb, double beta, double* c, int ldc) {
  dgemm_(&ta, &tb, &m, &n, &k, &alpha, a, &lda, b, &ldb, &beta, c, &ldc);
}

template <typename T>
inline at::ScalarType scalar_type_of();
template <>
inline at::ScalarType scalar_type_of<float>() { return at::kFloat; }
template <>
inline at::ScalarType scalar_type_of<double>() { return at::kDouble; }

// A row-major [rows, cols] view of memory with leading dimension ld, as a tensor.
template <typename T>
inline at::Tensor view2d(const T* p, i64 rows, i64 cols, i64 ld) {
  return at::from_blob(const_cast<T*>(p), {rows, cols}, {ld, 1}, at::TensorOptions().dtype(scalar_type_of<T>()));
}

// Row-major C[M, N] = op(A)[M, K] @ op(B)[K, N] + beta * C, where op(X) = X^T when tX.
// A is stored [M, K] (or [K, M] when ta) with leading dimension lda; likewise B and C.
template <typename T>
inline void gemm(Route route, bool ta, bool tb, i64 M, i64 N, i64 K, const T* A, i64 lda, const T* B, i64 ldb,
                 T beta, T* C, i64 ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (i64 r = 0; r < M; ++r)
      for (i64 c = 0; c < N; ++c) C[r * ldc + c] = beta == T(0) ? T(0) : beta * C[r * ldc + c];
    return;
  }
  if (route != ROUTE_ATEN && blas_available(scalar_type_of<T>())) {  // unpacked products of the other routes
    // column-major view: C^T = op(B)^T @ op(A)^T
    blas_gemm<T>(tb ? 'T' : 'N', ta ? 'T' : 'N', (int)N, (int)M, (int)K, T(1), B, (int)ldb, A, (int)lda, beta, C,
                 (int)ldc);
    return;
  }
  at::Tensor a = ta ? view2d(A, K, M, lda).t() : view2d(A, M, K, lda);
  at::Tensor b = tb ? view2d(B, N, K, ldb).t() : view2d(B, K, N, ldb);
  at::Tensor c = view2d(C, M, N, ldc);
  if (beta == T(0)) {
    at::mm_out(c, a, b);
  } else {
    at::addmm_out(c, c, a, b, beta, 1);
  }
}

inline bool packed_available() {
  return cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr && cblas_sgemm_compute != nullptr;
}

// The panels route: op(B) [K, N] packed once into panels of NR columns (zero-padded), each panel K rows of
// NR contiguous floats; a product walks the panels and, for each, blocks of MR rows of A through a
// register-blocked micro-kernel (MR x NR accumulators). GCC vector extensions: -march=native picks the
// instruction set. float32 only.
namespace panels {
constexpr i64 NR = 16, MR = 6;
typedef float v8 __attribute__((vector_size(32)));

inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// (into a workspace block: every element written, the last panel's padding with zeros)
inline at::Tensor pack(i64 N, i64 K, const float* B, i64 ldb, bool tb) {
  const i64 np = (N + NR - 1) / NR;
  at::Tensor packed = workspace({np * K * NR}, at::TensorOptions().dtype(at::kFloat));
  float* out = packed.data_ptr<float>();
  for (i64 p = 0; p < np; ++p)
    for (i64 k = 0; k < K; ++k)
      for (i64 c = 0; c < NR; ++c) {
        const i64 col = p * NR + c;
        out[(p * K + k) * NR + c] = col >= N ? 0.0f : tb ? B[col * ldb + k] : B[k * ldb + col];
      }
  return packed;
}

// tile[R, NR] (+)= A[R, K] @ panel[K, NR]; ``accumulate``: add to what the tile holds
template <int R>
inline void micro(i64 K, const float* A, i64 lda, const float* panel, float* tile, bool accumulate) {
  v8 c0[R], c1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    if (accumulate) {
      c0[r] = load8(tile + r * NR);
      c1[r] = load8(tile + r * NR + 8);
    } else {
      c0[r] = c1[r] = v8{};
    }
  }
  for (i64 k = 0; k < K; ++k) {
    const v8 b0 = load8(panel + k * NR), b1 = load8(panel + k * NR + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float a = A[r * lda + k];
      c0[r] += a * b0;
      c1[r] += a * b1;
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    std::memcpy(tile + r * NR, &c0[r], sizeof(v8));
    std::memcpy(tile + r * NR + 8, &c1[r], sizeof(v8));
  }
}

// K is walked in chunks of KC rows, so that a panel's chunk (KC x NR floats, 16 KB) stays in L1 while
// every row block of A passes over it
constexpr i64 KC = 256;
constexpr i64 MAX_BLOCKS = 64;

// C[M, N] = A[M, K] @ packed + beta C. Rows are cut into blocks of at most MR, as even as possible (32
// rows: 6 6 5 5 5 5, not 6 6 6 6 6 2), because a short block wastes the loads of the panel it reads.
inline void gemm(i64 M, i64 N, i64 K, const float* A, i64 lda, const float* packed, float beta, float* C, i64 ldc) {
  if (M > MR * MAX_BLOCKS) {  // very many rows: in slices
    for (i64 r0 = 0; r0 < M; r0 += MR * MAX_BLOCKS)
      gemm(std::min(MR * MAX_BLOCKS, M - r0), N, K, A + r0 * lda, lda, packed, beta, C + r0 * ldc, ldc);
    return;
  }
  const i64 blocks = (M + MR - 1) / MR;
  i64 start[MAX_BLOCKS + 1];
  for (i64 b = 0; b <= blocks; ++b) start[b] = b * M / blocks;
  alignas(64) float tiles[MAX_BLOCKS * MR * NR];
  const i64 np = (N + NR - 1) / NR;
  for (i64 p = 0; p < np; ++p) {
    const float* panel = packed + p * K * NR;
    const i64 c0 = p * NR, cols = std::min(NR, N - c0);
    for (i64 k0 = 0; k0 < K; k0 += KC) {
      const i64 kc = std::min(KC, K - k0);
      for (i64 b = 0; b < blocks; ++b) {
        const float* a = A + start[b] * lda + k0;
        float* tile = tiles + b * MR * NR;
        const bool acc = k0 > 0;
        switch (start[b + 1] - start[b]) {
          case 6: micro<6>(kc, a, lda, panel + k0 * NR, tile, acc); break;
          case 5: micro<5>(kc, a, lda, panel + k0 * NR, tile, acc); break;
          case 4: micro<4>(kc, a, lda, panel + k0 * NR, tile, acc); break;
          case 3: micro<3>(kc, a, lda, panel + k0 * NR, tile, acc); break;
          case 2: micro<2>(kc, a, lda, panel + k0 * NR, tile, acc); break;
          default: micro<1>(kc, a, lda, panel + k0 * NR, tile, acc); break;
        }
      }
    }
    for (i64 b = 0; b < blocks; ++b) {
      const float* tile = tiles + b * MR * NR;
      for (i64 r = start[b]; r < start[b + 1]; ++r) {
        float* c = C + r * ldc + c0;
        const float* tr = tile + (r - start[b]) * NR;
        if (beta == 0.0f)
          for (i64 j = 0; j < cols; ++j) c[j] = tr[j];
        else
          for (i64 j = 0; j < cols; ++j) c[j] = tr[j] + beta * c[j];
      }
    }
  }
}
}  // namespace panels

// A per-step product on oneDNN's ukernel whose left operand is larger than BLOCKED_FROM_BYTES (dG [64, 4096] of
// the backward at H = 1024 is 1 MiB, the whole L2 of a Zen 5 core) sums its K terms in chunks of at most
// BLOCKED_BYTES of that operand (from 64 rows to 256: chunks of 1024 to 256 terms), each chunk through every panel
// before the next, so that the chunk stays in L2 while the panels stream past; whole, the ukernel read the operand
// again from L3 for every panel of 64 columns. At H = 650 (665 KB) chunks gained nothing steady on a Zen 5, hence
// 768 KiB. The sizes are constants, not the machine's L2, so that one route rounds the same on every machine. The
// process-wide switch (``set_blocked_products``; on by default) sums them whole, as before it existed: a compressed
// file of version 13 or older decodes with it off (docs/fused-recurrence.md).
inline std::atomic<bool>& blocked_products_switch() {
  static std::atomic<bool> on{true};
  return on;
}
constexpr i64 BLOCKED_FROM_BYTES = 768 * 1024, BLOCKED_BYTES = 256 * 1024;

// The brgemm route: op(B) [K, N] packed into panels of NB columns, each panel K rows of its width
// (``panel_width``) contiguous, and C[M, N] = A[M, K] @ panel, panel by panel, one ukernel call each.
// Panels of 64 columns over the whole K measured best among the tilings tried at the windows' shapes
// (H = 256-1024, 16-64 rows per thread) on an AVX-512 CPU (route table in docs/fused-recurrence.md).
namespace brgemm {
constexpr i64 NB = 64;

inline i64 panel_width(i64 N, i64 p) { return std::min(NB, N - p * NB); }

// (into a workspace block: every element written)
inline at::Tensor pack(i64 N, i64 K, const float* B, i64 ldb, bool tb) {
  at::Tensor packed = workspace({N * K}, at::TensorOptions().dtype(at::kFloat));
  for (i64 p = 0; p * NB < N; ++p) {
    const i64 w = panel_width(N, p);
    float* dst = packed.data_ptr<float>() + p * NB * K;
    for (i64 k = 0; k < K; ++k)
      for (i64 c = 0; c < w; ++c) dst[k * w + c] = tb ? B[(p * NB + c) * ldb + k] : B[k * ldb + p * NB + c];
  }
  return packed;
}

// C[M, N] = A[M, K] @ packed + beta C
inline void gemm(i64 M, i64 N, i64 K, const float* A, i64 lda, const float* packed, float beta, float* C, i64 ldc) {
#ifdef CPUBLAS_BRGEMM_F32F32F32
  if (beta != 0.0f && beta != 1.0f)
    for (i64 r = 0; r < M; ++r)
      for (i64 c = 0; c < N; ++c) C[r * ldc + c] *= beta;
  // in chunks of at least 256 terms, so at most 256 rows: with more, the output's tiles would be read and written
  // again for every chunk, more traffic than the operand's re-reads saved (sums there stay whole, as before)
  const i64 chunk = BLOCKED_BYTES / (i64(sizeof(float)) * std::max<i64>(M, 1)) / NB * NB;  // (no rows: whole)
  const bool blocked = M * K * i64(sizeof(float)) > BLOCKED_FROM_BYTES && chunk >= 4 * NB &&
                       blocked_products_switch().load(std::memory_order_relaxed);
  const i64 KC = blocked ? chunk : K;
  for (i64 k0 = 0; k0 < K; k0 += KC) {  // a panel's K rows are contiguous, so a chunk of it is too
    const i64 kc = std::min(KC, K - k0);
    for (i64 p = 0; p * NB < N; ++p) {
      const i64 w = panel_width(N, p);
      at::native::cpublas::brgemm(M, w, kc, lda, w, ldc, beta != 0.0f || k0 > 0, A + k0, packed + p * NB * K + k0 * w,
                                  C + p * NB, false);
    }
  }
#else
  TORCH_CHECK(false, "moglm compiled recurrence: this torch has no float32 brgemm");
#endif
}
}  // namespace brgemm

// A window's packed weights, shared by its threads: the first thread to need a weight packs it, the
// others wait for it and read the same copy (one copy in the shared cache instead of one per thread).
struct PackCache {
  std::mutex mutex;
  std::map<std::tuple<const void*, i64, i64, i64, bool>, at::Tensor> packs;

  template <typename F>
  at::Tensor get(const void* b, i64 ldb, i64 N, i64 K, bool tb, const F& make) {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = packs[std::make_tuple(b, ldb, N, K, tb)];
    if (!slot.defined()) slot = make();
    return slot;
  }
};

// packing copies B once; it pays when the products it serves have at least this many rows in all
// (below it, as in one-token generation, each product runs unpacked)
constexpr i64 MIN_PACKED_ROWS = 64;

// The right operand of C[M, N] = A[M, K] @ op(B)[K, N] for a fixed B used at every step of a window
// (``uses`` products of M rows). Packed once per window where the route packs and that pays: the panels
// route (float32), or MKL's packed-GEMM API (float32, for this thread's M); otherwise each product is a
// plain ``gemm`` (BLAS where torch exports it, else ATen).
template <typename T>
struct PackedB {
  const T* b = nullptr;
  i64 ldb = 0, N = 0, K = 0;
  bool tb = false;
  Route route = ROUTE_ATEN;
  // packed B (float32 only; workspace blocks): MKL's, the panels route's, the brgemm route's panels (shared)
  at::Tensor mkl, panel, shared;

  // ``cache``: where the brgemm route shares its packed copy between the window's threads (null: packs
  // its own)
  PackedB(Route route_, i64 M, i64 N_, i64 K_, const T* b_, i64 ldb_, bool tb_, i64 uses, PackCache* cache = nullptr)
      : b(b_), ldb(ldb_), N(N_), K(K_), tb(tb_), route(route_) {
    const bool packs = route == ROUTE_PANELS || route == ROUTE_MKL_PACKED || route == ROUTE_BRGEMM;
    if ((M * uses < MIN_PACKED_ROWS && packs) || (route == ROUTE_BRGEMM && (!std::is_same_v<T, float> ||
                                                                           !brgemm_available()))) {
      route = blas_available(scalar_type_of<T>()) ? ROUTE_BLAS : ROUTE_ATEN;
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (M <= 0 || N <= 0 || K <= 0) return;
      if (route == ROUTE_PANELS) {
        panel = panels::pack(N, K, b, ldb, tb);
      } else if (route == ROUTE_MKL_PACKED && packed_available()) {
        mkl = workspace({i64(cblas_sgemm_pack_get_size(162, (int)M, (int)N, (int)K) / sizeof(float) + 16)},
                        at::TensorOptions().dtype(at::kFloat));
        cblas_sgemm_pack(101, 162, tb ? 112 : 111, (int)M, (int)N, (int)K, 1.0f, b, (int)ldb, mkl.data_ptr<float>());
      } else if (route == ROUTE_BRGEMM) {
        auto make = [&] { return brgemm::pack(N, K, b, ldb, tb); };
        shared = cache != nullptr ? cache->get(b, ldb, N, K, tb, make) : make();
      }
    }
    if (route != ROUTE_ATEN && !blas_available(scalar_type_of<T>())) route = ROUTE_ATEN;  // unpacked fallback
  }

  // C[M, N] = A[M, K] @ op(B) + beta C
  void operator()(i64 M, const T* A, i64 lda, T beta, T* C, i64 ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (shared.defined()) {
        brgemm::gemm(M, N, K, A, lda, shared.data_ptr<float>(), beta, C, ldc);
        return;
      }
      if (panel.defined()) {
        panels::gemm(M, N, K, A, lda, panel.data_ptr<float>(), beta, C, ldc);
        return;
      }
      if (mkl.defined()) {
        cblas_sgemm_compute(101, 111, 151, (int)M, (int)N, (int)K, A, (int)lda, mkl.data_ptr<float>(), (int)N, beta, C,
                            (int)ldc);
        return;
      }
    }
    gemm<T>(route, false, tb, M, N, K, A, lda, b, ldb, beta, C, ldc);
  }
};

// X @ op(W) for X [R, K] with many rows, W [N, K] (``tw``: op(W) = W^T) or [K, N]; into ``out`` [R, N]
// with ``beta`` (0 or 1) when given, else a new tensor. On the brgemm route the weight is packed once and
// the rows are split over the threads in blocks, each block one packed product; otherwise at::mm (which
// uses every thread itself). Used for what does not depend on the recurrence: the multiplicative LSTM's
// W_mx x and W_ih x before the loop, its input gradients after it.
template <typename T>
inline at::Tensor product(Route route, const at::Tensor& X, const at::Tensor& W, bool tw, at::Tensor out = {},
                          T beta = T(0)) {
  const i64 R = X.size(0), K = X.size(1), N = tw ? W.size(0) : W.size(1);
  if (!out.defined()) {
    out = at::empty({R, N}, X.options());
    beta = T(0);
  }
  if (route != ROUTE_BRGEMM || !std::is_same_v<T, float> || R < MIN_PACKED_ROWS) {
    at::Tensor w = tw ? W.t() : W;
    if (beta == T(0))
      at::mm_out(out, X, w);
    else
      out.addmm_(X, w, beta, 1);
    return out;
  }
  constexpr i64 ROWS = 64;
  const PackedB<T> packed(route, R, N, K, W.data_ptr<T>(), tw ? K : N, tw, 1);
  const T* x = X.data_ptr<T>();
  T* o = out.data_ptr<T>();
  at::parallel_for(0, (R + ROWS - 1) / ROWS, 1, [&](i64 c0, i64 c1) {
    DenormalScope denormals;
    for (i64 c = c0; c < c1; ++c) {
      const i64 r0 = c * ROWS;
      packed(std::min(ROWS, R - r0), x + r0 * K, K, beta, o + r0 * N, N);
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Products over all T*B rows (weight gradients after the loop)
// ---------------------------------------------------------------------------------------------------

// A^T B for A [R, N] and B [R, K] with many rows R (a weight gradient: [N, K]). On the brgemm route (float32,
// both sides at least 64 wide) the narrower operand is transposed once and the product runs as oneDNN
// ukernel calls on row blocks split over the threads, each block walking R in chunks that stay in cache
// (``moglm bench gemm-routes`` times it against at::mm). Otherwise at::mm. ``scratch``: the caller only
// reads the result (it copies parts of it out), so it comes from the workspace cache.
inline at::Tensor product_tn(Route route, const at::Tensor& A, const at::Tensor& B, bool scratch = false) {
  const i64 R = A.size(0), N = A.size(1), K = B.size(1);
  auto result = [&](i64 rows, i64 cols) {
    return scratch ? workspace({rows, cols}, A.options()) : at::empty({rows, cols}, A.options());
  };
  if (route != ROUTE_BRGEMM || !brgemm_available() || A.scalar_type() != at::kFloat || std::min(N, K) < 64 ||
      R < 64) {
    at::Tensor out = result(N, K);
    return at::mm_out(out, A.t(), B);
  }
  const bool flip = N > K;  // compute (B^T A)^T: transpose the narrower operand
  at::Tensor lhs = workspace({(flip ? B : A).size(1), R}, A.options()).copy_((flip ? B : A).t());  // [M, R]
  at::Tensor rhs = (flip ? A : B).contiguous();              // [R, P]
  const i64 M = lhs.size(0), P = rhs.size(1);
  at::Tensor out = flip ? workspace({M, P}, A.options()) : result(M, P);  // flipped: [K, N], copied out below
  constexpr i64 MB = 64, KC = 512, NB = 128;  // measured best of a grid at H = 650 and 1024
  const float* l = lhs.data_ptr<float>();
  const float* r = rhs.data_ptr<float>();
  float* o = out.data_ptr<float>();
  // the threads share out blocks of MB output rows; where there are fewer blocks than threads (a round's factor:
  // M = k = 64 is one block), blocks of NB output columns instead. Each output tile sums its KC-row chunks in
  // the same order and with the same calls either way.
  const i64 row_blocks = (M + MB - 1) / MB, column_blocks = (P + NB - 1) / NB;
  const bool by_columns = row_blocks < at::get_num_threads() && column_blocks > row_blocks;
  at::parallel_for(0, by_columns ? column_blocks : row_blocks, 1, [&](i64 b0, i64 b1) {
    DenormalScope denormals;
    const i64 mb0 = by_columns ? 0 : b0, mb1 = by_columns ? row_blocks : b1;
    const i64 pb0 = by_columns ? b0 : 0, pb1 = by_columns ? b1 : column_blocks;
    for (i64 k0 = 0; k0 < R; k0 += KC) {
      const i64 kc = std::min(KC, R - k0);
      for (i64 mb = mb0; mb < mb1; ++mb) {
        const i64 m0 = mb * MB, rows = std::min(MB, M - m0);
        for (i64 pb = pb0; pb < pb1; ++pb) {
          const i64 p0 = pb * NB, w = std::min(NB, P - p0);
#ifdef CPUBLAS_BRGEMM_F32F32F32
          at::native::cpublas::brgemm(rows, w, kc, R, P, P, k0 > 0, l + m0 * R + k0, r + k0 * P + p0,
                                      o + m0 * P + p0, false);
#endif
        }
      }
    }
  });
  return flip ? result(N, K).copy_(out.t()) : out;
}

// ---------------------------------------------------------------------------------------------------
// Batch-parallel loops
// ---------------------------------------------------------------------------------------------------

// Run fn(b0, b1, single) over blocks of batch rows, one block per thread. ``single`` tells the body that
// it runs inside a parallel region (its products must be single-threaded). With few rows (fewer than
// ``min_rows`` per thread) one block runs on the calling thread and its products may use every thread.
template <typename F>
inline void for_row_blocks(i64 B, i64 min_rows, const F& fn) {
  const i64 threads = std::max<i64>(1, std::min<i64>(at::get_num_threads(), B / std::max<i64>(min_rows, 1)));
  if (threads <= 1) {
    fn(i64(0), B, false);
    return;
  }
  const i64 grain = (B + threads - 1) / threads;
  at::parallel_for(0, B, grain, [&](i64 b0, i64 b1) {
    ThreadGemmScope scope(true);
    DenormalScope denormals;
    fn(b0, b1, true);
  });
}

// ---------------------------------------------------------------------------------------------------
// Column-split loops
// ---------------------------------------------------------------------------------------------------
//
// The batch-parallel loop gives each thread a block of batch rows and the whole weight, so every thread
// streams every weight at every step with its few rows (32 of 64 on two threads). Splitting a step's gate
// product by output units instead gives each thread every row and its own block of the weight: half the
// weight traffic per thread and twice the rows per weight panel. The price is synchronisation: a step's
// gate product needs every row's [x_up; h_up], and the next step's rounds every unit of h, so the threads
// meet at a barrier between the phases (two per step forward, three backward). Measured on two cores of an
// Intel Xeon (AMX, float32, B = 64, ``moglm bench gemm-routes``): the forward gate product at 350 GFLOP/s
// split by columns against at most 242 by rows at H = 1024, 349 against 314 at H = 650, 376 against 353
// at H = 256 (docs/fused-recurrence.md). The window's route code carries the choice (``COLUMNS``), which
// ``auto`` probes per shape class; the Mogrifier's rounds (narrow products on each row's own chain) stay
// split by rows, between the barriers.

//: the flag, added to a route code, that asks the LSTM window to split its gate products by columns
constexpr int64_t COLUMNS = 8;

// A window's per-step routes, from the code the ops take: bits 0-2 the gate products' route, bit 3
// ``COLUMNS``, bits 4-6 the Mogrifier rounds' route plus one (0: the gates' route), since which route runs
// the narrow round products fastest need not be the one for the wide gate products.
struct StepRoutes {
  Route gates, rounds;
  bool columns;
};

inline StepRoutes decode_routes(int64_t code) {
  const Route gates = Route(code & 7);
  const int64_t rounds = (code >> 4) & 7;
  return {gates, rounds == 0 ? gates : Route(rounds - 1), (code & COLUMNS) != 0};
}

// A spinning barrier over P partitions, where each arriving thread counts for the partitions it runs
// (more than one when OpenMP gave the region fewer threads than asked): it opens when all P arrived. A
// thread that fails calls ``abort``, and the others leave their wait with ``Aborted`` instead of waiting
// for it forever.
struct TeamBarrier {
  struct Aborted : std::runtime_error {
    Aborted() : std::runtime_error("moglm: another thread of the column-split window failed") {}
  };
  alignas(64) std::atomic<i64> arrived{0};
  alignas(64) std::atomic<i64> generation{0};
  std::atomic<bool> aborted{false};
  const i64 total;
  explicit TeamBarrier(i64 total_) : total(total_) {}
  void abort() { aborted.store(true, std::memory_order_release); }
  void wait(i64 weight) {
    const i64 gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(weight, std::memory_order_acq_rel) + weight == total) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_release);
      return;
    }
    for (i64 spins = 0; generation.load(std::memory_order_acquire) == gen; ++spins) {
      if (aborted.load(std::memory_order_acquire)) throw Aborted();
      if (spins > 4096) std::this_thread::yield();  // the other thread was descheduled
#if defined(__x86_64__) || defined(__i386__)
      else __builtin_ia32_pause();
#endif
    }
  }
};

// [lo, hi) of the p-th of P blocks of n columns, block edges on multiples of ``align`` (but the last)
inline std::pair<i64, i64> column_block(i64 n, i64 p, i64 P, i64 align) {
  const i64 units = (n + align - 1) / align;
  const i64 lo = std::min(n, (units * p / P) * align), hi = p + 1 == P ? n : std::min(n, (units * (p + 1) / P) * align);
  return {lo, hi};
}

// block edges for n columns over P threads: whole 64-wide panels of the brgemm route where the blocks are wide
inline i64 column_align(i64 n, i64 P) { return n >= 128 * P ? 64 : 16; }

// The rows of a gate weight W [4n, k] (torch's gate order [i, f, j, o]) for units [u0, u1) of each gate,
// together: [4 (u1 - u0), k], so that a block's gates are one product
inline at::Tensor gate_rows(const at::Tensor& w, std::pair<i64, i64> units) {
  const i64 n = w.size(0) / 4, u0 = units.first, width = units.second - units.first;
  at::Tensor out = workspace({4 * width, w.size(1)}, w.options());
  return at::cat_out(out, {w.narrow(0, u0, width), w.narrow(0, n + u0, width), w.narrow(0, 2 * n + u0, width),
                           w.narrow(0, 3 * n + u0, width)});
}

// The partitions of a column-split window: the threads it runs on (1 where it cannot split: one thread,
// a nested parallel region, a threading backend whose tasks may not run at once, or n too narrow).
inline i64 column_partitions(i64 n) {
#if AT_PARALLEL_OPENMP
  if (at::in_parallel_region()) return 1;
  return std::max<i64>(1, std::min<i64>(at::get_num_threads(), n / 16));
#else
  (void)n;
  return 1;
#endif
}

// Run fn(p0, p1, barrier) on the threads: partitions [p0, p1) of P each (one per thread unless OpenMP gave
// fewer threads), every product inside single-threaded. ``barrier.wait(p1 - p0)`` meets the others. An
// exception in one thread (out of memory, say) releases the others and is rethrown here.
template <typename F>
inline void for_partitions(i64 P, const F& fn) {
  TeamBarrier barrier(P);
  std::exception_ptr first;
  std::mutex first_mutex;
  try {
    at::parallel_for(0, P, 1, [&](i64 p0, i64 p1) {
      ThreadGemmScope scope(true);
      DenormalScope denormals;
      try {
        fn(p0, p1, barrier);
      } catch (const TeamBarrier::Aborted&) {
        throw;
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        barrier.abort();
        throw;
      }
    });
  } catch (...) {
    if (first) std::rethrow_exception(first);  // the failure itself, not another thread's release
    throw;
  }
}

// ---------------------------------------------------------------------------------------------------
// Pointwise math
// ---------------------------------------------------------------------------------------------------

// exp for float without branches or calls, so loops using it vectorise: Cody-Waite range reduction
// x = n ln2 + r, |r| <= ln2/2, and a degree-6 polynomial for e^r (relative error ~2e-7, about 1-2 ulp).
inline float exp_f(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // round to nearest by the 1.5 * 2^23 trick (no call, so the loop vectorises; never built with fast-math)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f;  // ln2 high part (exact product)
  r = r - n * 1.42860682030941723212e-6f;  // ln2 low part
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * __builtin_bit_cast(float, bits);
}

template <typename T>
inline T sigmoid(T x);
template <>
inline float sigmoid<float>(float x) { return 1.0f / (1.0f + exp_f(-x)); }
template <>
inline double sigmoid<double>(double x) { return 1.0 / (1.0 + std::exp(-x)); }

template <typename T>
inline T tanh_(T x) { return T(2) * sigmoid<T>(T(2) * x) - T(1); }
template <>
inline double tanh_<double>(double x) { return std::tanh(x); }

// LSTM cell forward for rows of one step, torch's gate order [i, f, j, o] (Mogrifier paper, section 2):
//   g (in: pre-activations without bias, out: activations), ld 4n;  c = f c_prev + i j (capped:
//   min(1 - f, i) j);  h = o tanh(c).  c_prev and c_out may alias (in-place update). ``w`` units of each row
//   (all n, or one thread's column block: pointers then start at its first unit; c and h have ld n, the
//   bias gate stride n), the gates ``gs`` apart in g (n, or w in a block's own gate buffer).
template <typename T, bool Capped>
inline void cell_forward_(i64 rows, i64 n, i64 w, i64 gs, T* g, i64 ldg, const T* bias, const T* c_prev,
                          T* c_out, T* h_out, i64 ldh) {
  for (i64 r = 0; r < rows; ++r) {
    T* gi = g + r * ldg;
    T* gf = gi + gs;
    T* gj = gi + 2 * gs;
    T* go = gi + 3 * gs;
    const T* cp = c_prev + r * n;
    T* co = c_out + r * n;
    T* ho = h_out + r * ldh;
    if (bias != nullptr) {
#pragma GCC ivdep
      for (i64 k = 0; k < w; ++k) {
        gi[k] += bias[k];
        gf[k] += bias[n + k];
        gj[k] += bias[2 * n + k];
        go[k] += bias[3 * n + k];
      }
    }
#pragma GCC ivdep
    for (i64 k = 0; k < w; ++k) {
      const T i = sigmoid<T>(gi[k]);
      const T f = sigmoid<T>(gf[k]);
      const T j = tanh_<T>(gj[k]);
      const T o = sigmoid<T>(go[k]);
      const T omf = T(1) - f;
      const T ii = Capped ? (omf < i ? omf : i) : i;
      const T c = f * cp[k] + ii * j;
      gi[k] = i;
      gf[k] = f;
      gj[k] = j;
      go[k] = o;
      co[k] = c;
      ho[k] = o * tanh_<T>(c);
    }
  }
}

template <typename T>
inline void cell_forward(i64 rows, i64 n, T* g, i64 ldg, const T* bias, const T* c_prev, T* c_out, T* h_out,
                         i64 ldh, bool capped, i64 w = -1, i64 gs = -1) {
  w = w < 0 ? n : w;
  gs = gs < 0 ? n : gs;
  if (capped)
    cell_forward_<T, true>(rows, n, w, gs, g, ldg, bias, c_prev, c_out, h_out, ldh);
  else
    cell_forward_<T, false>(rows, n, w, gs, g, ldg, bias, c_prev, c_out, h_out, ldh);
}

// LSTM cell backward for rows of one step. In: activations ``act`` (ld 4n), c_prev, c_t, dL/dh_t (all of
// it) ``dh``, and ``dc`` = dL/dc_t carried from step t+1. Out: pre-activation gradient ``dg`` (ld 4n) and
// ``dc`` overwritten with dL/dc_{t-1}. torch.minimum's derivative: all to the smaller argument, half to
// each on a tie.
template <typename T, bool Capped>
inline void cell_backward_(i64 rows, i64 n, i64 w, const T* act, const T* c_prev, const T* c_t, const T* dh,
                           T* dc, T* dg) {
  for (i64 r = 0; r < rows; ++r) {
    const T* ai = act + r * 4 * n;
    const T* af = ai + n;
    const T* aj = ai + 2 * n;
    const T* ao = ai + 3 * n;
    const T* cp = c_prev + r * n;
    const T* ct = c_t + r * n;
    const T* dhr = dh + r * n;
    T* dcr = dc + r * n;
    T* gi = dg + r * 4 * n;
    T* gf = gi + n;
    T* gj = gi + 2 * n;
    T* go = gi + 3 * n;
#pragma GCC ivdep
    for (i64 k = 0; k < w; ++k) {
      const T i = ai[k], f = af[k], j = aj[k], o = ao[k];
      const T tc = tanh_<T>(ct[k]);
      const T d_o = dhr[k] * tc;
      const T dcell = dhr[k] * o * (T(1) - tc * tc) + dcr[k];
      T d_i, d_f, d_j;
      if constexpr (Capped) {
        const T omf = T(1) - f;
        const T d_min = dcell * j;
        const T share_i = i < omf ? T(1) : (i == omf ? T(0.5) : T(0));
        d_i = d_min * share_i;
        d_f = dcell * cp[k] - (d_min - d_i);
        d_j = dcell * (omf < i ? omf : i);
      } else {
        d_i = dcell * j;
        d_f = dcell * cp[k];
        d_j = dcell * i;
      }
      gi[k] = d_i * i * (T(1) - i);
      gf[k] = d_f * f * (T(1) - f);
      gj[k] = d_j * (T(1) - j * j);
      go[k] = d_o * o * (T(1) - o);
      dcr[k] = dcell * f;
    }
  }
}

template <typename T>
inline void cell_backward(i64 rows, i64 n, const T* act, const T* c_prev, const T* c_t, const T* dh, T* dc,
                          T* dg, bool capped, i64 w = -1) {
  w = w < 0 ? n : w;
  if (capped)
    cell_backward_<T, true>(rows, n, w, act, c_prev, c_t, dh, dc, dg);
  else
    cell_backward_<T, false>(rows, n, w, act, c_prev, c_t, dh, dc, dg);
}

// One mogrifier round (Mogrifier paper, eq. 1-2) for rows of one step:
//   s = sigmoid(p + bias) (p in ``s``, overwritten with s);  new = 2 s * old.
template <typename T>
inline void round_forward(i64 rows, i64 w, T* s, i64 lds, const T* bias, const T* old, i64 ldo, T* out, i64 ldn) {
  for (i64 r = 0; r < rows; ++r) {
    T* sr = s + r * lds;
    const T* o = old + r * ldo;
    T* nw = out + r * ldn;
    if (bias != nullptr) {
#pragma GCC ivdep
      for (i64 k = 0; k < w; ++k) sr[k] += bias[k];
    }
#pragma GCC ivdep
    for (i64 k = 0; k < w; ++k) {
      const T v = sigmoid<T>(sr[k]);
      sr[k] = v;
      nw[k] = T(2) * v * o[k];
    }
  }
}

// Its derivative: from g = dL/d new (overwritten with dL/d old = 2 s g), dp = g old 2 s (1 - s).
template <typename T>
inline void round_backward(i64 rows, i64 w, T* g, i64 ldg, const T* old, i64 ldo, const T* s, i64 lds, T* dp,
                           i64 ldp) {
  for (i64 r = 0; r < rows; ++r) {
    T* gr = g + r * ldg;
    const T* o = old + r * ldo;
    const T* sr = s + r * lds;
    T* d = dp + r * ldp;
#pragma GCC ivdep
    for (i64 k = 0; k < w; ++k) {
      const T two_s = T(2) * sr[k];
      d[k] = gr[k] * o[k] * two_s * (T(1) - sr[k]);
      gr[k] = gr[k] * two_s;
    }
  }
}

// out = a * b (rows of width w, each with its own leading dimension); out may alias a.
template <typename T>
inline void mul_rows(i64 rows, i64 w, const T* a, i64 lda, const T* b, i64 ldb, T* out, i64 ldo) {
  for (i64 r = 0; r < rows; ++r) {
    const T* ar = a + r * lda;
    const T* br = b + r * ldb;
    T* o = out + r * ldo;
#pragma GCC ivdep
    for (i64 k = 0; k < w; ++k) o[k] = ar[k] * br[k];
  }
}

// out = a + b (rows of width w); out may alias a or b.
template <typename T>
inline void add_rows(i64 rows, i64 w, const T* a, i64 lda, const T* b, i64 ldb, T* out, i64 ldo) {
  for (i64 r = 0; r < rows; ++r) {
    const T* ar = a + r * lda;
    const T* br = b + r * ldb;
    T* o = out + r * ldo;
#pragma GCC ivdep
    for (i64 k = 0; k < w; ++k) o[k] = ar[k] + br[k];
  }
}

template <typename T>
inline void copy_rows(i64 rows, i64 w, const T* a, i64 lda, T* out, i64 ldo) {
  for (i64 r = 0; r < rows; ++r) std::memcpy(out + r * ldo, a + r * lda, sizeof(T) * w);
}

// Units [u0, u0 + w) of each gate between a step's gates in torch's layout (``a``: [B, 4n], the gates n
// apart) and a block's own gate buffer (``g``: [B, 4w], the gates w apart, as ``gate_rows`` orders them):
// into the block (``to_block``) or back.
template <typename T>
inline void copy_gate_block(i64 B, i64 n, i64 u0, i64 w, T* a, T* g, bool to_block) {
  for (i64 k = 0; k < 4; ++k) {
    if (to_block)
      copy_rows(B, w, a + k * n + u0, 4 * n, g + k * w, 4 * w);
    else
      copy_rows(B, w, g + k * w, 4 * w, a + k * n + u0, 4 * n);
  }
}

// ---------------------------------------------------------------------------------------------------
// Small helpers for the op wrappers
// ---------------------------------------------------------------------------------------------------

inline const at::Tensor& checked(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined() && t.is_contiguous() && t.device().is_cpu(), "moglm compiled recurrence: ", name,
              " must be a contiguous CPU tensor");
  return t;
}

// The shapes a window relies on (it reads raw memory): input [T, B, m], states [B, n], the mask [B, n],
// W_ih [4n, m], W_hh [4n, n], the bias [4n]; all of one dtype on the CPU.
inline void check_window(const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& mask,
                         const at::Tensor& w_ih, const at::Tensor& w_hh, const at::Tensor& bias) {
  checked(xs, "input");
  TORCH_CHECK(xs.dim() == 3 && xs.size(0) > 0, "moglm compiled recurrence: input must be [T, B, m] with T >= 1");
  const i64 B = xs.size(1), m = xs.size(2), n = h0.dim() == 2 ? h0.size(1) : -1;
  auto expect = [&](const at::Tensor& t, std::vector<i64> shape, const char* name) {
    TORCH_CHECK(t.sizes() == at::IntArrayRef(shape) && t.scalar_type() == xs.scalar_type() && t.device().is_cpu(),
                "moglm compiled recurrence: ", name, " must be ", at::IntArrayRef(shape), " ", xs.scalar_type(),
                " on the CPU, got ", t.sizes(), " ", t.scalar_type());
  };
  expect(h0, {B, n}, "h0");
  expect(c0, {B, n}, "c0");
  if (mask.defined()) expect(mask, {B, n}, "the state-dropout mask");
  expect(w_ih, {4 * n, m}, "weight_ih");
  expect(w_hh, {4 * n, n}, "weight_hh");
  if (bias.defined()) expect(bias, {4 * n}, "the bias");
}

template <typename T>
inline T* ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

inline at::Tensor opt(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// ---------------------------------------------------------------------------------------------------
// Sparse dynamic evaluation's adaptation (Krause's thesis, section 4.6, eq. 4.8): after every step the
// first U units of h become h_U + M h_U, as output and as carried state. M is [U, U] (one for every row)
// or [B, U, U] (one per row).
// ---------------------------------------------------------------------------------------------------

template <typename T>
struct Adaptation {
  const T* m = nullptr;  // null: no adaptation
  i64 units = 0;
  bool per_row = false;

  Adaptation() = default;
  explicit Adaptation(const at::Tensor& matrix)
      : m(matrix.defined() ? matrix.data_ptr<T>() : nullptr),
        units(matrix.defined() ? matrix.size(-1) : 0),
        per_row(matrix.defined() && matrix.dim() == 3) {}

  // h[:, :U] += M h[:, :U] for rows [b0, b0 + rows) of a step; ``tmp`` holds rows x U scratch
  void forward(Route route, i64 rows, i64 b0, T* h, i64 ldh, T* tmp) const {
    if (m == nullptr) return;
    const i64 U = units;
    if (per_row) {
      for (i64 r = 0; r < rows; ++r) {
        const T* M = m + (b0 + r) * U * U;
        for (i64 i = 0; i < U; ++i) {
          T acc = 0;
          for (i64 j = 0; j < U; ++j) acc += M[i * U + j] * h[r * ldh + j];
          tmp[r * U + i] = acc;
        }
      }
    } else {
      gemm<T>(route, false, true, rows, U, U, h, ldh, m, U, T(0), tmp, U);  // h_U M^T
    }
    add_rows(rows, U, h, ldh, tmp, U, h, ldh);
  }

  // from dh' (in ``dh``, first U units also copied to ``dprime``): dh[:, :U] = dh'_U + M^T dh'_U per row
  void backward(Route route, i64 rows, i64 b0, T* dh, i64 ldh, T* dprime, i64 ldp) const {
    if (m == nullptr) return;
    const i64 U = units;
    copy_rows(rows, U, dh, ldh, dprime, ldp);
    if (per_row) {
      for (i64 r = 0; r < rows; ++r) {
        const T* M = m + (b0 + r) * U * U;
        const T* d = dprime + r * ldp;
        for (i64 i = 0; i < U; ++i) {
          const T di = d[i];
          T* out = dh + r * ldh;
          for (i64 j = 0; j < U; ++j) out[j] += M[i * U + j] * di;
        }
      }
    } else {
      gemm<T>(route, false, false, rows, U, U, dprime, ldp, m, U, T(1), dh, ldh);  // += dh'_U M
    }
  }
};

// dL/dM from dh'_U [T, B, U] and the unadapted h_U = o * tanh(c) (recomputed from the saved gate
// activations [T, B, 4n] and cells [T, B, n]): [U, U], or [B, U, U] per row.
inline at::Tensor adaptation_grad(const at::Tensor& dprime, const at::Tensor& acts, const at::Tensor& cs,
                                  const at::Tensor& matrix) {
  const i64 U = matrix.size(-1), n = cs.size(2);
  at::Tensor h = acts.narrow(2, 3 * n, U) * at::tanh(cs.narrow(2, 0, U));  // [T, B, U]
  if (matrix.dim() == 3) return at::einsum("tbi,tbj->bij", {dprime, h});
  return at::mm(dprime.reshape({-1, U}).t(), h.reshape({-1, U}));
}

// ---------------------------------------------------------------------------------------------------
// The LSTM cell's part of a window, the same in every window: forward, c_t (all of them saved, or one
// running c updated in place) and h_t, then the adaptation; backward, dL/dh_t = dy_t + the carried
// gradient, through the adaptation, then the cell's derivative carrying dL/dc.
// ---------------------------------------------------------------------------------------------------

template <typename T>
struct CellForward {
  i64 T_, B, n;
  bool save, capped;
  Route route;
  at::Tensor ys, cs, adapt_tmp;  // h [T, B, n]; c [T, B, n] (save) or the running c [B, n]; scratch
  const T *c0, *bias;
  Adaptation<T> adaptation;

  CellForward(const at::Tensor& xs, const at::Tensor& c0_, const at::Tensor& bias_, const at::Tensor& adapt, i64 n_,
              bool save_, bool capped_, Route route_)
      : T_(xs.size(0)), B(xs.size(1)), n(n_), save(save_), capped(capped_), route(route_),
        ys(at::empty({T_, B, n_}, xs.options())),
        cs(save_ ? workspace({T_, B, n_}, xs.options()) : c0_.clone()),
        c0(c0_.data_ptr<T>()), bias(bias_.defined() ? bias_.data_ptr<T>() : nullptr), adaptation(adapt) {
    adapt_tmp = at::empty({B, std::max<i64>(adaptation.units, 1)}, xs.options());
  }

  // g: the rows' gate pre-activations of step t (ld 4n), activated in place; writes c_t and h_t
  void step(i64 t, i64 b0, i64 rows, T* g) const {
    T* c = cs.data_ptr<T>();
    const T* cp = save ? (t == 0 ? c0 + b0 * n : c + ((t - 1) * B + b0) * n) : c + b0 * n;
    T* co = save ? c + (t * B + b0) * n : c + b0 * n;
    T* h = ys.data_ptr<T>() + (t * B + b0) * n;
    cell_forward(rows, n, g, 4 * n, bias, cp, co, h, n, capped);
    adaptation.forward(route, rows, b0, h, n, adapt_tmp.data_ptr<T>() + b0 * adaptation.units);
  }

  // step t of every row for units [u0, u0 + w) (a column-split window; no adaptation): g holds their gate
  // pre-activations, the block's own [B, 4w] (gates w apart, ld 4w)
  void step_units(i64 t, i64 u0, i64 w, T* g) const {
    T* c = cs.data_ptr<T>();
    const T* cp = save ? (t == 0 ? c0 : c + (t - 1) * B * n) : c;
    T* co = save ? c + t * B * n : c;
    cell_forward(B, n, g, 4 * w, bias == nullptr ? nullptr : bias + u0, cp + u0, co + u0,
                 ys.data_ptr<T>() + t * B * n + u0, n, capped, w, w);
  }

  // [ys, h_T, c_T]
  std::vector<at::Tensor> outputs() const { return {ys, ys[T_ - 1].clone(), save ? cs[T_ - 1].clone() : cs}; }
};

template <typename T>
struct CellBackward {
  i64 B, n;
  bool capped;
  Route route;
  const T *c0, *c, *acts, *dy;
  Adaptation<T> adaptation;
  at::Tensor dh_next, dc, dh, d_adapted;  // dL/dh carried to step t-1 [B, n]; dL/dc [B, n]; scratch; dh'_U

  CellBackward(const at::Tensor& c0_, const at::Tensor& cs, const at::Tensor& acts_, const at::Tensor& dys,
               const at::Tensor& dhT, const at::Tensor& dcT, const at::Tensor& adapt, bool capped_, Route route_)
      : B(cs.size(1)), n(cs.size(2)), capped(capped_), route(route_), c0(c0_.data_ptr<T>()), c(cs.data_ptr<T>()),
        acts(acts_.data_ptr<T>()), dy(dys.defined() ? dys.data_ptr<T>() : nullptr), adaptation(adapt) {
    dh_next = dhT.defined() ? dhT.clone() : at::zeros({B, n}, cs.options());
    dc = dcT.defined() ? dcT.clone() : at::zeros({B, n}, cs.options());
    dh = at::empty({B, n}, cs.options());
    d_adapted = adapt.defined() ? workspace({cs.size(0), B, adaptation.units}, cs.options()) : at::Tensor();
  }

  // dL/dh_{t-1} of rows [b0, ...): where the window writes the gradient it carries back (ld n)
  T* carried(i64 b0) const { return dh_next.data_ptr<T>() + b0 * n; }

  // step t of rows [b0, ...): dL/dh_t = dy_t + carried, through the adaptation, then the cell's derivative
  // into dg (ld 4n) with dL/dc carried to step t-1
  void step(i64 t, i64 b0, i64 rows, T* dg) const {
    T* dhr = dh.data_ptr<T>() + b0 * n;
    if (dy != nullptr)
      add_rows(rows, n, dy + (t * B + b0) * n, n, carried(b0), n, dhr, n);
    else
      copy_rows(rows, n, carried(b0), n, dhr, n);
    adaptation.backward(route, rows, b0, dhr, n,
                        d_adapted.defined() ? d_adapted.data_ptr<T>() + (t * B + b0) * adaptation.units : nullptr,
                        adaptation.units);
    const T* cp = t == 0 ? c0 + b0 * n : c + ((t - 1) * B + b0) * n;
    cell_backward(rows, n, acts + (t * B + b0) * 4 * n, cp, c + (t * B + b0) * n, dhr, dc.data_ptr<T>() + b0 * n,
                  dg, capped);
  }

  // step t of every row for units [u0, u0 + w) (a column-split window; no adaptation); dg: the step's
  // [B, 4n], unit 0
  void step_units(i64 t, i64 u0, i64 w, T* dg) const {
    T* dhr = dh.data_ptr<T>() + u0;
    if (dy != nullptr)
      add_rows(B, w, dy + t * B * n + u0, n, carried(0) + u0, n, dhr, n);
    else
      copy_rows(B, w, carried(0) + u0, n, dhr, n);
    const T* cp = t == 0 ? c0 : c + (t - 1) * B * n;
    cell_backward(B, n, acts + t * B * 4 * n + u0, cp + u0, c + t * B * n + u0, dhr, dc.data_ptr<T>() + u0,
                  dg + u0, capped, w);
  }
};

// h_{t-1} for every t, times the state-dropout mask when there is one: [T, B, n].
inline at::Tensor h_tilde_all(const at::Tensor& h0, const at::Tensor& ys, const at::Tensor& mask) {
  at::Tensor hp = workspace(ys.sizes(), ys.options());
  hp[0].copy_(h0);
  hp.narrow(0, 1, ys.size(0) - 1).copy_(ys.narrow(0, 0, ys.size(0) - 1));
  return mask.defined() ? hp.mul_(mask) : hp;
}

}  // namespace moglm
