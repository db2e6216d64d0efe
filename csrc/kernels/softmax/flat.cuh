// Design: flat_row, the softmax forward and backward for rows whose width
// allows no 16-byte access (see softmax.cuh for the row layout).
//
// A persistent CTA stages its row blocks through the ring of
// common/flat_stage.cuh: x (forward), or y and dy (backward), land in shared
// memory in 16-byte pieces whatever N is; each row group works on its row
// there in VEC-wide vectors (VEC: the widest vector dividing N), writes the
// output in place in the stage (y over x, dx over dy) and the block is
// flushed in 16-byte pieces.
//
// Invariants (the host's planner guarantees them; see ops/softmax/plan):
// - x (forward), y and dy (backward) are contiguous rows x N from a 16-byte
//   aligned base; y and dx are the launcher's own allocations. N is the
//   kernel's row length (p.cols == N).
// - The row is not held in registers: each pass re-reads the stage, so a
//   row is as long as the ring lets shared memory hold, at any thread count.
// - The arithmetic is the cached rows' (softmax/fwd.cuh, softmax/bwd.cuh):
//   thread `lane` of a group takes vectors lane, lane + TPR, ... in that
//   order, and the same operations per element, so with the same VEC and TPR
//   the results are the same bits.
// - No mask: a masked forward is planned elsewhere. Causal rows read no
//   vector wholly past their last visible key and write zeros there; the
//   vector straddling it is masked to -inf (forward) or skipped (backward).
#pragma once

#include "common/flat_stage.cuh"
#include "softmax/rows.cuh"

namespace rtcnorm {

// f(v) for a lane's vectors of a pass over a staged row: v = i * TPR + lane
// for i < NV, those below `count`, in that order (the register rows' order).
// Unrolled at most 4 deep: more keeps loads in flight past the register budget.
template <int NV, int TPR, typename F>
__device__ __forceinline__ void each_vector(int lane, int count, F&& f) {
  constexpr int kUnroll = NV < 4 ? NV : 4;
#pragma unroll(kUnroll)
  for (int i = 0; i < NV; ++i) {
    const int v = i * TPR + lane;
    if (v < count) f(v);
  }
}

template <typename T, int N, int VEC, int TPR, int ROWS, int KIND, int MINB, unsigned OPTS>
__global__ void __launch_bounds__(TPR* ROWS, MINB) softmax_fwd_flat(const SoftmaxFwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kVecs = N / VEC;
  constexpr int kNv = (kVecs + TPR - 1) / TPR;  // vectors a thread takes per pass
  constexpr bool kCs = (OPTS & kSoftmaxStreamStore) != 0;
  constexpr int kBuf = flat_buffer_elems(ROWS, N, sizeof(T));
  static_assert(N % VEC == 0, "a row is whole vectors");
  static_assert(KIND != kSoftmaxMasked, "flat rows take no mask");

  __shared__ GroupScratch<TPR, ROWS, MaxSum> scratch;
  extern __shared__ __align__(16) unsigned char softmax_dyn_smem[];
  T* const stages = reinterpret_cast<T*>(softmax_dyn_smem);
  const int lane = threadIdx.x % TPR;
  const float s2 = p.scale_log2;

  const auto block = [&](long long rb, const FlatBlock& b, T* stage, int) {
    const SoftmaxRow r =
        softmax_row<VEC, TPR, ROWS, KIND == kSoftmaxCausal>(static_cast<int>(rb), p.sq, p.rows, N, p.diag);
    PT* const xs = reinterpret_cast<PT*>(stage + b.own + (threadIdx.x / TPR) * N);
    float m = neg_inf();
    each_vector<kNv, TPR>(lane, r.nload, [&](int v) {
      float z[VEC];
      logits<KIND, T, VEC>(xs[v], 0u, v * VEC, r.len, s2, 0.f, z);
#pragma unroll
      for (int j = 0; j < VEC; ++j) m = fmaxf(m, z[j]);
    });
    const float base = exp_base(m);
    float s = 0.f;
    each_vector<kNv, TPR>(lane, r.nload, [&](int v) {
      float z[VEC];
      logits<KIND, T, VEC>(xs[v], 0u, v * VEC, r.len, s2, base, z);
#pragma unroll
      for (int j = 0; j < VEC; ++j) s += fast_exp2(z[j]);
    });
    const float f = row_factor(m, group_allreduce<TPR, ROWS>(MaxSum{m, s}, scratch));
    each_vector<kNv, TPR>(lane, r.ok ? kVecs : 0, [&](int v) {
      PT out = zero_pack<T, VEC>();
      if (v < r.nload) {
        float z[VEC];
        logits<KIND, T, VEC>(xs[v], 0u, v * VEC, r.len, s2, base, z);
#pragma unroll
        for (int j = 0; j < VEC; ++j) out.e[j] = from_float<T>(fast_exp2(z[j]) * f);
      }
      xs[v] = out;
    });
    __syncthreads();  // the block's y is whole in the stage
    flat_flush<T, kCs>(static_cast<T*>(p.y), stage, b);
  };
  const auto nothing_early = [](long long) { return 0; };
  const T* const src[1] = {static_cast<const T*>(p.x)};
  flat_ring<T, 1, kBuf>(stages, src, p.row_blocks, ROWS, p.rows, N, nothing_early, block);
}

template <typename T, int N, int VEC, int TPR, int ROWS, bool CAUSAL, int MINB, unsigned OPTS>
__global__ void __launch_bounds__(TPR* ROWS, MINB) softmax_bwd_flat(const SoftmaxBwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kVecs = N / VEC;
  constexpr int kNv = (kVecs + TPR - 1) / TPR;
  constexpr bool kCs = (OPTS & kSoftmaxStreamStore) != 0;
  constexpr int kBuf = flat_buffer_elems(ROWS, N, sizeof(T));
  static_assert(N % VEC == 0, "a row is whole vectors");

  __shared__ GroupScratch<TPR, ROWS, Sum1> scratch;
  extern __shared__ __align__(16) unsigned char softmax_dyn_smem[];
  T* const stages = reinterpret_cast<T*>(softmax_dyn_smem);
  const int lane = threadIdx.x % TPR;

  const auto block = [&](long long rb, const FlatBlock& b, T* stage, int) {
    const SoftmaxRow r = softmax_row<VEC, TPR, ROWS, CAUSAL>(static_cast<int>(rb), p.sq, p.rows, N, p.diag);
    const int at = b.own + (threadIdx.x / TPR) * N;
    const PT* const ys = reinterpret_cast<const PT*>(stage + at);
    PT* const gs = reinterpret_cast<PT*>(stage + kBuf + at);
    // Lanes past the causal diagonal are skipped, so whatever dy holds there
    // never reaches the sum.
    const auto hidden = [&](int v, int j) { return CAUSAL && v * VEC + j >= r.len; };
    float s = 0.f;
    each_vector<kNv, TPR>(lane, r.nload, [&](int v) {
      const PT yv = ys[v], gv = gs[v];
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if (!hidden(v, j)) s = fmaf(elem_float(gv, j), elem_float(yv, j), s);
    });
    const float dot = group_allreduce<TPR, ROWS>(Sum1{s}, scratch).a;
    each_vector<kNv, TPR>(lane, r.ok ? kVecs : 0, [&](int v) {
      PT out = zero_pack<T, VEC>();
      if (v < r.nload) {
        const PT yv = ys[v], gv = gs[v];
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          if (!hidden(v, j)) out.e[j] = from_float<T>(elem_float(yv, j) * p.scale * (elem_float(gv, j) - dot));
      }
      gs[v] = out;
    });
    __syncthreads();  // the block's dx is whole in the stage
    flat_flush<T, kCs>(static_cast<T*>(p.dx), stage + kBuf, b);
  };
  const auto nothing_early = [](long long) { return 0; };
  const T* const src[2] = {static_cast<const T*>(p.y), static_cast<const T*>(p.dy)};
  flat_ring<T, 2, kBuf>(stages, src, p.row_blocks, ROWS, p.rows, N, nothing_early, block);
}

}  // namespace rtcnorm
