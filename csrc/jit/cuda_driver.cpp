#include "jit/cuda_driver.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <mutex>

namespace rtcnorm::jit {
namespace {

struct LoadedDriver {
  DriverApi api{};
  std::string error;  // empty when loaded
};

template <typename F>
bool bind(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) error = std::string("libcuda.so.1 has no symbol ") + name;
  return fn != nullptr;
}

LoadedDriver load_driver() {
  LoadedDriver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    d.error = std::string("the CUDA driver (libcuda.so.1) could not be loaded: ") + (why ? why : "unknown error");
    return d;
  }
  auto& a = d.api;
  auto& e = d.error;
  bool ok =
      bind(lib, "cuInit", a.cuInit, e) && bind(lib, "cuDriverGetVersion", a.cuDriverGetVersion, e) &&
      bind(lib, "cuDeviceGet", a.cuDeviceGet, e) && bind(lib, "cuDeviceGetAttribute", a.cuDeviceGetAttribute, e) &&
      bind(lib, "cuDeviceGetName", a.cuDeviceGetName, e) &&
      bind(lib, "cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain, e) &&
      bind(lib, "cuCtxGetCurrent", a.cuCtxGetCurrent, e) && bind(lib, "cuCtxSetCurrent", a.cuCtxSetCurrent, e) &&
      bind(lib, "cuModuleLoadData", a.cuModuleLoadData, e) && bind(lib, "cuModuleUnload", a.cuModuleUnload, e) &&
      bind(lib, "cuModuleGetFunction", a.cuModuleGetFunction, e) &&
      bind(lib, "cuFuncSetAttribute", a.cuFuncSetAttribute, e) &&
      bind(lib, "cuFuncGetAttribute", a.cuFuncGetAttribute, e) &&
      bind(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor", a.cuOccupancyMaxActiveBlocksPerMultiprocessor, e) &&
      bind(lib, "cuLaunchKernel", a.cuLaunchKernel, e) && bind(lib, "cuStreamIsCapturing", a.cuStreamIsCapturing, e) &&
      bind(lib, "cuGetErrorString", a.cuGetErrorString, e);
  a.cuLaunchKernelEx = reinterpret_cast<decltype(a.cuLaunchKernelEx)>(dlsym(lib, "cuLaunchKernelEx"));
  a.cuOccupancyMaxActiveClusters =
      reinterpret_cast<decltype(a.cuOccupancyMaxActiveClusters)>(dlsym(lib, "cuOccupancyMaxActiveClusters"));
  if (ok) {
    const CUresult r = a.cuInit(0);
    if (r != 0) d.error = "cuInit failed with CUDA driver error " + std::to_string(r);
  }
  return d;
}

const LoadedDriver& loaded() {
  static const LoadedDriver d = load_driver();
  return d;
}

}  // namespace

const DriverApi& driver() {
  const LoadedDriver& d = loaded();
  TORCH_CHECK(d.error.empty(), "rtcnorm: ", d.error);
  return d.api;
}

void check_cu(CUresult res, const char* what) {
  if (res == 0) return;
  const char* msg = nullptr;
  if (loaded().error.empty()) loaded().api.cuGetErrorString(res, &msg);
  TORCH_CHECK(false, "rtcnorm: ", what, " failed: ", msg ? msg : "unknown CUDA driver error", " (", res, ")");
}

std::string driver_version_string() {
  const LoadedDriver& d = loaded();
  if (!d.error.empty()) return "none";
  int v = 0;
  if (d.api.cuDriverGetVersion(&v) != 0) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace rtcnorm::jit
