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
constexpr int kStreamCaptureStatusNone = 0;

struct DriverApi {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
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
};

// The loaded driver; throws a c10::Error naming the problem when there is none.
const DriverApi& driver();

// "what failed: CUDA_ERROR_... (code)"; throws when res != 0.
void check_cu(CUresult res, const char* what);

// Driver version as "major.minor", or "none" when no driver can be loaded.
std::string driver_version_string();

}  // namespace rtcnorm::jit
