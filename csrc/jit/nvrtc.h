// NVRTC, loaded lazily with dlopen, and the compile step of the JIT.
//
// Search order for libnvrtc:
//   1. RTCNORM_NVRTC_PATH: the library file itself, or a folder holding it;
//      when set, nothing else is tried.
//   2. Folders registered by the Python package at import: the NVIDIA wheels
//      torch depends on (site-packages/nvidia/cu13/lib, .../cuda_nvrtc/lib).
//   3. $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64.
//   4. The system loader (LD_LIBRARY_PATH, ldconfig).
#pragma once

#include <string>
#include <vector>

#include "jit/kernel_key.h"

namespace rtcnorm::jit {

// Folders tried in step 2, in order. Takes effect until NVRTC is first loaded.
void set_nvrtc_search_dirs(std::vector<std::string> dirs);

struct NvrtcInfo {
  std::string path;  // the library that was loaded
  int major = 0, minor = 0;
  std::vector<int> archs;  // sm_XX values this NVRTC can emit cubins for
};

// Loads NVRTC on first call; throws a c10::Error listing every place tried.
const NvrtcInfo& nvrtc_info();

struct CompiledKernel {
  std::string image;  // cubin, or NUL-terminated PTX
  bool is_cubin = true;
  std::string lowered_name;  // mangled symbol of the instantiation
  std::string target;        // "sm_90" or "compute_100" (PTX fallback)
};

// Compile options used for `arch` and the target they produce, without
// compiling: part of the disk-cache key.
std::vector<std::string> compile_options(int arch, std::string* target, bool* is_cubin);

// ptxas' resource report for key's instantiation on key.arch, compiled
// afresh (no cache, no GPU). `reported` is false where NVRTC only emits PTX
// for that arch (the driver runs the final compile).
struct PtxasUsage {
  std::string target;
  bool reported = false;
  int registers = -1;     // a thread
  int spill_stores = -1;  // bytes a thread
  int spill_loads = -1;
  int stack_frame = -1;
};
PtxasUsage ptxas_usage(const KernelKey& key);

// Compiles key's instantiation for key.arch. Throws on failure with the NVRTC
// log, the key and the NVRTC / driver versions.
CompiledKernel compile_kernel(const KernelKey& key);

}  // namespace rtcnorm::jit
