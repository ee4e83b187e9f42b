// The multiplicative LSTM window, forward and backward (Krause's thesis, section 3.3, eq. 3.5-3.9).
//
//   h~ = h_{t-1} * mask                                     variational state dropout (optional)
//   m_t = (W_mx x_t) * (W_mh h~)                            eq. 3.5
//   [i, f, j, o] = W_ih x_t + W_hh m_t + b                  an LSTM with m_t in place of h_{t-1}
//
// W_mx x and W_ih x do not depend on the recurrence, so they are two products over all T*B rows before
// the loop (the thesis's mLSTM allows it: x enters only through them). The batch-parallel loop (window.h),
// each weight packed once per window, then runs per step only W_mh h~, m_t, W_hh m_t and the cell.
// Backward per step: the cell's derivative, dG @ W_hh giving dm, and W_mh's data gradient; the input's
// gradient (dG W_ih + d(W_mx x) W_mx) and the four weight gradients are products over all T*B rows after
// the loop. With ``COLUMNS`` in the route code the loop is split by units instead (window.h, "Column-split
// loops"): per step m_t for a thread's block of units over every row, a barrier, its units' gates and cell.
// Saved: gate activations [T, B, 4n], c [T, B, n], m [T, B, n], W_mx x and W_mh h~ ([T, B, n]); h~ is
// recomputed.

#include "window.h"

#include <torch/library.h>

#include <chrono>
#include <vector>

namespace moglm {
namespace {

template <typename T>
std::vector<at::Tensor> forward_impl(const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& mask, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                     const at::Tensor& bias, const at::Tensor& w_mx, const at::Tensor& w_mh,
                                     bool capped, bool save, const StepRoutes& routes, i64 min_rows,
                                     const at::Tensor& adapt) {
  const Route route = routes.gates;
  const i64 T_ = xs.size(0), B = xs.size(1), m = xs.size(2), n = h0.size(1);
  const i64 S = save ? T_ : 1;
  auto opts = xs.options();
  const CellForward<T> cell(xs, c0, bias, adapt, n, save, capped, route);
  // what does not depend on the recurrence, for every step at once (eq. 3.5's W_mx x; W_ih x)
  const at::Tensor xs2 = xs.view({T_ * B, m});
  at::Tensor px = product<T>(route, xs2, w_mx, true, workspace({T_ * B, n}, opts)).view({T_, B, n});  // W_mx x
  at::Tensor acts =  // W_ih x, then the gates
      product<T>(route, xs2, w_ih, true, workspace({T_ * B, 4 * n}, opts)).view({T_, B, 4 * n});
  at::Tensor ms = workspace({S, B, n}, opts);  // m_t
  at::Tensor ph = workspace({S, B, n}, opts);  // W_mh h~
  at::Tensor htil = mask.defined() ? at::empty({B, n}, opts) : at::Tensor();
  const T* mk = ptr<T>(mask);
  const T* y = ptr<T>(cell.ys);
  PackCache cache;  // the weights packed once for all threads (brgemm route)
  const i64 P = routes.columns && !adapt.defined() ? column_partitions(n) : 1;
  if (P > 1) {
    // split by columns (window.h, "Column-split loops"): a thread computes m_t for its block of units over
    // every row, then, after a barrier, its units' gates (its rows of W_hh, gathered) and cell; h~ for the
    // next step as it writes h
    const i64 align = column_align(n, P);
    std::vector<at::Tensor> wg(P);
    for (i64 p = 0; p < P; ++p) wg[p] = gate_rows(w_hh, column_block(n, p, P, align));
    if (mk != nullptr) at::mul_out(htil, h0, mask);
    for_partitions(P, [&](i64 p0, i64 p1, TeamBarrier& barrier) {
      struct Part {
        i64 u0, w;
        std::vector<PackedB<T>> proj, gates;  // h~ -> its units of W_mh h~; m -> its units' gates
        at::Tensor g;  // its units' gates [B, 4w]
      };
      std::vector<Part> parts;
      for (i64 p = p0; p < p1; ++p) {
        auto [u0, u1] = column_block(n, p, P, align);
        const i64 w = u1 - u0;
        Part part{u0, w, {}, {}, at::empty({B, 4 * w}, opts)};
        part.proj.emplace_back(route, B, w, n, ptr<T>(w_mh) + u0 * n, n, true, T_);
        part.gates.emplace_back(route, B, 4 * w, n, ptr<T>(wg[p]), n, true, T_);
        parts.push_back(std::move(part));
      }
      for (i64 t = 0; t < T_; ++t) {
        const i64 o = (save ? t : 0) * B * n;
        const T* hp = mk != nullptr ? ptr<T>(htil) : t == 0 ? ptr<T>(h0) : y + (t - 1) * B * n;
        for (auto& q : parts) {
          q.proj[0](B, hp, n, T(0), ptr<T>(ph) + o + q.u0, n);  // W_mh h~
          mul_rows(B, q.w, ptr<T>(px) + t * B * n + q.u0, n, ptr<T>(ph) + o + q.u0, n, ptr<T>(ms) + o + q.u0, n);
        }
        barrier.wait(p1 - p0);
        T* a = ptr<T>(acts) + t * B * 4 * n;  // holds W_ih x_t
        for (auto& q : parts) {
          T* g = ptr<T>(q.g);
          copy_gate_block(B, n, q.u0, q.w, a, g, true);
          q.gates[0](B, ptr<T>(ms) + o, n, T(1), g, 4 * q.w);
          cell.step_units(t, q.u0, q.w, g);
          if (save)  // the activations, where the backward reads them
            copy_gate_block(B, n, q.u0, q.w, a, g, false);
          if (mk != nullptr)  // the next step's h~
            mul_rows(B, q.w, y + t * B * n + q.u0, n, mk + q.u0, n, ptr<T>(htil) + q.u0, n);
        }
        barrier.wait(p1 - p0);
      }
    });
  } else {
    for_row_blocks(B, min_rows, [&](i64 b0, i64 b1, bool) {
      const i64 rows = b1 - b0;
      PackedB<T> gates_m(route, rows, 4 * n, n, ptr<T>(w_hh), n, true, T_, &cache);  // m_t -> W_hh m_t
      PackedB<T> proj_h(route, rows, n, n, ptr<T>(w_mh), n, true, T_, &cache);
      for (i64 t = 0; t < T_; ++t) {
        const i64 s = save ? t : 0, o = (s * B + b0) * n;
        const T* hp = t == 0 ? ptr<T>(h0) + b0 * n : y + ((t - 1) * B + b0) * n;
        if (mk != nullptr) {
          T* ht = ptr<T>(htil) + b0 * n;
          mul_rows(rows, n, hp, n, mk + b0 * n, n, ht, n);
          hp = ht;
        }
        proj_h(rows, hp, n, T(0), ptr<T>(ph) + o, n);  // W_mh h~
        mul_rows(rows, n, ptr<T>(px) + (t * B + b0) * n, n, ptr<T>(ph) + o, n, ptr<T>(ms) + o, n);  // m_t (eq. 3.5)
        T* g = ptr<T>(acts) + (t * B + b0) * 4 * n;  // holds W_ih x_t
        gates_m(rows, ptr<T>(ms) + o, n, T(1), g, 4 * n);
        cell.step(t, b0, rows, g);
      }
    });
  }
  std::vector<at::Tensor> out = cell.outputs();
  if (save) {
    for (const auto& t : {acts, cell.cs, ms, px, ph}) out.push_back(t);
  }
  return out;
}

// Gradients: [dxs, dh0, dc0, dW_ih, dW_hh, dbias, dW_mx, dW_mh].
template <typename T>
std::vector<at::Tensor> backward_impl(const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0,
                                      const at::Tensor& mask, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                      bool has_bias, const at::Tensor& w_mx, const at::Tensor& w_mh, bool capped,
                                      const std::vector<at::Tensor>& saved, const at::Tensor& dys,
                                      const at::Tensor& dhT, const at::Tensor& dcT, bool need_dx, bool need_weights,
                                      const StepRoutes& routes, i64 min_rows, const at::Tensor& adapt,
                                      Route tn_route) {
  const Route route = routes.gates;
  const i64 T_ = xs.size(0), B = xs.size(1), m = xs.size(2), n = h0.size(1);
  auto opts = xs.options();
  const at::Tensor &ys = saved[0], &acts = saved[1], &cs = saved[2], &ms = saved[3], &px = saved[4], &ph = saved[5];
  at::Tensor dG = workspace({T_, B, 4 * n}, opts);
  at::Tensor d_px = workspace({T_, B, n}, opts);  // dL/d(W_mx x)
  at::Tensor d_ph = workspace({T_, B, n}, opts);  // dL/d(W_mh h~)
  at::Tensor dm = at::empty({B, n}, opts);
  const CellBackward<T> cell(c0, cs, acts, dys, dhT, dcT, adapt, capped, route);
  const T* mk = ptr<T>(mask);
  PackCache cache;  // the weights packed once for all threads (brgemm route)
  const i64 P = routes.columns && !adapt.defined() ? column_partitions(n) : 1;
  if (P > 1) {
    // split by columns: per step a thread runs the cell's derivative for its units, then (after a barrier)
    // dm for its units from every gate's dG, then (after another) dh~ for its units from every unit's
    // d(W_mh h~)
    const i64 align = column_align(n, P);
    for_partitions(P, [&](i64 p0, i64 p1, TeamBarrier& barrier) {
      struct Part {
        i64 u0, w;
        std::vector<PackedB<T>> d_gates_m, d_proj_h;  // dG -> its units of dm; d(W_mh h~) -> its units of dh~
      };
      std::vector<Part> parts;
      for (i64 p = p0; p < p1; ++p) {
        auto [u0, u1] = column_block(n, p, P, align);
        Part part{u0, u1 - u0, {}, {}};
        part.d_gates_m.emplace_back(route, B, u1 - u0, 4 * n, ptr<T>(w_hh) + u0, n, false, T_);
        part.d_proj_h.emplace_back(route, B, u1 - u0, n, ptr<T>(w_mh) + u0, n, false, T_);
        parts.push_back(std::move(part));
      }
      T* dhn = cell.carried(0);
      for (i64 t = T_ - 1; t >= 0; --t) {
        const i64 o = t * B * n;
        T* g = ptr<T>(dG) + t * B * 4 * n;
        for (auto& q : parts) cell.step_units(t, q.u0, q.w, g);
        barrier.wait(p1 - p0);
        for (auto& q : parts) {
          T* dmq = ptr<T>(dm) + q.u0;
          q.d_gates_m[0](B, g, 4 * n, T(0), dmq, n);
          mul_rows(B, q.w, dmq, n, ptr<T>(ph) + o + q.u0, n, ptr<T>(d_px) + o + q.u0, n);
          mul_rows(B, q.w, dmq, n, ptr<T>(px) + o + q.u0, n, ptr<T>(d_ph) + o + q.u0, n);
        }
        barrier.wait(p1 - p0);
        // no barrier after this phase: a thread writes dh~ for its own units, which only it reads next
        for (auto& q : parts) {
          q.d_proj_h[0](B, ptr<T>(d_ph) + o, n, T(0), dhn + q.u0, n);  // dL/dh~
          if (mk != nullptr) mul_rows(B, q.w, dhn + q.u0, n, mk + q.u0, n, dhn + q.u0, n);
        }
      }
    });
  } else {
    for_row_blocks(B, min_rows, [&](i64 b0, i64 b1, bool) {
      const i64 rows = b1 - b0;
      PackedB<T> d_gates_m(route, rows, n, 4 * n, ptr<T>(w_hh), n, false, T_, &cache);  // dG -> dm
      PackedB<T> d_proj_h(route, rows, n, n, ptr<T>(w_mh), n, false, T_, &cache);       // d(W_mh h~) -> dh~
      T* dmr = ptr<T>(dm) + b0 * n;
      T* dhn = cell.carried(b0);
      for (i64 t = T_ - 1; t >= 0; --t) {
        const i64 o = (t * B + b0) * n;
        T* g = ptr<T>(dG) + (t * B + b0) * 4 * n;
        cell.step(t, b0, rows, g);
        d_gates_m(rows, g, 4 * n, T(0), dmr, n);
        mul_rows(rows, n, dmr, n, ptr<T>(ph) + o, n, ptr<T>(d_px) + o, n);
        mul_rows(rows, n, dmr, n, ptr<T>(px) + o, n, ptr<T>(d_ph) + o, n);
        d_proj_h(rows, ptr<T>(d_ph) + o, n, T(0), dhn, n);  // dL/dh~
        if (mk != nullptr) mul_rows(rows, n, dhn, n, mk + b0 * n, n, dhn, n);
      }
    });
  }
  std::vector<at::Tensor> grads(9);  // the last: dL/dM of the adaptation
  if (adapt.defined()) grads[8] = adaptation_grad(cell.d_adapted, acts, cs, adapt);
  at::Tensor dG2 = dG.view({T_ * B, 4 * n});
  at::Tensor dpx2 = d_px.view({T_ * B, n});
  if (need_dx) {  // nothing in the recurrence depends on x's gradient: all steps at once
    at::Tensor dx = product<T>(route, dG2, w_ih, false);  // dG W_ih
    grads[0] = product<T>(route, dpx2, w_mx, false, dx, T(1)).view({T_, B, m});  // + d(W_mx x) W_mx
  }
  if (need_weights) {
    at::Tensor xs2 = xs.view({T_ * B, m});
    grads[3] = product_tn(tn_route, dG2, xs2);                       // [4n, m]
    grads[4] = product_tn(tn_route, dG2, ms.view({T_ * B, n}));      // [4n, n]
    if (has_bias) grads[5] = dG2.sum(0);
    grads[6] = product_tn(tn_route, dpx2, xs2);
    grads[7] = product_tn(tn_route, d_ph.view({T_ * B, n}), h_tilde_all(h0, ys, mask).view({T_ * B, n}));
  }
  grads[1] = cell.dh_next;
  grads[2] = cell.dc;
  return grads;
}

std::vector<at::Tensor> multiplicative_lstm_forward(const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0,
                                                    const std::optional<at::Tensor>& mask, const at::Tensor& w_ih,
                                                    const at::Tensor& w_hh, const std::optional<at::Tensor>& bias,
                                                    const at::Tensor& w_mx, const at::Tensor& w_mh, bool capped,
                                                    bool save, int64_t route, int64_t min_rows,
                                                    const std::optional<at::Tensor>& adapt) {
  ready_threads();
  DenormalScope denormals;  // this thread's part; each parallel body has its own (window.h)
  at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor mk = mask.has_value() ? mask->contiguous() : at::Tensor();
  check_window(xs, h0.contiguous(), c0.contiguous(), mk, w_ih, w_hh, b);
  const i64 m = xs.size(2), n = h0.size(1);
  TORCH_CHECK(w_mx.sizes() == at::IntArrayRef({n, m}) && w_mh.sizes() == at::IntArrayRef({n, n}) &&
                  w_mx.scalar_type() == xs.scalar_type() && w_mh.scalar_type() == xs.scalar_type(),
              "moglm compiled recurrence: weight_mx must be [", n, ", ", m, "] and weight_mh [", n, ", ", n, "]");
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(xs.scalar_type(), "multiplicative_lstm_forward", [&] {
    out = forward_impl<scalar_t>(xs, h0, c0, mk, w_ih.contiguous(), w_hh.contiguous(), b, w_mx.contiguous(),
                                 w_mh.contiguous(), capped, save, decode_routes(route), min_rows,
                                 adapt.has_value() ? adapt->contiguous() : at::Tensor());
  });
  return out;
}

std::vector<at::Tensor> multiplicative_lstm_backward(
    const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0, const std::optional<at::Tensor>& mask,
    const at::Tensor& w_ih, const at::Tensor& w_hh, bool has_bias, const at::Tensor& w_mx, const at::Tensor& w_mh,
    bool capped, at::TensorList saved, const std::optional<at::Tensor>& dys, const std::optional<at::Tensor>& dhT,
    const std::optional<at::Tensor>& dcT, bool need_dx, bool need_weights, int64_t route, int64_t min_rows,
    const std::optional<at::Tensor>& adapt, int64_t tn_route) {
  ready_threads();
  DenormalScope denormals;  // this thread's part; each parallel body has its own (window.h)
  std::vector<at::Tensor> sv(saved.begin(), saved.end());
  at::Tensor mk = mask.has_value() ? mask->contiguous() : at::Tensor();
  at::Tensor gy = dys.has_value() ? dys->contiguous() : at::Tensor();
  at::Tensor gh = dhT.has_value() ? dhT->contiguous() : at::Tensor();
  at::Tensor gc = dcT.has_value() ? dcT->contiguous() : at::Tensor();
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(xs.scalar_type(), "multiplicative_lstm_backward", [&] {
    out = backward_impl<scalar_t>(xs, h0, c0, mk, w_ih.contiguous(), w_hh.contiguous(), has_bias, w_mx.contiguous(),
                                  w_mh.contiguous(), capped, sv, gy, gh, gc, need_dx, need_weights, decode_routes(route),
                                  min_rows, adapt.has_value() ? adapt->contiguous() : at::Tensor(),
                                  decode_routes(tn_route < 0 ? route : tn_route).gates);
  });
  return out;
}

// Time ``reps`` calls of a row-major [rows, K] @ [N, K]^T product per thread, batch-parallel over
// ``batch`` rows as the windows run them: how the GEMM-route probe compares the routes on this machine.
// With ``COLUMNS`` in the route code, split by columns as a column-split window runs its gate products
// instead: every thread all rows of its block of the N columns, the threads meeting after each product,
// over as many threads as a window of ``units`` units splits into (default: N). ``steps``: the products of
// one window (default, or 0: all ``reps``), which packs its weights once (PackedB), so that a route that
// packs pays its packing as often as windows of that length would.
double time_gemm_route(int64_t route, int64_t batch, int64_t K, int64_t N, int64_t reps, bool dbl, int64_t units,
                       int64_t steps) {
  auto opts = at::TensorOptions().dtype(dbl ? at::kDouble : at::kFloat);
  // constant operands: the probe must not draw from torch's global generator (it would shift the user's RNG)
  at::Tensor a = at::full({batch, K}, 0.01, opts), w = at::full({N, K}, 0.02, opts), c = at::empty({batch, N}, opts);
  const bool columns = decode_routes(route).columns;
  const Route r = decode_routes(route).gates;
  const i64 P = columns ? column_partitions(units > 0 ? units : N) : 1;
  const i64 window = steps > 0 ? std::min<i64>(steps, reps) : reps;
  double seconds = 0;
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "time_gemm_route", [&] {
    auto run = [&] {
      for (i64 done = 0; done < reps; done += window) {  // one window of ``uses`` products at a time
        const i64 uses = std::min(window, reps - done);
        PackCache cache;
        if (P > 1) {
          for_partitions(P, [&](i64 p0, i64 p1, TeamBarrier& barrier) {
            std::vector<PackedB<scalar_t>> ops;
            std::vector<i64> lo;
            for (i64 p = p0; p < p1; ++p) {
              auto [c0, c1] = column_block(N, p, P, column_align(N, P));
              ops.emplace_back(r, batch, c1 - c0, K, ptr<scalar_t>(w) + c0 * K, K, true, uses);
              lo.push_back(c0);
            }
            for (i64 i = 0; i < uses; ++i) {
              for (size_t j = 0; j < ops.size(); ++j)
                ops[j](batch, ptr<scalar_t>(a), K, scalar_t(0), ptr<scalar_t>(c) + lo[j], N);
              barrier.wait(p1 - p0);
            }
          });
          continue;
        }
        for_row_blocks(batch, 1, [&](i64 b0, i64 b1, bool) {
          PackedB<scalar_t> op(r, b1 - b0, N, K, ptr<scalar_t>(w), K, true, uses, &cache);
          for (i64 i = 0; i < uses; ++i)
            op(b1 - b0, ptr<scalar_t>(a) + b0 * K, K, scalar_t(0), ptr<scalar_t>(c) + b0 * N, N);
        });
      }
    };
    run();  // warm-up
    auto start = std::chrono::steady_clock::now();
    run();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  return seconds;
}

// Time ``reps`` weight-gradient products A^T B (A [rows, N], B [rows, K]) as the backward runs them after
// the loop on ``route`` (``product_tn``): how ``moglm bench gemm-routes`` compares them.
double time_product_tn(int64_t route, int64_t rows, int64_t N, int64_t K, int64_t reps) {
  auto opts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor a = at::full({rows, N}, 0.01, opts), b = at::full({rows, K}, 0.02, opts);
  product_tn(Route(route), a, b);  // warm-up
  auto start = std::chrono::steady_clock::now();
  for (i64 r = 0; r < reps; ++r) product_tn(Route(route), a, b);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool blas_route_available(bool dbl) { return blas_available(dbl ? at::kDouble : at::kFloat); }

bool mkl_thread_control_available() { return mkl_local_threads_available(); }

bool packed_gemm_available() { return packed_available(); }

bool brgemm_route_available() { return brgemm_available(); }

// How many threads a column-split window over n units runs on here (1: it runs batch-parallel instead).
int64_t column_partitions_op(int64_t n) { return column_partitions(n); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(moglm, m) {
  m.def(
      "multiplicative_lstm_forward(Tensor xs, Tensor h0, Tensor c0, Tensor? mask, Tensor w_ih, Tensor w_hh, "
      "Tensor? bias, Tensor w_mx, Tensor w_mh, bool capped, bool save, int route, int min_rows, "
      "Tensor? adapt=None) -> Tensor[]");
  m.def(
      "multiplicative_lstm_backward(Tensor xs, Tensor h0, Tensor c0, Tensor? mask, Tensor w_ih, Tensor w_hh, "
      "bool has_bias, Tensor w_mx, Tensor w_mh, bool capped, Tensor[] saved, Tensor? dys, Tensor? dhT, Tensor? dcT, "
      "bool need_dx, bool need_weights, int route, int min_rows, Tensor? adapt=None, int tn_route=-1) -> Tensor[]");
  m.def("time_gemm_route(int route, int batch, int K, int N, int reps, bool dbl, int units=-1, int steps=0) -> float",
        &time_gemm_route);
  m.def("column_partitions(int n) -> int", &column_partitions_op);
  m.def("time_product_tn(int route, int rows, int N, int K, int reps) -> float", &time_product_tn);
  m.def("blas_route_available(bool dbl) -> bool", &blas_route_available);
  m.def("mkl_thread_control_available() -> bool", &mkl_thread_control_available);
  m.def("packed_gemm_available() -> bool", &packed_gemm_available);
  m.def("brgemm_route_available() -> bool", &brgemm_route_available);
  m.def("workspace_cache_stats() -> int[]", [] { return WorkspaceCache::get().stats(); });
  m.def("workspace_cache_clear() -> ()", [] { WorkspaceCache::get().clear(); });
  // the windows' denormals-are-zero switch (window.h, DenormalScope): sets it, returns what it was
  m.def("set_flush_denormals(bool on) -> bool", [](bool on) { return flush_denormals_switch().exchange(on); });
  m.def("flush_denormals_enabled() -> bool", [] { return bool(MOGLM_HAS_MXCSR) && flush_denormals_switch().load(); });
  m.def("flush_denormals_supported() -> bool", [] { return bool(MOGLM_HAS_MXCSR); });
  m.def("set_blocked_products(bool on) -> bool", [](bool on) { return blocked_products_switch().exchange(on); });
  m.def("blocked_products_enabled() -> bool", [] { return blocked_products_switch().load(); });
}

TORCH_LIBRARY_IMPL(moglm, CPU, m) {
  m.impl("multiplicative_lstm_forward", &multiplicative_lstm_forward);
  m.impl("multiplicative_lstm_backward", &multiplicative_lstm_backward);
}

}  // namespace moglm
