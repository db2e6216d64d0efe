// The CUDA driver API, loaded lazily with dlopen.
//
// Invariants:
// - No CUDA header is needed to build: the few driver types and entry points
//   rtcnorm uses are declared here with the driver's stable C ABI.
// - libcuda is opened on first use only, so importing rtcnorm works on a
//   machine without a GPU or driver; any use there raises a clear error.
#pragma once

#include <string>

namespace rtcnorm::jit {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

// Values from the driver API's cuda.h (stable across releases).
constexpr int kAttrMaxThreadsPerBlock = 1;
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
constexpr int kFuncAttrNumRegs = 4;
constexpr int kFuncAttrSharedSizeBytes = 1;                 // static shared memory
constexpr int kFuncAttrNonPortableClusterSizeAllowed = 14;  // clusters past 8 CTAs (sm_90: 16)
constexpr int kStreamCaptureStatusNone = 0;
constexpr int kLaunchAttrCooperative = 2;  // every CTA resident at once, or the launch fails
constexpr int kLaunchAttrClusterDimension = 4;
constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;  // sm_90+

// cuLaunchKernelEx's launch description (cuda.h's CUlaunchConfig and
// CUlaunchAttribute: an 8-byte id slot, then a 64-byte value union).
struct LaunchAttribute {
  int id;
  char pad_[4];
  union {
    char bytes[64];
    struct {
      unsigned x, y, z;
    } cluster_dim;
    int programmatic_serialization;  // 1: may start before the previous kernel ends
    int cooperative;                 // 1: all CTAs co-resident
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute layout");
struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned smem_bytes;
  CUstream stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};

struct DriverApi {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void**, void**);
  CUresult (*cuStreamIsCapturing)(CUstream, int*);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  // Thread-block clusters and programmatic launches (CUDA 12+ drivers); null
  // on an older driver, where the planner's sm_90 cluster kernels cannot run
  // anyway and programmatic launches fall back to plain ones.
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuOccupancyMaxActiveClusters)(int*, CUfunction, const LaunchConfig*);
};

// The loaded driver; throws a c10::Error naming the problem when there is none.
const DriverApi& driver();

// "what failed: CUDA_ERROR_... (code)"; throws when res != 0.
void check_cu(CUresult res, const char* what);

// Driver version as "major.minor", or "none" when no driver can be loaded.
std::string driver_version_string();

}  // namespace rtcnorm::jit
