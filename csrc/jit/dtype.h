// Element types the kernels are instantiated for.
#pragma once

#include <cstdint>
#include <stdexcept>
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

// The inverse of short_name; the bindings' ValueError for any other name.
inline DType dtype_from_name(const std::string& s) {
  if (s == "float32") return DType::kFloat32;
  if (s == "float16") return DType::kFloat16;
  if (s == "bfloat16") return DType::kBFloat16;
  throw std::invalid_argument("rtcnorm: dtype must be 'float32', 'float16' or 'bfloat16', got '" + s + "'");
}

inline int element_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

}  // namespace rtcnorm::jit
