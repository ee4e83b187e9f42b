// The LSTM and Mogrifier LSTM window, forward and backward (Mogrifier paper, section 2, eq. 1-2).
//
//   h~ = h_{t-1} * mask                                       variational state dropout (optional)
//   odd i:  x^i = 2 sigmoid(Q_i h + a_i) * x^{i-2}            even i: h^i = 2 sigmoid(R_i x + b_i) * h^{i-2}
//   [i, f, j, o] = [x_up; h_up] @ [W_ih, W_hh]^T + b          c = f c_prev + i j,  h = o tanh(c)
//
// Forward and the backward data-gradient loop run batch-parallel (window.h), with each thread's fixed
// operands packed once per window, or with the gate products split by units over the threads and the
// rounds by rows, a barrier between (``COLUMNS`` in the route code; window.h, "Column-split loops"). Per step: the rounds (low rank: two small products each) and the
// [x_up; h_up] @ [W_ih, W_hh]^T gate product; backward per step: the cell's derivative, dG @ [W_ih, W_hh]
// giving [dx_up; dh_up], and the rounds' derivatives. The LSTM (rounds = 0) has x_up = x, which does not
// depend on the recurrence: in training W_ih x is one product over all T*B rows before the loop (a step adds
// h~ W_hh^T to it) and dx = dG W_ih one product after it. Every weight gradient is one multi-threaded product over
// all T*B rows after the loop (``product_tn``).
//
// Saved for backward (all linear in T): gate activations [T, B, 4n], c [T, B, n], [x_up; h_up]
// [T, B, m+n], per round its sigmoid [T, B, out] and (low rank) its low [T, B, k], and the intermediate
// chain values x^1..x^{nq-1} [T, B, m], h^1..h^{nr-1} [T, B, n]. h~ is recomputed.

#include "window.h"

#include <torch/library.h>

#include <vector>

namespace moglm {
namespace {

// One round's matrix, factor or bias, read where it is: a tensor given for the round (``row`` -1), or row ``row`` of
// its kind's stacked parameter. No tensor view a round: at small sizes a view a round cost more than the products.
struct RoundPart {
  at::Tensor whole;  // contiguous
  i64 row = -1;
  at::IntArrayRef sizes() const { return row < 0 ? whole.sizes() : whole.sizes().slice(1); }
  at::ScalarType scalar_type() const { return whole.scalar_type(); }
};

template <typename T>
inline T* part_ptr(const RoundPart& part) {
  return part.whole.data_ptr<T>() + (part.row < 0 ? 0 : part.row * part.whole.stride(0));
}

struct Rounds {
  i64 r = 0, nq = 0, nr = 0, rank = 0;  // rank 0: full rank
  bool zigzag = true;
  std::vector<RoundPart> mats;   // per round: full [out, in] or right factor [k, in]
  std::vector<RoundPart> lefts;  // per round (low rank): left factor [out, k]
  std::vector<RoundPart> bias;   // per round: [out] (empty list: no bias)
  bool is_q(i64 i) const { return i % 2 == 1; }        // round i (1-based) gates x
  i64 j(i64 i) const { return is_q(i) ? (i - 1) / 2 : i / 2 - 1; }  // it takes chain j to j+1
  i64 src_j(i64 i) const { return zigzag ? (is_q(i) ? j(i) : j(i) + 1) : 0; }
};

// Pointers into the per-step chain values of rows [b0, ...) at slot s: chain x (index 0..nq) and h (0..nr).
template <typename T>
struct Chains {
  std::vector<T*> x, h;
  std::vector<i64> ldx, ldh;
};

template <typename T>
std::vector<T*> pointers(const std::vector<at::Tensor>& tensors) {
  std::vector<T*> out;
  for (const at::Tensor& t : tensors) out.push_back(ptr<T>(t));
  return out;
}

template <typename T>
Chains<T> chains_at(const Rounds& R, i64 m, i64 n, i64 B, i64 t, i64 s, i64 b0, const T* xs, T* h_first,
                    i64 ld_first, const std::vector<T*>& xc, const std::vector<T*>& hc, T* xh) {
  Chains<T> c;
  const i64 mn = m + n;
  c.x.push_back(const_cast<T*>(xs) + (t * B + b0) * m);
  c.ldx.push_back(m);
  for (i64 j = 1; j < R.nq; ++j) {
    c.x.push_back(xc[j - 1] + (s * B + b0) * m);
    c.ldx.push_back(m);
  }
  c.x.push_back(xh + (s * B + b0) * mn);
  c.ldx.push_back(mn);
  c.h.push_back(h_first);
  c.ldh.push_back(ld_first);
  for (i64 j = 1; j < R.nr; ++j) {
    c.h.push_back(hc[j - 1] + (s * B + b0) * n);
    c.ldh.push_back(n);
  }
  if (R.nr > 0) {
    c.h.push_back(xh + (s * B + b0) * mn + m);
    c.ldh.push_back(mn);
  }
  return c;
}

template <typename T>
std::vector<at::Tensor> forward_impl(const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0,
                                     const at::Tensor& mask, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                     const at::Tensor& bias, const Rounds& R, bool capped, bool save,
                                     const StepRoutes& routes, i64 min_rows, const at::Tensor& adapt) {
  const Route route = routes.gates;
  const i64 T_ = xs.size(0), B = xs.size(1), m = xs.size(2), n = h0.size(1), mn = m + n;
  const i64 S = save ? T_ : 1;
  auto opts = xs.options();
  const CellForward<T> cell(xs, c0, bias, adapt, n, save, capped, route);
  // the LSTM (no rounds) in training: W_ih x does not depend on the recurrence, so it is one product over
  // all T*B rows before the loop, and a step adds only h~ W_hh^T to it (in ``acts``, which training keeps
  // for every step anyway). Forward-only keeps the per-step [x; h~] product: measured at H = 650 the
  // T-long buffer it would need cost more than the big product saved (docs/fused-recurrence.md).
  const bool hoisted = R.r == 0 && save;
  // the buffers: the gates' pre-activations, [x_up; h_up], h~ (when it is not stored in xh), the chains' inner
  // links, each round's sigmoids and low-rank products. Saved for the backward, each is a tensor; forward-only,
  // they are cut from one block (a one-step window asked for fifteen small tensors at every step, which cost
  // more than its products at small sizes)
  at::Tensor acts, xh, htil, block;
  std::vector<at::Tensor> xc, hc, sig, low;
  std::vector<T*> xcp, hcp, sigp, lowp;
  T *actsp, *xhp, *htilp;
  if (save) {
    acts = hoisted ? product<T>(route, xs.view({T_ * B, m}), w_ih, true, workspace({T_ * B, 4 * n}, opts))
                         .view({T_, B, 4 * n})
                   : workspace({S, B, 4 * n}, opts);
    xh = workspace({S, B, mn}, opts);
    htil = at::empty({B, n}, opts);
    for (i64 j = 1; j < R.nq; ++j) xc.push_back(workspace({S, B, m}, opts));
    for (i64 j = 1; j < R.nr; ++j) hc.push_back(workspace({S, B, n}, opts));
    for (i64 i = 1; i <= R.r; ++i) {
      sig.push_back(workspace({S, B, R.is_q(i) ? m : n}, opts));
      if (R.rank > 0) low.push_back(workspace({S, B, R.rank}, opts));
    }
    actsp = ptr<T>(acts), xhp = ptr<T>(xh), htilp = ptr<T>(htil);
    xcp = pointers<T>(xc), hcp = pointers<T>(hc), sigp = pointers<T>(sig), lowp = pointers<T>(low);
  } else {
    auto padded = [](i64 count) { return (count + 15) / 16 * 16; };  // each part 64-byte aligned
    std::vector<i64> parts{padded(B * 4 * n), padded(B * mn), padded(B * n)};
    for (i64 j = 1; j < R.nq; ++j) parts.push_back(padded(B * m));
    for (i64 j = 1; j < R.nr; ++j) parts.push_back(padded(B * n));
    for (i64 i = 1; i <= R.r; ++i) {
      parts.push_back(padded(B * (R.is_q(i) ? m : n)));
      if (R.rank > 0) parts.push_back(padded(B * R.rank));
    }
    i64 total = 0;
    for (i64 c : parts) total += c;
    block = workspace({total}, opts);
    T* cursor = ptr<T>(block);
    size_t k = 0;
    auto next = [&]() { T* p = cursor; cursor += parts[k++]; return p; };
    actsp = next(), xhp = next(), htilp = next();
    for (i64 j = 1; j < R.nq; ++j) xcp.push_back(next());
    for (i64 j = 1; j < R.nr; ++j) hcp.push_back(next());
    for (i64 i = 1; i <= R.r; ++i) {
      sigp.push_back(next());
      if (R.rank > 0) lowp.push_back(next());
    }
  }
  const T* mk = ptr<T>(mask);
  const T* y = ptr<T>(cell.ys);
  PackCache cache;  // the weights packed once for all threads (brgemm route)
  // per round: src -> low -> p (low rank) or src -> p (full), for ``rows`` rows a product
  auto round_products = [&](i64 rows) {
    std::pair<std::vector<PackedB<T>>, std::vector<PackedB<T>>> out;
    for (i64 i = 1; i <= R.r; ++i) {
      const i64 w = R.is_q(i) ? m : n, win = R.is_q(i) ? n : m;
      if (R.rank > 0) {
        out.first.emplace_back(routes.rounds, rows, R.rank, win, part_ptr<T>(R.mats[i - 1]), win, true, T_, &cache);
        out.second.emplace_back(routes.rounds, rows, w, R.rank, part_ptr<T>(R.lefts[i - 1]), R.rank, true, T_, &cache);
      } else {
        out.first.emplace_back(routes.rounds, rows, w, win, part_ptr<T>(R.mats[i - 1]), win, true, T_, &cache);
      }
    }
    return out;
  };
  // step t of rows [b0, b0 + rows) up to the gate product: [x_up; h_up] into xh (h~, then the rounds)
  auto rounds_step = [&](i64 t, i64 b0, i64 rows, const std::vector<PackedB<T>>& first,
                         const std::vector<PackedB<T>>& second) {
    const i64 s = save ? t : 0;
    T* xh_s = xhp + (s * B + b0) * mn;
    if (R.nq == 0) copy_rows(rows, m, ptr<T>(xs) + (t * B + b0) * m, m, xh_s, mn);  // x_up is x itself
    // h^0 = h~
    const T* hp = t == 0 ? ptr<T>(h0) + b0 * n : y + ((t - 1) * B + b0) * n;
    T* h_first;
    i64 ld_first;
    if (R.nr == 0) {  // h_up is h~ itself: it goes straight into xh
      h_first = xh_s + m;
      ld_first = mn;
      if (mk != nullptr)
        mul_rows(rows, n, hp, n, mk + b0 * n, n, h_first, mn);
      else
        copy_rows(rows, n, hp, n, h_first, mn);
    } else if (mk != nullptr) {
      h_first = htilp + b0 * n;
      ld_first = n;
      mul_rows(rows, n, hp, n, mk + b0 * n, n, h_first, n);
    } else {
      h_first = const_cast<T*>(hp);
      ld_first = n;
    }
    Chains<T> ch = chains_at<T>(R, m, n, B, t, s, b0, ptr<T>(xs), h_first, ld_first, xcp, hcp, xhp);
    for (i64 i = 1; i <= R.r; ++i) {
      const bool q = R.is_q(i);
      const i64 j = R.j(i), sj = R.src_j(i), w = q ? m : n;
      const T* src = q ? ch.h[sj] : ch.x[sj];
      const i64 lds = q ? ch.ldh[sj] : ch.ldx[sj];
      T* sg = sigp[i - 1] + (s * B + b0) * w;
      if (R.rank > 0) {
        T* lw = lowp[i - 1] + (s * B + b0) * R.rank;
        first[i - 1](rows, src, lds, T(0), lw, R.rank);  // low = src Right^T
        second[i - 1](rows, lw, R.rank, T(0), sg, w);    // p = low Left^T
      } else {
        first[i - 1](rows, src, lds, T(0), sg, w);  // p = src M^T
      }
      const T* rb = R.bias.empty() ? nullptr : part_ptr<T>(R.bias[i - 1]);
      if (q)
        round_forward(rows, w, sg, w, rb, ch.x[j], ch.ldx[j], ch.x[j + 1], ch.ldx[j + 1]);
      else
        round_forward(rows, w, sg, w, rb, ch.h[j], ch.ldh[j], ch.h[j + 1], ch.ldh[j + 1]);
    }
    return xh_s;
  };
  const i64 P = routes.columns && !adapt.defined() ? column_partitions(n) : 1;
  if (P > 1) {
    // split by columns: a thread runs the rounds of its rows, then the gate product and cell of its units
    // for every row, with a barrier after each phase (window.h, "Column-split loops")
    const i64 align = column_align(n, P);
    // each block's rows of W_ih and W_hh, its four gates' together ([4w, m], [4w, n]): one product a step
    std::vector<at::Tensor> wx(P), wh(P);
    for (i64 p = 0; p < P; ++p) {
      if (!hoisted) wx[p] = gate_rows(w_ih, column_block(n, p, P, align));
      wh[p] = gate_rows(w_hh, column_block(n, p, P, align));
    }
    for_partitions(P, [&](i64 p0, i64 p1, TeamBarrier& barrier) {
      struct Part {
        i64 b0, rows, u0, units;
        std::pair<std::vector<PackedB<T>>, std::vector<PackedB<T>>> rounds;
        std::vector<PackedB<T>> gx, gh;  // its units' gates from x_up, h_up
        at::Tensor g;  // their pre-activations, then activations: [B, 4 units]
      };
      std::vector<Part> parts;
      for (i64 p = p0; p < p1; ++p) {
        auto [b0, b1] = column_block(B, p, P, 1);
        auto [u0, u1] = column_block(n, p, P, align);
        const i64 w = u1 - u0;
        Part part{b0, b1 - b0, u0, w, round_products(std::max<i64>(b1 - b0, 1)), {}, {}, at::empty({B, 4 * w}, opts)};
        if (!hoisted) part.gx.emplace_back(route, B, 4 * w, m, ptr<T>(wx[p]), m, true, T_);
        part.gh.emplace_back(route, B, 4 * w, n, ptr<T>(wh[p]), n, true, T_);
        parts.push_back(std::move(part));
      }
      for (i64 t = 0; t < T_; ++t) {
        const i64 s = save ? t : 0;
        for (auto& q : parts)
          if (q.rows > 0) rounds_step(t, q.b0, q.rows, q.rounds.first, q.rounds.second);
        barrier.wait(p1 - p0);
        const T* xh_s = xhp + s * B * mn;
        T* a = actsp + (hoisted ? t : s) * B * 4 * n;  // [B, 4n]
        for (auto& q : parts) {
          const i64 w = q.units;
          T* g = ptr<T>(q.g);
          if (hoisted)  // W_ih x, from the product before the loop
            copy_gate_block(B, n, q.u0, w, a, g, true);
          else
            q.gx[0](B, xh_s, mn, T(0), g, 4 * w);
          q.gh[0](B, xh_s + m, mn, T(1), g, 4 * w);
          cell.step_units(t, q.u0, w, g);
          if (save)  // the activations, where the backward reads them
            copy_gate_block(B, n, q.u0, w, a, g, false);
        }
        barrier.wait(p1 - p0);
      }
    });
  } else {
    for_row_blocks(B, min_rows, [&](i64 b0, i64 b1, bool) {
      const i64 rows = b1 - b0;
      // this thread's products, their fixed operands packed once for the window
      // [x_up; h_up] -> gate pre-activations, as x_up W_ih^T + h_up W_hh^T (no concatenated copy of the weights)
      PackedB<T> gates_x(route, rows, 4 * n, m, ptr<T>(w_ih), m, true, hoisted ? 0 : T_, &cache);
      PackedB<T> gates_h(route, rows, 4 * n, n, ptr<T>(w_hh), n, true, T_, &cache);
      auto rounds = round_products(rows);
      for (i64 t = 0; t < T_; ++t) {
        const i64 s = save ? t : 0;
        T* xh_s = rounds_step(t, b0, rows, rounds.first, rounds.second);
        T* g = actsp + ((hoisted ? t : s) * B + b0) * 4 * n;
        if (!hoisted) gates_x(rows, xh_s, mn, T(0), g, 4 * n);
        gates_h(rows, xh_s + m, mn, T(1), g, 4 * n);
        cell.step(t, b0, rows, g);
      }
    });
  }
  std::vector<at::Tensor> out = cell.outputs();
  if (save) {
    out.push_back(acts);
    out.push_back(cell.cs);
    out.push_back(xh);
    for (auto& t : sig) out.push_back(t);
    for (auto& t : low) out.push_back(t);
    for (auto& t : xc) out.push_back(t);
    for (auto& t : hc) out.push_back(t);
  }
  return out;
}

// Gradients: [dxs, dh0, dc0, dW_ih, dW_hh, dbias, per round: d mat (or right), d left, d bias]; undefined
// where not needed (weights: when need_weights is false).
template <typename T>
std::vector<at::Tensor> backward_impl(const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0,
                                      const at::Tensor& mask, const at::Tensor& w_ih, const at::Tensor& w_hh,
                                      bool has_bias, const Rounds& R, bool capped, const std::vector<at::Tensor>& saved,
                                      const at::Tensor& dys, const at::Tensor& dhT, const at::Tensor& dcT,
                                      bool need_dx, bool need_weights, const StepRoutes& routes, i64 min_rows,
                                      const at::Tensor& adapt, Route tn_route) {
  const Route route = routes.gates;
  const i64 T_ = xs.size(0), B = xs.size(1), m = xs.size(2), n = h0.size(1), mn = m + n;
  auto opts = xs.options();
  const at::Tensor& ys = saved[0];
  const at::Tensor& acts = saved[1];
  const at::Tensor& cs = saved[2];
  const at::Tensor& xh = saved[3];
  std::vector<at::Tensor> sig(saved.begin() + 4, saved.begin() + 4 + R.r);
  i64 k = 4 + R.r;
  std::vector<at::Tensor> low, xc, hc;
  if (R.rank > 0)
    for (i64 i = 0; i < R.r; ++i) low.push_back(saved[k++]);
  for (i64 j = 1; j < R.nq; ++j) xc.push_back(saved[k++]);
  for (i64 j = 1; j < R.nr; ++j) hc.push_back(saved[k++]);
  const std::vector<T*> xcp = pointers<T>(xc), hcp = pointers<T>(hc);
  // h~ for every step: the chain h^0 (a round's source or old value) when rounds >= 2
  at::Tensor htil = R.nr > 0 || R.nq > 0 ? h_tilde_all(h0, ys, mask) : at::Tensor();  // [T, B, n]
  at::Tensor dG = workspace({T_, B, 4 * n}, opts);
  std::vector<at::Tensor> dps, dlows;
  for (i64 i = 1; i <= R.r; ++i) {
    dps.push_back(workspace({T_, B, R.is_q(i) ? m : n}, opts));
    if (R.rank > 0) dlows.push_back(workspace({T_, B, R.rank}, opts));
  }
  // without rounds x_up = x: dx feeds nothing in the loop and is one product dG W_ih after it
  const bool dx_after = R.r == 0;
  at::Tensor dx = need_dx && !dx_after ? at::empty({T_, B, m}, opts) : at::Tensor();
  at::Tensor gxh = at::empty({B, mn}, opts);  // gradients of the chains' current ends [x; h]
  at::Tensor extra = R.zigzag ? at::Tensor() : at::empty({B, mn}, opts);  // no zigzag: into x^0, h^0
  const CellBackward<T> cell(c0, cs, acts, dys, dhT, dcT, adapt, capped, route);
  const T* mk = ptr<T>(mask);
  T* dg = ptr<T>(dG);
  PackCache cache;  // the weights packed once for all threads (brgemm route)
  // per round: dp -> dlow -> d src (low rank) or dp -> d src, for ``rows`` rows a product
  auto round_products = [&](i64 rows) {
    std::pair<std::vector<PackedB<T>>, std::vector<PackedB<T>>> out;
    for (i64 i = 1; i <= R.r; ++i) {
      const i64 w = R.is_q(i) ? m : n, win = R.is_q(i) ? n : m;
      if (R.rank > 0) {
        out.first.emplace_back(routes.rounds, rows, R.rank, w, part_ptr<T>(R.lefts[i - 1]), R.rank, false, T_, &cache);
        out.second.emplace_back(routes.rounds, rows, win, R.rank, part_ptr<T>(R.mats[i - 1]), win, false, T_, &cache);
      } else {
        out.first.emplace_back(routes.rounds, rows, win, w, part_ptr<T>(R.mats[i - 1]), win, false, T_, &cache);
      }
    }
    return out;
  };
  // step t of rows [b0, b0 + rows) after the gate product gave [dx_up; dh_up] in gxh: back through the
  // rounds, then dx and the dh carried to step t-1
  auto rounds_step = [&](i64 t, i64 b0, i64 rows, const std::vector<PackedB<T>>& d_first,
                         const std::vector<PackedB<T>>& d_second) {
    T* gx = ptr<T>(gxh) + b0 * mn;
    T* gh = gx + m;
    if (R.r > 0) {
      T* ex = R.zigzag ? nullptr : ptr<T>(extra) + b0 * mn;
      if (ex != nullptr)
        for (i64 r = 0; r < rows; ++r) std::fill(ex + r * mn, ex + r * mn + mn, T(0));
      Chains<T> ch = chains_at<T>(R, m, n, B, t, t, b0, ptr<T>(xs), ptr<T>(htil) + (t * B + b0) * n, n, xcp, hcp,
                                  ptr<T>(xh));
      for (i64 i = R.r; i >= 1; --i) {
        const bool q = R.is_q(i);
        const i64 j = R.j(i), w = q ? m : n;
        T* dp = ptr<T>(dps[i - 1]) + (t * B + b0) * w;
        round_backward(rows, w, q ? gx : gh, mn, q ? ch.x[j] : ch.h[j], q ? ch.ldx[j] : ch.ldh[j],
                       ptr<T>(sig[i - 1]) + (t * B + b0) * w, w, dp, w);
        T* dst = R.zigzag ? (q ? gh : gx) : (q ? ex + m : ex);  // the source's gradient (accumulated)
        if (R.rank > 0) {
          T* dl = ptr<T>(dlows[i - 1]) + (t * B + b0) * R.rank;
          d_first[i - 1](rows, dp, w, T(0), dl, R.rank);  // dlow = dp Left
          d_second[i - 1](rows, dl, R.rank, T(1), dst, mn);  // d src += dlow Right
        } else {
          d_first[i - 1](rows, dp, w, T(1), dst, mn);  // d src += dp M
        }
      }
      if (ex != nullptr) add_rows(rows, mn, gx, mn, ex, mn, gx, mn);
    }
    if (need_dx && !dx_after) copy_rows(rows, m, gx, mn, ptr<T>(dx) + (t * B + b0) * m, m);
    T* dhn = cell.carried(b0);
    if (mk != nullptr)
      mul_rows(rows, n, gh, mn, mk + b0 * n, n, dhn, n);
    else
      copy_rows(rows, n, gh, mn, dhn, n);
  };
  const i64 P = routes.columns && !adapt.defined() ? column_partitions(n) : 1;
  if (P > 1) {
    // split by columns: a thread runs the cell's derivative for its units and [dx_up; dh_up] for its block
    // of their columns over every row, then the rounds of its rows, with a barrier after each phase
    const i64 align = column_align(n, P);
    for_partitions(P, [&](i64 p0, i64 p1, TeamBarrier& barrier) {
      struct Part {
        i64 b0, rows, u0, units, x0, xw;
        std::pair<std::vector<PackedB<T>>, std::vector<PackedB<T>>> rounds;
        std::vector<PackedB<T>> dx_up, dh_up;  // dG -> its columns of dx_up (with rounds), of dh_up
      };
      std::vector<Part> parts;
      for (i64 p = p0; p < p1; ++p) {
        auto [b0, b1] = column_block(B, p, P, 1);
        auto [u0, u1] = column_block(n, p, P, align);
        auto [x0, x1] = column_block(m, p, P, column_align(m, P));
        Part part{b0, b1 - b0, u0, u1 - u0, x0, x1 - x0, round_products(std::max<i64>(b1 - b0, 1)), {}, {}};
        if (!dx_after && part.xw > 0)
          part.dx_up.emplace_back(route, B, part.xw, 4 * n, ptr<T>(w_ih) + x0, m, false, T_);
        part.dh_up.emplace_back(route, B, part.units, 4 * n, ptr<T>(w_hh) + u0, n, false, T_);
        parts.push_back(std::move(part));
      }
      for (i64 t = T_ - 1; t >= 0; --t) {
        T* g = dg + t * B * 4 * n;  // [B, 4n]
        for (auto& q : parts) cell.step_units(t, q.u0, q.units, g);
        barrier.wait(p1 - p0);
        for (auto& q : parts) {
          if (!q.dx_up.empty()) q.dx_up[0](B, g, 4 * n, T(0), ptr<T>(gxh) + q.x0, mn);
          q.dh_up[0](B, g, 4 * n, T(0), ptr<T>(gxh) + m + q.u0, mn);
        }
        barrier.wait(p1 - p0);
        for (auto& q : parts)
          if (q.rows > 0) rounds_step(t, q.b0, q.rows, q.rounds.first, q.rounds.second);
        barrier.wait(p1 - p0);
      }
    });
  } else {
    for_row_blocks(B, min_rows, [&](i64 b0, i64 b1, bool) {
      const i64 rows = b1 - b0;
      // dG -> dx_up (in the loop only with rounds)
      PackedB<T> d_gates_x(route, rows, m, 4 * n, ptr<T>(w_ih), m, false, dx_after ? 0 : T_, &cache);
      PackedB<T> d_gates_h(route, rows, n, 4 * n, ptr<T>(w_hh), n, false, T_, &cache);  // dG -> dh_up
      auto rounds = round_products(rows);
      T* gx = ptr<T>(gxh) + b0 * mn;
      for (i64 t = T_ - 1; t >= 0; --t) {
        T* g = dg + (t * B + b0) * 4 * n;
        cell.step(t, b0, rows, g);
        if (!dx_after) d_gates_x(rows, g, 4 * n, T(0), gx, mn);
        d_gates_h(rows, g, 4 * n, T(0), gx + m, mn);
        rounds_step(t, b0, rows, rounds.first, rounds.second);
      }
    });
  }
  std::vector<at::Tensor> grads(7 + 3 * R.r);  // the last: dL/dM of the adaptation
  if (adapt.defined()) grads[6 + 3 * R.r] = adaptation_grad(cell.d_adapted, acts, cs, adapt);
  at::Tensor dG2 = dG.view({T_ * B, 4 * n});
  if (need_dx && dx_after) dx = product<T>(route, dG2, w_ih, false).view({T_, B, m});  // dG W_ih
  if (need_dx) grads[0] = dx;
  if (need_weights) {
    at::Tensor xh2 = xh.view({T_ * B, mn});
    at::Tensor dW = product_tn(tn_route, dG2, xh2, true);  // [4n, m + n], copied out in two parts
    grads[3] = dW.narrow(1, 0, m).contiguous();  // [4n, m]
    grads[4] = dW.narrow(1, m, n).contiguous();  // [4n, n]
    if (has_bias) grads[5] = dG2.sum(0);
    // the chains as [T, B, width] tensors, to read each round's source from
    std::vector<at::Tensor> cx{xs}, chh{htil};
    for (auto& t : xc) cx.push_back(t);
    cx.push_back(xh.narrow(2, 0, m));
    for (auto& t : hc) chh.push_back(t);
    if (R.nr > 0) chh.push_back(xh.narrow(2, m, n));
    for (i64 i = 1; i <= R.r; ++i) {
      const bool q = R.is_q(i);
      const i64 sj = R.src_j(i), w = q ? m : n, win = q ? n : m;
      at::Tensor src = (q ? chh[sj] : cx[sj]).reshape({T_ * B, win});
      at::Tensor dp2 = dps[i - 1].view({T_ * B, w});
      if (R.rank > 0) {
        grads[6 + 3 * (i - 1)] = product_tn(tn_route, dlows[i - 1].view({T_ * B, R.rank}), src);      // right [k, in]
        grads[6 + 3 * (i - 1) + 1] = product_tn(tn_route, dp2, low[i - 1].view({T_ * B, R.rank}));  // left [out, k]
      } else {
        grads[6 + 3 * (i - 1)] = product_tn(tn_route, dp2, src);  // [out, in]
      }
      if (!R.bias.empty()) grads[6 + 3 * (i - 1) + 2] = dp2.sum(0);
    }
  }
  grads[1] = cell.dh_next;
  grads[2] = cell.dc;
  return grads;
}

// Each round's tensors in round order: one tensor a round (2-D matrices and factors, 1-D biases), or each kind's
// parameter as the model holds it, stacked over its rounds (x's rounds' [nq, ...], then h's [nr, ...]), of which
// round i reads its kind's row j(i). The Python side passes the stacked ones: a view a round, made there at every
// call, cost more than a one-step window's products at small sizes.
std::vector<RoundPart> per_round(const Rounds& R, at::TensorList given, i64 stacked_dim, const char* what) {
  std::vector<RoundPart> out;
  auto contiguous = [](const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); };
  if (given.empty() || given[0].dim() != stacked_dim) {
    for (const auto& t : given) out.push_back({contiguous(t), -1});
    return out;
  }
  const i64 kinds = R.nr > 0 ? 2 : 1;
  TORCH_CHECK((i64)given.size() == kinds && given.back().dim() == stacked_dim,
              "moglm compiled recurrence: expected ", kinds, " stacked ", what, " (x's rounds', then h's)");
  TORCH_CHECK(given[0].size(0) == R.nq && (kinds == 1 || given[1].size(0) == R.nr),
              "moglm compiled recurrence: stacked ", what, " must hold one row a round of their kind");
  const at::Tensor q = contiguous(given[0]), r = kinds == 2 ? contiguous(given[1]) : at::Tensor();
  for (i64 i = 1; i <= R.r; ++i) out.push_back({R.is_q(i) ? q : r, R.j(i)});
  return out;
}

Rounds make_rounds(int64_t rounds, int64_t rank, bool zigzag, at::TensorList mats, at::TensorList lefts,
                   at::TensorList bias) {
  Rounds R;
  R.r = rounds;
  R.nq = (rounds + 1) / 2;
  R.nr = rounds / 2;
  R.rank = rank > 0 ? rank : 0;
  R.zigzag = zigzag;
  R.mats = per_round(R, mats, 3, "matrices");
  R.lefts = per_round(R, lefts, 3, "left factors");
  R.bias = per_round(R, bias, 2, "biases");
  TORCH_CHECK((i64)R.mats.size() == rounds, "moglm compiled recurrence: expected one matrix per round");
  TORCH_CHECK(R.rank == 0 || (i64)R.lefts.size() == rounds, "moglm compiled recurrence: expected one left factor per round");
  TORCH_CHECK(R.bias.empty() || (i64)R.bias.size() == rounds, "moglm compiled recurrence: expected one bias per round");
  return R;
}

// Each round's matrices: full [out, in], or right [k, in] and left [out, k]; its bias [out].
void check_rounds(const Rounds& R, i64 m, i64 n, at::ScalarType dtype) {
  for (i64 i = 1; i <= R.r; ++i) {
    const i64 out = R.is_q(i) ? m : n, in = R.is_q(i) ? n : m;
    const RoundPart& a = R.mats[i - 1];
    const std::vector<i64> first = R.rank > 0 ? std::vector<i64>{R.rank, in} : std::vector<i64>{out, in};
    TORCH_CHECK(a.sizes() == at::IntArrayRef(first) && a.scalar_type() == dtype,
                "moglm compiled recurrence: round ", i, "'s matrix must be ", at::IntArrayRef(first), ", got ", a.sizes());
    if (R.rank > 0)
      TORCH_CHECK(R.lefts[i - 1].sizes() == at::IntArrayRef({out, R.rank}) && R.lefts[i - 1].scalar_type() == dtype,
                  "moglm compiled recurrence: round ", i, "'s left factor must be [", out, ", ", R.rank, "]");
    if (!R.bias.empty())
      TORCH_CHECK(R.bias[i - 1].sizes() == at::IntArrayRef({out}) && R.bias[i - 1].scalar_type() == dtype,
                  "moglm compiled recurrence: round ", i, "'s bias must be [", out, "]");
  }
}

std::vector<at::Tensor> mogrifier_lstm_forward(const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0,
                                               const std::optional<at::Tensor>& mask, const at::Tensor& w_ih,
                                               const at::Tensor& w_hh, const std::optional<at::Tensor>& bias,
                                               at::TensorList mats, at::TensorList lefts, at::TensorList rbias,
                                               int64_t rounds, int64_t rank, bool zigzag, bool capped, bool save,
                                               int64_t route, int64_t min_rows, const std::optional<at::Tensor>& adapt) {
  ready_threads();
  DenormalScope denormals;  // this thread's part; each parallel body has its own (window.h)
  Rounds R = make_rounds(rounds, rank, zigzag, mats, lefts, rbias);
  at::Tensor wih = w_ih.contiguous(), whh = w_hh.contiguous();
  at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor mk = mask.has_value() ? mask->contiguous() : at::Tensor();
  check_window(xs, h0.contiguous(), c0.contiguous(), mk, wih, whh, b);
  check_rounds(R, xs.size(2), h0.size(1), xs.scalar_type());
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(xs.scalar_type(), "mogrifier_lstm_forward", [&] {
    out = forward_impl<scalar_t>(xs, h0, c0, mk, wih, whh, b, R, capped, save, decode_routes(route), min_rows,
                                 adapt.has_value() ? adapt->contiguous() : at::Tensor());
  });
  return out;
}

std::vector<at::Tensor> mogrifier_lstm_backward(
    const at::Tensor& xs, const at::Tensor& h0, const at::Tensor& c0, const std::optional<at::Tensor>& mask,
    const at::Tensor& w_ih, const at::Tensor& w_hh, bool has_bias, at::TensorList mats, at::TensorList lefts,
    at::TensorList rbias, int64_t rounds, int64_t rank, bool zigzag, bool capped, at::TensorList saved,
    const std::optional<at::Tensor>& dys, const std::optional<at::Tensor>& dhT, const std::optional<at::Tensor>& dcT,
    bool need_dx, bool need_weights, int64_t route, int64_t min_rows, const std::optional<at::Tensor>& adapt,
    int64_t tn_route) {
  ready_threads();
  DenormalScope denormals;  // this thread's part; each parallel body has its own (window.h)
  Rounds R = make_rounds(rounds, rank, zigzag, mats, lefts, rbias);
  std::vector<at::Tensor> sv(saved.begin(), saved.end());
  at::Tensor wih = w_ih.contiguous(), whh = w_hh.contiguous();
  at::Tensor mk = mask.has_value() ? mask->contiguous() : at::Tensor();
  at::Tensor gy = dys.has_value() ? dys->contiguous() : at::Tensor();
  at::Tensor gh = dhT.has_value() ? dhT->contiguous() : at::Tensor();
  at::Tensor gc = dcT.has_value() ? dcT->contiguous() : at::Tensor();
  std::vector<at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(xs.scalar_type(), "mogrifier_lstm_backward", [&] {
    out = backward_impl<scalar_t>(xs, h0, c0, mk, wih, whh, has_bias, R, capped, sv, gy, gh, gc, need_dx,
                                  need_weights, decode_routes(route), min_rows,
                                  adapt.has_value() ? adapt->contiguous() : at::Tensor(),
                                  decode_routes(tn_route < 0 ? route : tn_route).gates);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(moglm, m) {
  m.def(
      "mogrifier_lstm_forward(Tensor xs, Tensor h0, Tensor c0, Tensor? mask, Tensor w_ih, Tensor w_hh, Tensor? bias, "
      "Tensor[] mats, Tensor[] lefts, Tensor[] rbias, int rounds, int rank, bool zigzag, bool capped, bool save, "
      "int route, int min_rows, Tensor? adapt=None) -> Tensor[]");
  m.def(
      "mogrifier_lstm_backward(Tensor xs, Tensor h0, Tensor c0, Tensor? mask, Tensor w_ih, Tensor w_hh, "
      "bool has_bias, Tensor[] mats, Tensor[] lefts, Tensor[] rbias, int rounds, int rank, bool zigzag, "
      "bool capped, Tensor[] saved, Tensor? dys, Tensor? dhT, Tensor? dcT, bool need_dx, bool need_weights, "
      "int route, int min_rows, Tensor? adapt=None, int tn_route=-1) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(moglm, CPU, m) {
  m.impl("mogrifier_lstm_forward", &mogrifier_lstm_forward);
  m.impl("mogrifier_lstm_backward", &mogrifier_lstm_backward);
}

}  // namespace moglm
