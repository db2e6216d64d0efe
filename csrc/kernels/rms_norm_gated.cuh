// Gated RMSNorm kernels. With act = silu or sigmoid, a row split into S =
// N / G groups of G consecutive columns, and per group
//   rstd = rsqrt(mean(h^2) + eps), n = h * rstd,
// norm_before_gate (kGatedNormFirst): h = x, y = n * w * act(z);
// otherwise:                          h = x * act(z), y = n * w.
//
// Thread layout: a CTA holds ROWS row slots of RT threads; a slot is S
// segment groups of TPR = RT / S threads, group k owning the G columns of
// segment k (its vectors lane, lane + TPR, ..., NV of them, SV in all). A
// group's sums are reduced with group_allreduce over TPR threads, so every
// thread of a group ends with bitwise the same statistic.
//
// Invariants (the host guarantees them, ops/norm/gated.cpp):
// - G % VEC == 0, every x / z base and row stride is VEC-aligned, dy and the
//   outputs are contiguous; the segment is one chunk (SV <= TPR * NV).
// - TPR is a power of two up to 32, else a multiple of 32 (any, for one
//   segment; a power of two for more); RT * ROWS is a multiple of 32 of at
//   most 512 threads.
// - The row-block loops are uniform across the CTA (rows past the end take
//   part in the reductions), so any grid of at most row_blocks CTAs works.
// - Backward: a persistent grid-stride kernel. Each CTA sums its dW terms
//   in fp32 registers and writes exactly one (N floats) partial row; row
//   slots are summed through shared memory in slot order, and column_reduce.cuh
//   sums the partial rows in a fixed order: no atomics, and the same bits on
//   every run for a given (M, N, grid).
// - fp32 arithmetic throughout; outputs rounded once to T.
#pragma once

#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "norm/gated_params.cuh"
#include "norm/quant_epilogue.cuh"

namespace rtcnorm {

// act(z) and its derivative. __fdividef is exact enough here (1 ulp-ish) and
// returns 0 where exp(-z) overflows, the limit of sigmoid.
template <unsigned FLAGS>
__device__ __forceinline__ float gate_act(float z, float& dact) {
  const float s = __fdividef(1.f, 1.f + __expf(-z));
  if constexpr ((FLAGS & kGatedSigmoid) != 0) {
    dact = s * (1.f - s);
    return s;
  } else {
    dact = s * fmaf(z, 1.f - s, 1.f);
    return z * s;
  }
}

// gamma of the VEC elements from column `col` as floats; 1 without a weight.
template <typename W, int VEC, unsigned FLAGS>
__device__ __forceinline__ void gated_weight(const void* weight, long long col, float (&w)[VEC]) {
  if constexpr ((FLAGS & kGatedWeight) != 0) {
    to_floats<W, VEC>(load_cached<W, VEC>(static_cast<const W*>(weight), col), w);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) w[j] = 1.f;
  }
}

template <int N, int G, int RT>
struct GatedLayout {
  static constexpr int kS = N / G;      // segments of a row
  static constexpr int kTpr = RT / kS;  // threads of a segment
  static_assert(N % G == 0 && RT % kS == 0, "a row slot is S segment groups");
};

template <typename T, typename W, int N, int G, int VEC, int RT, int ROWS, int NV, unsigned FLAGS>
__global__ void __launch_bounds__(RT* ROWS) rms_norm_gated_fwd(const GatedFwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kS = GatedLayout<N, G, RT>::kS;
  constexpr int kTpr = GatedLayout<N, G, RT>::kTpr;
  constexpr int kSv = G / VEC;
  constexpr bool kEven = kSv % (kTpr * NV) == 0;
  constexpr bool kFirst = (FLAGS & kGatedNormFirst) != 0;
  static_assert(G % VEC == 0 && kSv <= kTpr * NV, "a segment is one chunk of whole vectors");
  // Quantized outputs: a block lies within one segment, on kLanes lanes of
  // its group; a per-token row's amax is reduced over its RT threads.
  using Quant = QuantEpilogue<T, N, VEC, kTpr, FLAGS, GatedFwdParams>;
  static_assert(Quant::kBlock == 0 || (kTpr >= Quant::kLanes && (kS == 1 || G % Quant::kBlock == 0)),
                "a quantization block lies in one segment, on lanes of its group");
  static_assert(!Quant::kRowAmax || quant::per_token(Quant::kRecipe), "block scales come from the block's lanes");
  static_assert(!quant::per_token(Quant::kRecipe) || (RT % 32 == 0 || (RT < 32 && (RT & (RT - 1)) == 0)),
                "a per-token row is whole warps or a power-of-two lane group");
  __shared__ GroupScratch<kTpr, ROWS * kS, Sum1> scratch;
  const int seg_slot = threadIdx.x / kTpr;
  const int lane = threadIdx.x % kTpr;
  const int slot = seg_slot / kS, seg = seg_slot % kS;
  const long long col0 = 1LL * seg * G;
  const T* x = static_cast<const T*>(p.x);
  const T* z = static_cast<const T*>(p.z);
  T* y = static_cast<T*>(p.y);
  constexpr float kInvG = 1.f / static_cast<float>(G);
  Quant quant_out(p);

  for (long long rb = blockIdx.x; rb < p.row_blocks; rb += gridDim.x) {
    const long long row = rb * ROWS + slot;
    const bool row_ok = row < p.rows;
    const long long xoff = row_ok ? row * p.x_stride + col0 : 0;
    const long long zoff = row_ok ? row * p.z_stride + col0 : 0;
    // Every load is issued before any act(z), so a thread's loads are all in
    // flight at once. Norm first keeps x and z packed across the reduction
    // and takes act(z) after it: the fewest live registers. Gate first keeps
    // h = x * act(z), which the sums need.
    PT xv[NV], zv[NV];
    float h[kFirst ? 1 : NV][VEC];
    Sum1 s = {0.f};
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * kTpr + lane;
      if (!row_ok || !(kEven || v < kSv)) continue;
      xv[i] = load_nc<T, VEC>(x, xoff + 1LL * v * VEC);
      zv[i] = load_nc<T, VEC>(z, zoff + 1LL * v * VEC);
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * kTpr + lane;
      if (!row_ok || !(kEven || v < kSv)) continue;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        float dact;
        const float xf = elem_float(xv[i], j);
        const float hf = kFirst ? xf : xf * gate_act<FLAGS>(elem_float(zv[i], j), dact);
        if constexpr (!kFirst) h[i][j] = hf;
        s.a = fmaf(hf, hf, s.a);
      }
    }
    s = group_allreduce<kTpr, ROWS * kS>(s, scratch);
    const float rstd = rsqrtf(s.a * kInvG + p.eps);
    if (row_ok && lane == 0) p.rstd[row * kS + seg] = rstd;
    // A per-token row takes its outputs twice (its amax, then its codes):
    // norm first, the first pass keeps act(z) for the second.
    constexpr bool kKeepAct = kFirst && Quant::kRowAmax;
    float post[kKeepAct ? NV : 1][VEC];
    // Vector i's outputs in fp32.
    auto output = [&](int i, int v, float(&out)[VEC]) {
      float w[VEC];
      gated_weight<W, VEC, FLAGS>(p.weight, col0 + 1LL * v * VEC, w);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if constexpr (kFirst) {
          float dact;
          if constexpr (kKeepAct)
            out[j] = elem_float(xv[i], j) * rstd * w[j] * post[i][j];
          else
            out[j] = elem_float(xv[i], j) * rstd * w[j] * gate_act<FLAGS>(elem_float(zv[i], j), dact);
        } else {
          out[j] = h[i][j] * rstd * w[j];
        }
      }
    };
    float row_value = 0.f;  // per-token: the row's multiplier
    if constexpr (Quant::kRowAmax) {
      float a = 0.f;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = i * kTpr + lane;
        if (!row_ok || !(kEven || v < kSv)) continue;
        if constexpr (kKeepAct) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            float dact;
            post[i][j] = gate_act<FLAGS>(elem_float(zv[i], j), dact);
          }
        }
        float out[VEC];
        output(i, v, out);
#pragma unroll
        for (int j = 0; j < VEC; ++j) a = fmaxf(a, fabsf(out[j]));
      }
      row_value = Quant::template row_value_of<RT, ROWS>(p, row, a, row_ok && seg == 0 && lane == 0);
    }
    const auto qrow = Quant::template row_of<(kEven ? Quant::kPinned : Quant::kPointer)>(p, row);
    if constexpr (Quant::kLaneSplit) {  // one element a slot: the outputs, then their codes
      bool oks[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) oks[i] = row_ok && (kEven || i * kTpr + lane < kSv);
      quant_out.template emit_slots<false>(p, qrow, seg * kSv + lane, lane, oks, [&](int i) {
        float out[1];
        output(i, i * kTpr + lane, out);
        return out[0];
      });
      continue;
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * kTpr + lane;
      const bool ok = row_ok && (kEven || v < kSv);
      float out[VEC];
      if constexpr (Quant::kRecipe == 0) {
        if (!ok) continue;
        output(i, v, out);
        store<T, VEC>(y, row * N + col0 + 1LL * v * VEC, from_floats<T, VEC>(out));
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) out[j] = 0.f;
        if (ok) output(i, v, out);
        // v of the whole row: the segment's first vector is seg * kSv.
        quant_out.template emit<false>(p, qrow, seg * kSv + v, lane, ok, out, row_value);
      }
    }
  }
  if constexpr (Quant::kRecipe != 0) quant_out.finish(p);
}

// One element's backward terms. With a = act(z), n = h * rstd, wdy = w * dy:
//   dn = wdy * a (norm first) or wdy;  dW term dy * n * a (or dy * n);
//   the group sum needs dn * n. The caller adds the sums, then dx / dz.
struct GatedTerms {
  float n, dn, a, da, wdy;
};

template <unsigned FLAGS>
__device__ __forceinline__ GatedTerms gated_terms(float x, float z, float dy, float w, float rstd) {
  GatedTerms t;
  t.a = gate_act<FLAGS>(z, t.da);
  t.wdy = w * dy;
  if constexpr ((FLAGS & kGatedNormFirst) != 0) {
    t.n = x * rstd;
    t.dn = t.wdy * t.a;
  } else {
    t.n = (x * t.a) * rstd;
    t.dn = t.wdy;
  }
  return t;
}

template <typename T, typename W, int N, int G, int VEC, int RT, int ROWS, int NV, unsigned FLAGS>
__global__ void __launch_bounds__(RT* ROWS) rms_norm_gated_bwd(const GatedBwdParams p) {
  using PT = Pack<T, VEC>;
  constexpr int kS = GatedLayout<N, G, RT>::kS;
  constexpr int kTpr = GatedLayout<N, G, RT>::kTpr;
  constexpr int kSv = G / VEC;
  constexpr bool kEven = kSv % (kTpr * NV) == 0;
  constexpr bool kFirst = (FLAGS & kGatedNormFirst) != 0;
  constexpr bool kW = (FLAGS & kGatedWeight) != 0;
  constexpr bool kDw = kW && (FLAGS & kGatedWantDw) != 0;
  static_assert(G % VEC == 0 && kSv <= kTpr * NV, "a segment is one chunk of whole vectors");
  __shared__ GroupScratch<kTpr, ROWS * kS, Sum1> scratch;
  // Row slots' dW sums, summed here in slot order (ROWS > 1 only; the host
  // keeps ROWS * N floats within 32 KB).
  __shared__ float combine[ROWS > 1 && kDw ? ROWS * N : 1];
  const int seg_slot = threadIdx.x / kTpr;
  const int lane = threadIdx.x % kTpr;
  const int slot = seg_slot / kS, seg = seg_slot % kS;
  const long long col0 = 1LL * seg * G;
  const T* x = static_cast<const T*>(p.x);
  const T* z = static_cast<const T*>(p.z);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.dx);
  T* dz = static_cast<T*>(p.dz);
  constexpr float kInvG = 1.f / static_cast<float>(G);

  float dw[kDw ? NV : 1][VEC];
#pragma unroll
  for (int i = 0; i < (kDw ? NV : 1); ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[i][j] = 0.f;

  for (long long rb = blockIdx.x; rb < p.row_blocks; rb += gridDim.x) {
    const long long row = rb * ROWS + slot;
    const bool row_ok = row < p.rows;
    const long long xoff = row_ok ? row * p.x_stride + col0 : 0;
    const long long zoff = row_ok ? row * p.z_stride + col0 : 0;
    const long long goff = row * N + col0;
    const float rstd = row_ok ? p.rstd[row * kS + seg] : 0.f;
    PT xv[NV], zv[NV], dv[NV];
    Sum1 c = {0.f};
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * kTpr + lane;
      if (!row_ok || !(kEven || v < kSv)) continue;
      xv[i] = load_nc<T, VEC>(x, xoff + 1LL * v * VEC);
      zv[i] = load_nc<T, VEC>(z, zoff + 1LL * v * VEC);
      dv[i] = load_nc<T, VEC>(dy, goff + 1LL * v * VEC);
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * kTpr + lane;
      if (!row_ok || !(kEven || v < kSv)) continue;
      float w[VEC];
      gated_weight<W, VEC, FLAGS>(p.weight, col0 + 1LL * v * VEC, w);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float df = elem_float(dv[i], j);
        const GatedTerms t = gated_terms<FLAGS>(elem_float(xv[i], j), elem_float(zv[i], j), df, w[j], rstd);
        c.a = fmaf(t.dn, t.n, c.a);
        if constexpr (kDw) dw[i][j] = fmaf(df, kFirst ? t.n * t.a : t.n, dw[i][j]);
      }
    }
    const float cm = group_allreduce<kTpr, ROWS * kS>(c, scratch).a * kInvG;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = i * kTpr + lane;
      if (!row_ok || !(kEven || v < kSv)) continue;
      float w[VEC];
      gated_weight<W, VEC, FLAGS>(p.weight, col0 + 1LL * v * VEC, w);
      float gx[VEC], gz[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float xf = elem_float(xv[i], j);
        const GatedTerms t = gated_terms<FLAGS>(xf, elem_float(zv[i], j), elem_float(dv[i], j), w[j], rstd);
        const float dh = rstd * fmaf(-t.n, cm, t.dn);
        if constexpr (kFirst) {
          gx[j] = dh;
          gz[j] = t.wdy * t.n * t.da;
        } else {
          gx[j] = dh * t.a;
          gz[j] = dh * xf * t.da;
        }
      }
      store<T, VEC>(dx, goff + 1LL * v * VEC, from_floats<T, VEC>(gx));
      store<T, VEC>(dz, goff + 1LL * v * VEC, from_floats<T, VEC>(gz));
    }
  }

  if constexpr (kDw) {
    float* part = p.partial_w + 1LL * blockIdx.x * N + col0;
    if constexpr (ROWS == 1) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = i * kTpr + lane;
        if (!(kEven || v < kSv)) continue;
#pragma unroll
        for (int j = 0; j < VEC; ++j) part[v * VEC + j] = dw[i][j];
      }
    } else {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = i * kTpr + lane;
        if (!(kEven || v < kSv)) continue;
#pragma unroll
        for (int j = 0; j < VEC; ++j) combine[slot * N + col0 + v * VEC + j] = dw[i][j];
      }
      __syncthreads();
      for (int col = threadIdx.x; col < N; col += blockDim.x) {
        float t = combine[col];
#pragma unroll
        for (int r = 1; r < ROWS; ++r) t += combine[r * N + col];
        p.partial_w[1LL * blockIdx.x * N + col] = t;
      }
    }
  }
}

}  // namespace rtcnorm
