// Element types the kernels are instantiated for.
#pragma once

#include <cstdint>
#include <string>

namespace rtcnorm::jit {

enum class DType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Spelling of the type inside kernel sources (kernels/common/types.cuh).
inline const char* kernel_type_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float";
    case DType::kFloat16:
      return "rtcnorm::fp16";
    case DType::kBFloat16:
      return "rtcnorm::bf16";
  }
  return "?";
}

inline const char* short_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

inline int element_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

}  // namespace rtcnorm::jit
