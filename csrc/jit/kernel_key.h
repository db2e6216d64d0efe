// The typed identity of one compiled kernel.
//
// Invariants:
// - A key determines the kernel's source-level instantiation completely: two
//   equal keys always name the same code. The arch is part of the key, so a
//   cubin built for sm_90 is never handed to an sm_80 device.
// - Hashing and comparison touch only fixed-size fields: no strings are built
//   on the launch path. Strings (the name expression, the disk-cache key text)
//   are built only on a miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "jit/dtype.h"

namespace rtcnorm::jit {

// CTAs a thread-block cluster may hold without the non-portable opt-in that
// get_kernel makes for larger ones, and the most sm_90 allows with it.
constexpr int kMaxPortableCluster = 8;
constexpr int kMaxNonPortableCluster = 16;

struct KernelKey;

// A kernel template: which embedded header defines it and how to spell one of
// its instantiations. Families are static objects; keys compare them by address.
struct KernelFamily {
  const char* name;    // e.g. "rms_norm_fwd"
  const char* header;  // e.g. "rms_norm.cuh"
  std::string (*name_expression)(const KernelKey&);
};

struct KernelKey {
  const KernelFamily* family = nullptr;
  DType dtype = DType::kFloat32;   // input / output element type
  DType wdtype = DType::kFloat32;  // weight element type (or the op's second type)
  int32_t hidden = 0;              // N: elements per row
  int16_t vec = 1;                 // elements per vector access
  int16_t threads_per_row = 1;
  int16_t rows_per_cta = 1;
  int16_t vecs_per_thread = 1;
  uint32_t flags = 0;
  int16_t variant = 0;  // family-specific selector (e.g. softmax mask kind)
  int16_t arch = 0;     // sm_XX as XX (e.g. 90)
  // CTAs per thread-block cluster along x (1: no cluster; sm_90+ otherwise).
  // A launch property the kernel's own template arguments also encode.
  int16_t cluster = 1;

  bool operator==(const KernelKey& o) const {
    return family == o.family && dtype == o.dtype && wdtype == o.wdtype && hidden == o.hidden && vec == o.vec &&
           threads_per_row == o.threads_per_row && rows_per_cta == o.rows_per_cta &&
           vecs_per_thread == o.vecs_per_thread && flags == o.flags && variant == o.variant && arch == o.arch &&
           cluster == o.cluster;
  }
  int threads() const { return threads_per_row * rows_per_cta; }
  std::string name_expression() const { return family->name_expression(*this); }
  // Human-readable description for errors and logs.
  std::string describe() const;
};

struct KernelKeyHash {
  size_t operator()(const KernelKey& k) const noexcept {
    uint64_t h = reinterpret_cast<uintptr_t>(k.family);
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ULL; };
    mix(static_cast<uint64_t>(k.dtype) | (static_cast<uint64_t>(k.wdtype) << 8));
    mix(static_cast<uint32_t>(k.hidden));
    mix(static_cast<uint64_t>(static_cast<uint16_t>(k.vec)) |
        (static_cast<uint64_t>(static_cast<uint16_t>(k.threads_per_row)) << 16) |
        (static_cast<uint64_t>(static_cast<uint16_t>(k.rows_per_cta)) << 32) |
        (static_cast<uint64_t>(static_cast<uint16_t>(k.vecs_per_thread)) << 48));
    mix(k.flags);
    mix(static_cast<uint64_t>(static_cast<uint16_t>(k.variant)) |
        (static_cast<uint64_t>(static_cast<uint16_t>(k.arch)) << 16) |
        (static_cast<uint64_t>(static_cast<uint16_t>(k.cluster)) << 32));
    return static_cast<size_t>(h);
  }
};

}  // namespace rtcnorm::jit
