// The softmax planning problem: everything that decides which kernel runs
// and how it is launched. Two equal problems always get the same plan, so
// plans are memoized by problem (planner.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "jit/dtype.h"
#include "kernels/common/softmax_params.cuh"

namespace rtcnorm {

// The op variants. Causal and aligned causal run the same kernels (the
// diagonal offset is a parameter); the problem keeps them apart so that a
// trace names what was asked for.
enum class SoftmaxVariant : uint8_t { kPlain, kMasked, kCausal, kAlignedCausal };

// The device's limits that plans depend on. A fixed table per arch keeps
// kernel keys identical between GPU-less precompile and the device.
struct SoftmaxArch {
  int arch = 90;         // sm_XX as XX
  int sm_count = 0;      // 0: unknown (kernels listed ahead of time)
  int64_t smem_bytes;    // dynamic shared memory one CTA may opt into
  bool clusters = true;  // thread-block clusters (sm_90+)

  explicit SoftmaxArch(int a = 90, int sms = 0);
  bool operator==(const SoftmaxArch& o) const {
    return arch == o.arch && sm_count == o.sm_count && smem_bytes == o.smem_bytes && clusters == o.clusters;
  }
};

struct SoftmaxProblem {
  SoftmaxVariant variant = SoftmaxVariant::kPlain;
  bool backward = false;  // the backward reads y and dy; it asks only "causal or not"
  jit::DType dtype = jit::DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;  // sk
  // Causal: queries per (sq x sk) matrix (0: unknown). A single query sees
  // every key, so it runs the plain kernels.
  int64_t sq = 0;
  int max_vec = 1;  // widest access every pointer and stride allows (elements)
  // Masked forward: rows sharing each mask row along a broadcast dim that
  // has rows of its own below it, e.g. heads for a (b, 1, sq, sk) mask
  // against (b, h, sq, sk) scores; 1 when the mask is not broadcast so.
  int64_t mask_bcast = 1;
  // Every row tensor (x; or y and dy) is contiguous rows x cols from a
  // 16-byte aligned base: one flat array (flat_row).
  bool flat = false;
  SoftmaxArch arch;

  bool operator==(const SoftmaxProblem& o) const {
    return variant == o.variant && backward == o.backward && dtype == o.dtype && rows == o.rows && cols == o.cols &&
           sq == o.sq && max_vec == o.max_vec && mask_bcast == o.mask_bcast && flat == o.flat && arch == o.arch;
  }

  // The mask kind the kernels run: causal rows of one query run unmasked.
  SoftmaxKind kernel_kind() const {
    if (variant == SoftmaxVariant::kMasked) return backward ? kSoftmaxPlain : kSoftmaxMasked;
    if (variant == SoftmaxVariant::kPlain || sq == 1) return kSoftmaxPlain;
    return kSoftmaxCausal;
  }
  bool causal() const { return variant == SoftmaxVariant::kCausal || variant == SoftmaxVariant::kAlignedCausal; }
  // A masked forward whose mask row is shared by consecutive-in-order rows.
  bool broadcast_mask() const { return !backward && variant == SoftmaxVariant::kMasked && mask_bcast > 1; }
};

struct SoftmaxProblemHash {
  size_t operator()(const SoftmaxProblem& p) const noexcept {
    uint64_t h = 0xcbf29ce484222325ULL;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ULL; };
    mix(static_cast<uint64_t>(p.variant) | uint64_t(p.backward) << 8 | uint64_t(p.dtype) << 16 |
        uint64_t(p.max_vec) << 24 | uint64_t(p.flat) << 32 | uint64_t(p.arch.clusters) << 40 |
        uint64_t(p.arch.arch) << 48);
    mix(static_cast<uint64_t>(p.rows));
    mix(static_cast<uint64_t>(p.cols));
    mix(static_cast<uint64_t>(p.sq));
    mix(static_cast<uint64_t>(p.mask_bcast));
    mix(static_cast<uint64_t>(p.arch.sm_count) | static_cast<uint64_t>(p.arch.smem_bytes) << 20);
    return static_cast<size_t>(h);
  }
};

}  // namespace rtcnorm
