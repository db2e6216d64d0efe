// The softmax forward kernel (see softmax.cuh for the layout and invariants).
#pragma once

#include "softmax/fold.cuh"
#include "softmax/rows.cuh"

namespace rtcnorm {

template <typename T, int VEC, int TPR, int ROWS, int NV, int KIND, bool CACHED, int MINB, unsigned OPTS>
__global__ void __launch_bounds__(TPR* ROWS, MINB) softmax_fwd(const SoftmaxFwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kChunk = TPR * NV;
  constexpr bool kKeepExp = CACHED && (OPTS & kSoftmaxKeepExp) != 0;
  constexpr bool kHeadsInner = KIND == kSoftmaxMasked && (OPTS & kSoftmaxHeadsInner) != 0;
  constexpr bool kReuse = CACHED && kHeadsInner && (OPTS & kSoftmaxMaskReuse) != 0;
  constexpr bool kCs = (OPTS & kSoftmaxStreamStore) != 0;
  constexpr bool kL1 = (OPTS & kSoftmaxL1Alloc) != 0;
  constexpr int kCl = 1 << ((OPTS & kSoftmaxClusterBits) >> kSoftmaxClusterShift);
  // Cached rows fold the scale's sign, the mask and the causal diagonal into
  // x once (softmax/fold.cuh); their passes then take plain logits (kLogits).
  // Streamed chunks keep the mask bits: folding them twice spilled.
  constexpr int kLogits = CACHED ? kSoftmaxPlain : KIND;
  constexpr int kMaskWords = KIND == kSoftmaxMasked ? (NV * VEC + 31) / 32 : 1;
  static_assert(CACHED || ROWS == 1, "streamed rows take a whole CTA");
  static_assert(kCl == 1 || (CACHED && ROWS == 1 && !kReuse),
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
  const FoldScale fs = fold_scale(p.scale_log2);
  const float s2 = CACHED ? fs.s2e : p.scale_log2;

  auto row_at = [&](int rb) {
    return softmax_row<VEC, TPR, ROWS, KIND == kSoftmaxCausal, kHeadsInner>(rb, p.sq, p.rows, p.cols, p.diag, &p.inner,
                                                                            &p.bcast);
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
  // Folds the loaded vectors of a cached row (see kLogits) and returns the
  // row's max logit.
  auto fold_row = [&](const SoftmaxRow& r, PT(&xv)[NV], const unsigned(&mw)[kMaskWords]) {
    if (fs.adjust) {
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (vidx(0, i) < r.nload) fold_adjust(xv[i], fs);
    }
    RawMax<T, VEC> mx;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(0, i);
      if (v >= r.nload) continue;
      if constexpr (KIND == kSoftmaxMasked) fold_mask(xv[i], bits(mw, i));
      // Only the vector holding a causal row's last visible key reaches past it.
      if constexpr (KIND == kSoftmaxCausal)
        if ((v + 1) * VEC > r.len) fold_mask(xv[i], ~0u << (r.len - v * VEC));
      mx.add(xv[i]);
    }
    return mx.logit(s2);
  };
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

  // A register-cached row: x (and with_mask, the mask bits) read once.
  auto cached_row = [&](const SoftmaxRow& r, unsigned(&mw)[kMaskWords], bool with_mask) {
    const auto [xoff, moff, yoff, nstore] = offsets(r);
    PT xv[NV];
    load_chunk(r, xoff, moff, 0, xv, mw, with_mask);
    const float m = fold_row(r, xv, mw);
    const float base = exp_base(m);
    float e[kKeepExp ? NV : 1][VEC];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = vidx(0, i);
      if (v >= r.nload) continue;
      float z[VEC];
      logits<kLogits, T, VEC>(xv[i], 0u, v * VEC, r.len, s2, base, z);
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
          logits<kLogits, T, VEC>(xv[i], 0u, v * VEC, r.len, s2, base, t);
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
        cached_row(r, mw, h == h0);
      }
    }
    return;
  }

  // Uniform across a cluster: its CTAs share blockIdx.x / kCl.
  for (int rb = blockIdx.x / kCl; rb < p.row_blocks; rb += gridDim.x / kCl) {
    const SoftmaxRow r = row_at(rb);
    if constexpr (CACHED) {
      unsigned mw[kMaskWords];
      cached_row(r, mw, true);
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

}  // namespace rtcnorm
