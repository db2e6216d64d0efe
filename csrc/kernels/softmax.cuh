// Fused scaled (masked / causal) softmax over the last dim, forward and
// backward:
//   y  = softmax(scale * x), masked elements excluded (y = 0 there)
//   dx = scale * y * (dy - sum(dy * y))
//
// Thread layout: a CTA of TPR * ROWS threads holds ROWS row groups; group g
// owns row rb * ROWS + g of row block rb. Thread `lane` of a group owns the
// VEC-wide vectors lane, lane + TPR, ... of its row, NV of them per chunk of
// TPR * NV vectors. With a cluster of CL CTAs (kSoftmaxClusterBits, cached
// rows only, ROWS == 1), a row block belongs to a cluster and CTA `rank` of
// it owns vectors (i * CL + rank) * TPR + lane, i < NV: each CTA holds
// interleaved TPR-vector pieces of the row, so a causal prefix spreads over
// the whole cluster, and the row's statistics meet through distributed
// shared memory (common/cluster.cuh).
//
// The row length `cols` is a run-time value: a kernel serves every row
// length up to its capacity (CACHED: TPR * NV * VEC elements; streamed: any),
// so a decode loop whose key length grows by one per step reuses a handful
// of kernels instead of compiling one per length. Register arrays are still
// sized and unrolled at compile time by NV.
//
// Invariants (the host's planner guarantees them; see ops/softmax_plan.cpp):
// - cols % VEC == 0; x, dy and the mask are VEC-aligned at every row start
//   (the mask in bytes); y, dx are contiguous rows x cols.
// - CACHED: the row is one chunk (cols / VEC <= CL * TPR * NV); it is read once
//   into registers as raw T. Otherwise ROWS == 1 and the row is streamed:
//   one online (max, sum) pass, then a second pass, in reverse chunk order
//   so its first reads are the chunks the first pass touched last (most
//   likely still in L2).
// - The row-block loop is uniform across the CTA (rows past the end still
//   take part in the barriers of group_allreduce).
// - MINB is the launch-bounds minimum of resident CTAs per SM: registers are
//   capped at 65536 / (MINB * TPR * ROWS) per thread. OPTS holds SoftmaxOpt
//   bits; kSoftmaxPrefetch and kSoftmaxKeepExp act on cached rows only.
// - Causal rows never read past their last visible key: vectors wholly
//   beyond it are neither loaded nor computed, only written as zeros; the
//   one straddling it is loaded and its masked lanes set to -inf. The
//   backward likewise reads neither y nor dy there.
#pragma once

#include "common/cluster.cuh"
#include "common/softmax_math.cuh"

namespace rtcnorm {

// z_j = x_j * s2 - off in one rounding (so exp2(z) stays accurate for large
// logits close to the max), or -inf where masked out or past len.
template <int KIND, typename T, int VEC>
__device__ __forceinline__ void logits(const Pack<T, VEC>& xv, unsigned mbits, int col, int len, float s2, float off,
                                       float (&z)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    float v = fmaf(elem_float(xv, j), s2, -off);
    if (KIND == kSoftmaxMasked && ((mbits >> j) & 1u) != 0) v = neg_inf();
    if (KIND == kSoftmaxCausal && col + j >= len) v = neg_inf();
    z[j] = v;
  }
}

// exp2(m - M) / S: turns this thread's exp2(z - m) into probabilities. 0 for
// a thread that saw no visible element, and for a fully masked row (S == 0).
__device__ __forceinline__ float row_factor(float m, MaxSum tot) {
  if (m == neg_inf() || !(tot.s > 0.f)) return 0.f;
  return fast_exp2(m - tot.m) / tot.s;
}

// Row geometry shared by both directions: where the row lives and how many
// of its vectors hold a visible element (a prefix for causal rows).
struct SoftmaxRow {
  unsigned row;
  bool ok;
  int len;    // visible elements: a prefix of the row
  int nload;  // vectors holding at least one visible element
};

// Row (o * bcast + h) * inner + q of x, for mask row t = o * inner + q and h
// the index along the broadcast dim.
__device__ __forceinline__ unsigned bcast_row(unsigned t, unsigned h, const FastDiv& inner, unsigned bcast) {
  const unsigned o = fast_div(inner, t);
  return (o * bcast + h) * inner.d + (t - o * inner.d);
}

// The row a thread's group takes at row block rb: the step index itself, or
// with HEADS_INNER its place in the order where the bcast rows sharing one
// mask row are consecutive (see SoftmaxFwdParams). Steps past the end keep
// their index and are not ok.
template <int VEC, int TPR, int ROWS, bool CAUSAL, bool HEADS_INNER = false>
__device__ __forceinline__ SoftmaxRow softmax_row(int rb, const FastDiv& sq, int rows, int cols, int diag,
                                                  const FastDiv* inner = nullptr, const FastDiv* bcast = nullptr) {
  SoftmaxRow r;
  r.row = static_cast<unsigned>(rb) * ROWS + threadIdx.x / TPR;
  r.ok = r.row < static_cast<unsigned>(rows);
  if (HEADS_INNER && r.ok) {
    const unsigned t = fast_div(*bcast, r.row);  // mask row: t = o * inner + q
    r.row = bcast_row(t, r.row - t * bcast->d, *inner, bcast->d);
  }
  r.len = cols;
  if (CAUSAL && r.ok) {
    const int q = static_cast<int>(r.row - fast_div(sq, r.row) * sq.d);
    r.len = min(cols, q + 1 + diag);
  }
  r.nload = r.ok ? (r.len + VEC - 1) / VEC : 0;
  return r;
}

// Vector i of chunk c of a thread's row (see the thread layout above; a
// cached row is chunk 0, the only one a cluster's rows have).
template <int TPR, int NV, int CL>
__device__ __forceinline__ int row_vector(int c, int i, int lane, int rank) {
  return CL == 1 ? (c * NV + i) * TPR + lane : (i * CL + rank) * TPR + lane;
}

template <typename T, int VEC, int TPR, int ROWS, int NV, int KIND, bool CACHED, int MINB, unsigned OPTS>
__global__ void __launch_bounds__(TPR* ROWS, MINB) softmax_fwd(const SoftmaxFwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kChunk = TPR * NV;
  constexpr bool kKeepExp = CACHED && (OPTS & kSoftmaxKeepExp) != 0;
  constexpr bool kPrefetch = CACHED && (OPTS & kSoftmaxPrefetch) != 0;
  constexpr bool kHeadsInner = KIND == kSoftmaxMasked && (OPTS & kSoftmaxHeadsInner) != 0;
  constexpr bool kReuse = CACHED && kHeadsInner && (OPTS & kSoftmaxMaskReuse) != 0;
  constexpr bool kCs = (OPTS & kSoftmaxStreamStore) != 0;
  constexpr bool kL1 = (OPTS & kSoftmaxL1Alloc) != 0;
  constexpr int kMaskWords = KIND == kSoftmaxMasked ? (NV * VEC + 31) / 32 : 1;
  constexpr int kCl = 1 << ((OPTS & kSoftmaxClusterBits) >> kSoftmaxClusterShift);
  static_assert(CACHED || ROWS == 1, "streamed rows take a whole CTA");
  static_assert(kCl == 1 || (CACHED && ROWS == 1 && !kReuse && !kPrefetch),
                "a cluster splits cached rows of one CTA each, one row block at a time");

  __shared__ GroupScratch<TPR, ROWS, MaxSum> scratch;
  __shared__ ClusterScratch<kCl, ROWS, MaxSum> cscratch;
  cluster_exchange_init(cscratch);
  const int lane = threadIdx.x % TPR;
  const int rank = cluster_rank<kCl>();
  int calls = 0;  // cluster_allreduce calls so far (slot parity)
  auto vidx = [&](int c, int i) { return row_vector<TPR, NV, kCl>(c, i, lane, rank); };
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const int nvec = p.cols / VEC;
  const float s2 = p.scale_log2;

  auto row_at = [&](int rb) {
    return softmax_row<VEC, TPR, ROWS, KIND == kSoftmaxCausal, kHeadsInner>(rb, p.sq, p.rows, p.cols, p.diag, &p.inner,
                                                                            &p.bcast);
  };
  // The visible part of row block rb's rows (x and mask) into L2.
  auto prefetch_rows = [&](int rb) {
    if (rb >= p.row_blocks) return;
    const SoftmaxRow n = row_at(rb);
    if (!n.ok) return;
    const long long nx = row_offset(p.x_rows, n.row);
    const long long nm = KIND == kSoftmaxMasked ? row_offset(p.mask_rows, n.row) : 0;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(0, i);
      if (v >= n.nload) continue;
      prefetch_l2<T, VEC>(x, nx + 1LL * v * VEC);
      if constexpr (KIND == kSoftmaxMasked) prefetch_l2<unsigned char, VEC>(p.mask, nm + 1LL * v * VEC);
    }
  };

  // Loads the visible vectors of chunk c of row r, and (with_mask) their mask
  // bits packed 32 to a word (vector i owns bits i * VEC .. i * VEC + VEC - 1;
  // VEC divides 32); without with_mask, mw keeps the bits already there.
  auto load_chunk = [&](const SoftmaxRow& r, long long xoff, long long moff, int c, PT(&xv)[NV],
                        unsigned(&mw)[kMaskWords], bool with_mask) {
    if (with_mask) {
#pragma unroll
      for (int w = 0; w < kMaskWords; ++w) mw[w] = 0u;
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(c, i);
      if (v < r.nload) {
        xv[i] = load_nc<T, VEC, kL1>(x, xoff + 1LL * v * VEC);
        if constexpr (KIND == kSoftmaxMasked)
          if (with_mask) mw[i * VEC / 32] |= load_mask_bits<VEC>(p.mask + moff + 1LL * v * VEC) << (i * VEC % 32);
      }
    }
  };
  auto bits = [](const unsigned(&mw)[kMaskWords], int i) { return mw[i * VEC / 32] >> (i * VEC % 32); };
  // Where row r's x, mask and y start, and how many vectors of y it writes
  // (none for a row past the end).
  struct RowOffsets {
    long long x, mask, y;
    int nstore;
  };
  auto offsets = [&](const SoftmaxRow& r) {
    RowOffsets o;
    o.x = r.ok ? row_offset(p.x_rows, r.row) : 0;
    o.mask = (KIND == kSoftmaxMasked && r.ok) ? row_offset(p.mask_rows, r.row) : 0;
    o.y = static_cast<long long>(r.row) * p.cols;
    o.nstore = r.ok ? nvec : 0;
    return o;
  };

  // A register-cached row: x (and with_mask, the mask bits) read once. Row
  // block rb only steers the next-row-block prefetch.
  auto cached_row = [&](const SoftmaxRow& r, unsigned(&mw)[kMaskWords], bool with_mask, int rb) {
    const auto [xoff, moff, yoff, nstore] = offsets(r);
    PT xv[NV];
    load_chunk(r, xoff, moff, 0, xv, mw, with_mask);
    if constexpr (kPrefetch && !kReuse) prefetch_rows(rb + gridDim.x);
    float m = neg_inf();
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(0, i);
      if (v >= r.nload) continue;
      float z[VEC];
      logits<KIND, T, VEC>(xv[i], bits(mw, i), v * VEC, r.len, s2, 0.f, z);
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = fmaxf(m, z[j]);
    }
    const float base = exp_base(m);
    float e[kKeepExp ? NV : 1][VEC];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(0, i);
      if (v >= r.nload) continue;
      float z[VEC];
      logits<KIND, T, VEC>(xv[i], bits(mw, i), v * VEC, r.len, s2, base, z);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float t = fast_exp2(z[j]);
        s += t;
        if constexpr (kKeepExp) e[i][j] = t;
      }
    }
    MaxSum tot = group_allreduce<TPR, ROWS>(MaxSum{m, s}, scratch);
    tot = cluster_allreduce<kCl, ROWS, TPR>(tot, cscratch, calls++, 0, static_cast<int>(threadIdx.x));
    const float f = row_factor(m, tot);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(0, i);
      if (v >= nstore) continue;
      PT out = zero_pack<T, VEC>();
      if (v < r.nload) {
        float t[VEC];
        if constexpr (kKeepExp) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) t[j] = e[i][j];
        } else {
          logits<KIND, T, VEC>(xv[i], bits(mw, i), v * VEC, r.len, s2, base, t);
#pragma unroll
          for (int j = 0; j < VEC; ++j) t[j] = fast_exp2(t[j]);
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) out.e[j] = from_float<T>(t[j] * f);
      }
      store<T, VEC, kCs>(y, yoff + 1LL * v * VEC, out);
    }
  };

  if constexpr (kReuse) {
    // Row block rb = run c of mask row block mrb; group g takes mask row
    // mr = mrb * ROWS + g (rows = outer x bcast x inner, mr = o * inner + q)
    // and its bcast rows (o * bcast + h) * inner + q for h in the run. Every
    // group of a CTA has the same run length, so the barriers stay uniform.
    const unsigned bc = p.bcast.d;
    const unsigned mrows = static_cast<unsigned>(p.rows) / bc;
    const int per = (static_cast<int>(bc) + p.reuse_splits - 1) / p.reuse_splits;
    for (int rb = blockIdx.x; rb < p.row_blocks; rb += gridDim.x) {
      const int mrb = rb / p.reuse_splits;
      const int h0 = (rb - mrb * p.reuse_splits) * per;
      const int h1 = min(static_cast<int>(bc), h0 + per);
      const unsigned mr = static_cast<unsigned>(mrb) * ROWS + threadIdx.x / TPR;
      SoftmaxRow r;
      r.ok = mr < mrows;
      r.len = p.cols;
      r.nload = r.ok ? (p.cols + VEC - 1) / VEC : 0;
      // Row h of the run is row0 + h * inner.
      const unsigned row0 = r.ok ? bcast_row(mr, 0u, p.inner, bc) : 0u;
      unsigned mw[kMaskWords];
      for (int h = h0; h < h1; ++h) {
        r.row = r.ok ? row0 + static_cast<unsigned>(h) * p.inner.d : static_cast<unsigned>(p.rows);
        cached_row(r, mw, h == h0, rb);
      }
    }
    return;
  }

  // Uniform across a cluster: its CTAs share blockIdx.x / kCl.
  for (int rb = blockIdx.x / kCl; rb < p.row_blocks; rb += gridDim.x / kCl) {
    const SoftmaxRow r = row_at(rb);
    if constexpr (CACHED) {
      unsigned mw[kMaskWords];
      cached_row(r, mw, true, rb);
    } else {
      const auto [xoff, moff, yoff, nstore] = offsets(r);
      float m = neg_inf(), s = 0.f;
      const int load_chunks = (r.nload + kChunk - 1) / kChunk;
#pragma unroll 1
      for (int c = 0; c < load_chunks; ++c) {
        PT xv[NV];
        unsigned mw[kMaskWords];
        load_chunk(r, xoff, moff, c, xv, mw, true);
        float cm = neg_inf();
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const int v = vidx(c, i);
          if (v >= r.nload) continue;
          float z[VEC];
          logits<KIND, T, VEC>(xv[i], bits(mw, i), v * VEC, r.len, s2, 0.f, z);
#pragma unroll
          for (int j = 0; j < VEC; ++j) cm = fmaxf(cm, z[j]);
        }
        const float mn = fmaxf(m, cm);
        if (mn == neg_inf()) continue;
        s *= fast_exp2(m - mn);
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const int v = vidx(c, i);
          if (v >= r.nload) continue;
          float z[VEC];
          logits<KIND, T, VEC>(xv[i], bits(mw, i), v * VEC, r.len, s2, mn, z);
#pragma unroll
          for (int j = 0; j < VEC; ++j) s += fast_exp2(z[j]);
        }
        m = mn;
      }
      const float f = row_factor(m, group_allreduce<TPR, ROWS>(MaxSum{m, s}, scratch));
      const float base = exp_base(m);
#pragma unroll 1
      for (int c = (nstore + kChunk - 1) / kChunk - 1; c >= 0; --c) {
        PT xv[NV];
        unsigned mw[kMaskWords];
        load_chunk(r, xoff, moff, c, xv, mw, true);
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const int v = vidx(c, i);
          if (v >= nstore) continue;
          PT out = zero_pack<T, VEC>();
          if (v < r.nload) {
            float z[VEC];
            logits<KIND, T, VEC>(xv[i], bits(mw, i), v * VEC, r.len, s2, base, z);
#pragma unroll
            for (int j = 0; j < VEC; ++j) out.e[j] = from_float<T>(fast_exp2(z[j]) * f);
          }
          store<T, VEC, kCs>(y, yoff + 1LL * v * VEC, out);
        }
      }
    }
  }
  cluster_exit<kCl>(calls);
}

template <typename T, int VEC, int TPR, int ROWS, int NV, bool CAUSAL, bool CACHED, int MINB, unsigned OPTS>
__global__ void __launch_bounds__(TPR* ROWS, MINB) softmax_bwd(const SoftmaxBwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kChunk = TPR * NV;
  constexpr bool kPrefetch = CACHED && (OPTS & kSoftmaxPrefetch) != 0;
  constexpr bool kCs = (OPTS & kSoftmaxStreamStore) != 0;
  constexpr bool kL1 = (OPTS & kSoftmaxL1Alloc) != 0;
  constexpr int kCl = 1 << ((OPTS & kSoftmaxClusterBits) >> kSoftmaxClusterShift);
  static_assert(CACHED || ROWS == 1, "streamed rows take a whole CTA");
  static_assert(kCl == 1 || (CACHED && ROWS == 1 && !kPrefetch), "a cluster splits cached rows of one CTA each");

  __shared__ GroupScratch<TPR, ROWS, Sum1> scratch;
  __shared__ ClusterScratch<kCl, ROWS, Sum1> cscratch;
  cluster_exchange_init(cscratch);
  const int lane = threadIdx.x % TPR;
  const int rank = cluster_rank<kCl>();
  int calls = 0;
  auto vidx = [&](int c, int i) { return row_vector<TPR, NV, kCl>(c, i, lane, rank); };
  const T* y = static_cast<const T*>(p.y);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  const int nvec = p.cols / VEC;

  // The visible part of row block rb's rows (y and dy) into L2.
  auto prefetch_rows = [&](int rb) {
    if (rb >= p.row_blocks) return;
    const SoftmaxRow n = softmax_row<VEC, TPR, ROWS, CAUSAL>(rb, p.sq, p.rows, p.cols, p.diag);
    if (!n.ok) return;
    const long long ny = static_cast<long long>(n.row) * p.cols;
    const long long ng = row_offset(p.dy_rows, n.row);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(0, i);
      if (v >= n.nload) continue;
      prefetch_l2<T, VEC>(y, ny + 1LL * v * VEC);
      prefetch_l2<T, VEC>(dy, ng + 1LL * v * VEC);
    }
  };

  for (int rb = blockIdx.x / kCl; rb < p.row_blocks; rb += gridDim.x / kCl) {
    const SoftmaxRow r = softmax_row<VEC, TPR, ROWS, CAUSAL>(rb, p.sq, p.rows, p.cols, p.diag);
    const long long yoff = static_cast<long long>(r.row) * p.cols;
    const long long goff = r.ok ? row_offset(p.dy_rows, r.row) : 0;
    const int nstore = r.ok ? nvec : 0;

    auto load_chunk = [&](int c, PT(&yv)[NV], PT(&gv)[NV]) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = vidx(c, i);
        if (v < r.nload) {
          yv[i] = load_nc<T, VEC, kL1>(y, yoff + 1LL * v * VEC);
          gv[i] = load_nc<T, VEC, kL1>(dy, goff + 1LL * v * VEC);
        }
      }
    };
    // Lanes of the vector straddling the causal diagonal are skipped too, so
    // whatever dy holds past it never reaches the sum.
    auto hidden = [&](int v, int j) { return CAUSAL && v * VEC + j >= r.len; };
    auto dot_chunk = [&](int c, const PT(&yv)[NV], const PT(&gv)[NV], float s) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = vidx(c, i);
        if (v >= r.nload) continue;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          if (!hidden(v, j)) s = fmaf(elem_float(gv[i], j), elem_float(yv[i], j), s);
      }
      return s;
    };
    auto store_chunk = [&](int c, const PT(&yv)[NV], const PT(&gv)[NV], float dot) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = vidx(c, i);
        if (v >= nstore) continue;
        PT out = zero_pack<T, VEC>();
        if (v < r.nload) {
#pragma unroll
          for (int j = 0; j < VEC; ++j)
            if (!hidden(v, j)) out.e[j] = from_float<T>(elem_float(yv[i], j) * p.scale * (elem_float(gv[i], j) - dot));
        }
        store<T, VEC, kCs>(dx, yoff + 1LL * v * VEC, out);
      }
    };

    if constexpr (CACHED) {
      PT yv[NV], gv[NV];
      load_chunk(0, yv, gv);
      if constexpr (kPrefetch) prefetch_rows(rb + gridDim.x);
      Sum1 dot = group_allreduce<TPR, ROWS>(Sum1{dot_chunk(0, yv, gv, 0.f)}, scratch);
      dot = cluster_allreduce<kCl, ROWS, TPR>(dot, cscratch, calls++, 0, static_cast<int>(threadIdx.x));
      store_chunk(0, yv, gv, dot.a);
    } else {
      float s = 0.f;
      const int load_chunks = (r.nload + kChunk - 1) / kChunk;
#pragma unroll 1
      for (int c = 0; c < load_chunks; ++c) {
        PT yv[NV], gv[NV];
        load_chunk(c, yv, gv);
        s = dot_chunk(c, yv, gv, s);
      }
      const float dot = group_allreduce<TPR, ROWS>(Sum1{s}, scratch).a;
#pragma unroll 1
      for (int c = (nstore + kChunk - 1) / kChunk - 1; c >= 0; --c) {
        PT yv[NV], gv[NV];
        load_chunk(c, yv, gv);
        store_chunk(c, yv, gv, dot);
      }
    }
  }
  cluster_exit<kCl>(calls);
}

}  // namespace rtcnorm
