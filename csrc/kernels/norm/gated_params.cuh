// Parameter blocks and flags of the gated RMSNorm kernels
// (rms_norm_gated.cuh), shared verbatim by the host and NVRTC.
//
// Invariants:
// - Plain structs of fixed-width members only; the host static_asserts
//   their sizes (ops/norm/gated.cpp). Each kernel takes its block by value.
// - x and gate rows start at row * x_stride and row * z_stride elements
//   (one stride each, the last dim contiguous); dy, y, dx and dz are
//   contiguous rows x N; rstd holds rows x (N / G) floats.
#pragma once

namespace rtcnorm {

// Template flag bits of the gated kernels (KernelKey::flags); the forward
// also takes params.cuh's kQuantBits and kBlockedScales (bits 25 to 28).
enum GatedFlags : unsigned {
  kGatedWeight = 1u << 0,     // y is scaled by weight (else by 1)
  kGatedNormFirst = 1u << 1,  // norm_before_gate: y = norm(x) * act(z); else y = norm(x * act(z))
  kGatedSigmoid = 1u << 2,    // act = sigmoid; else silu
  kGatedWantDw = 1u << 3,     // backward: write the CTA's dW partial row
};

struct GatedFwdParams {
  const void* x;
  const void* z;
  long long x_stride;
  long long z_stride;
  long long rows;
  long long row_blocks;  // ceil(rows / ROWS)
  const void* weight;    // N elements, when kGatedWeight
  void* y;               // y in T, or its codes with a recipe in kQuantBits (params.cuh)
  float* rstd;
  float eps;
  // Quantized outputs, as NormFwdParams' members of the same names
  // (norm/quant_epilogue.cuh): dequant scales, the tensor's amax (zeroed
  // by the host), the quantize / global scale, the scale matrix's pitch.
  int scale_cols;
  void* scales;
  float* amax;
  const float* qscale_ptr;
  float qscale;
  int pad;
};

struct GatedBwdParams {
  const void* x;
  const void* z;
  long long x_stride;
  long long z_stride;
  long long rows;
  long long row_blocks;
  const void* dy;
  const float* rstd;
  const void* weight;
  void* dx;
  void* dz;
  float* partial_w;  // gridDim.x x N, when kGatedWantDw
};

}  // namespace rtcnorm
