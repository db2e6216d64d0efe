// Softmax row helpers shared by the forward and backward kernels: scaled
// logits, the causal row extent, and a thread's vectors of a row (see
// softmax.cuh for the thread layout and invariants).
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

}  // namespace rtcnorm
