#include "jit/kernel_cache.h"

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "jit/disk_cache.h"

namespace rtcnorm::jit {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct AtomicStats {
  std::atomic<uint64_t> memory_hits{0}, memory_misses{0}, image_hits{0}, disk_hits{0}, disk_misses{0}, disk_corrupt{0},
      disk_writes{0}, compiles{0}, module_loads{0};
  std::atomic<uint64_t> compile_us{0}, disk_load_us{0}, module_load_us{0};
};
AtomicStats g_stats;

void add_ms(std::atomic<uint64_t>& us, double ms) { us.fetch_add(static_cast<uint64_t>(ms * 1000.0)); }

// ---- compiled images, shared by all devices of an arch ----------------------

using ImagePtr = std::shared_ptr<const CompiledKernel>;
std::mutex g_images_mutex;
std::unordered_map<KernelKey, std::shared_future<ImagePtr>, KernelKeyHash> g_images;

ImagePtr load_or_compile(const KernelKey& key, bool* compiled) {
  *compiled = false;
  const std::string key_text = disk_key_text(key);
  CompiledKernel k;
  auto t0 = Clock::now();
  DiskLookup r = disk_cache_load(key.arch, key_text, &k);
  if (r == DiskLookup::kHit) {
    g_stats.disk_hits++;
    add_ms(g_stats.disk_load_us, ms_since(t0));
    return std::make_shared<const CompiledKernel>(std::move(k));
  }
  if (r == DiskLookup::kCorrupt) g_stats.disk_corrupt++;
  if (r != DiskLookup::kDisabled) {
    // Another process may be compiling the same entry: wait for it, re-check.
    DiskEntryLock lock(key.arch, key_text);
    t0 = Clock::now();
    r = disk_cache_load(key.arch, key_text, &k);
    if (r == DiskLookup::kHit) {
      g_stats.disk_hits++;
      add_ms(g_stats.disk_load_us, ms_since(t0));
      return std::make_shared<const CompiledKernel>(std::move(k));
    }
    g_stats.disk_misses++;
    t0 = Clock::now();
    k = compile_kernel(key);
    g_stats.compiles++;
    add_ms(g_stats.compile_us, ms_since(t0));
    *compiled = true;
    if (disk_cache_store(key.arch, key_text, k)) g_stats.disk_writes++;
    return std::make_shared<const CompiledKernel>(std::move(k));
  }
  t0 = Clock::now();
  k = compile_kernel(key);
  g_stats.compiles++;
  add_ms(g_stats.compile_us, ms_since(t0));
  *compiled = true;
  return std::make_shared<const CompiledKernel>(std::move(k));
}

}  // namespace

ImagePtr compiled_image(const KernelKey& key, bool* compiled) {
  *compiled = false;
  std::promise<ImagePtr> promise;
  std::shared_future<ImagePtr> existing;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(g_images_mutex);
    auto it = g_images.find(key);
    if (it != g_images.end()) {
      existing = it->second;
    } else {
      g_images.emplace(key, promise.get_future().share());
      owner = true;
    }
  }
  if (!owner) {
    g_stats.image_hits++;
    return existing.get();  // rethrows the builder's error
  }
  try {
    ImagePtr p = load_or_compile(key, compiled);
    promise.set_value(p);
    return p;
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(g_images_mutex);
      g_images.erase(key);
    }
    promise.set_exception(std::current_exception());
    throw;
  }
}

namespace {

// ---- per-device loaded functions -------------------------------------------

constexpr int kMaxDevices = 64;

struct DeviceSlot {
  std::once_flag init;
  DeviceInfo info;
  CUcontext ctx = nullptr;
  std::shared_mutex mutex;
  std::unordered_map<KernelKey, LoadedKernel, KernelKeyHash> kernels;
};
std::array<DeviceSlot, kMaxDevices> g_devices;

DeviceSlot& slot(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "rtcnorm: CUDA device index ", device, " is out of range");
  DeviceSlot& s = g_devices[device];
  std::call_once(s.init, [&] {
    const DriverApi& d = driver();
    CUdevice dev = 0;
    check_cu(d.cuDeviceGet(&dev, device), "cuDeviceGet");
    int major = 0, minor = 0;
    check_cu(d.cuDeviceGetAttribute(&s.info.sm_count, kAttrMultiprocessorCount, dev), "cuDeviceGetAttribute");
    check_cu(d.cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute");
    check_cu(d.cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute");
    check_cu(d.cuDeviceGetAttribute(&s.info.max_smem_optin, kAttrMaxSharedMemoryPerBlockOptin, dev),
             "cuDeviceGetAttribute");
    s.info.arch = major * 10 + minor;
    char name[128] = {};
    check_cu(d.cuDeviceGetName(name, sizeof name - 1, dev), "cuDeviceGetName");
    s.info.name = name;
    check_cu(d.cuDevicePrimaryCtxRetain(&s.ctx, dev), "cuDevicePrimaryCtxRetain");
  });
  return s;
}

// torch runs on each device's primary context, but a thread torch never
// touched through the runtime (the autograd engine's worker, a user thread)
// may have no current context, and every driver call below needs one.
void make_current(CUcontext ctx) {
  const DriverApi& d = driver();
  CUcontext cur = nullptr;
  check_cu(d.cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
  if (cur != ctx) check_cu(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

// A cuLaunchKernelEx description with the cluster shape (cluster x 1 x 1)
// and, when asked, programmatic stream serialization. Not copyable: cfg
// points at attrs.
struct ExLaunch {
  LaunchAttribute attrs[3]{};
  LaunchConfig cfg{};
  ExLaunch(int cluster, bool programmatic, unsigned grid_x, unsigned grid_y, unsigned block_x, unsigned block_y,
           size_t smem, CUstream stream, bool cooperative = false) {
    unsigned n = 0;
    if (cooperative) {
      attrs[n].id = kLaunchAttrCooperative;
      attrs[n++].value.cooperative = 1;
    }
    if (cluster > 1) {
      attrs[n].id = kLaunchAttrClusterDimension;
      attrs[n++].value.cluster_dim = {static_cast<unsigned>(cluster), 1, 1};
    }
    if (programmatic) {
      attrs[n].id = kLaunchAttrProgrammaticStreamSerialization;
      attrs[n++].value.programmatic_serialization = 1;
    }
    cfg = {grid_x, grid_y, 1, block_x, block_y, 1, static_cast<unsigned>(smem), stream, attrs, n};
  }
  ExLaunch(const ExLaunch&) = delete;
  ExLaunch& operator=(const ExLaunch&) = delete;
};

}  // namespace

const DeviceInfo& device_info(int device) { return slot(device).info; }

CUstream current_stream(int device) {
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const c10::Stream s = impl->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  return static_cast<CUstream>(s.native_handle());
}

bool stream_is_capturing(int device, CUstream stream) {
  make_current(slot(device).ctx);
  int capture = kStreamCaptureStatusNone;
  check_cu(driver().cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  return capture != kStreamCaptureStatusNone;
}

std::shared_ptr<const CompiledKernel> compiled_image(const KernelKey& key) {
  bool compiled = false;
  return compiled_image(key, &compiled);
}

const LoadedKernel& get_kernel(const KernelKey& key, int device, CUstream stream, size_t dyn_smem) {
  DeviceSlot& s = slot(device);
  {
    std::shared_lock<std::shared_mutex> lock(s.mutex);
    auto it = s.kernels.find(key);
    if (it != s.kernels.end()) {
      g_stats.memory_hits.fetch_add(1, std::memory_order_relaxed);
      return it->second;
    }
  }
  g_stats.memory_misses++;
  const DriverApi& d = driver();
  TORCH_CHECK(!stream_is_capturing(device, stream), "rtcnorm: kernel ", key.describe(),
              " is not loaded on cuda:", device,
              " and the current stream is being captured into a CUDA graph; compiling or loading a kernel during "
              "capture is not allowed. Warm up first: run the same op with the same shapes, dtypes and mode once "
              "before capture (rtcnorm.jit.precompile only fills the disk cache).");
  TORCH_CHECK(key.arch == s.info.arch, "rtcnorm: internal error: key for sm_", key.arch, " on a device of sm_",
              s.info.arch);
  auto image = compiled_image(key);

  std::unique_lock<std::shared_mutex> lock(s.mutex);
  auto it = s.kernels.find(key);
  if (it != s.kernels.end()) return it->second;
  make_current(s.ctx);
  const auto t0 = Clock::now();
  CUmodule mod = nullptr;
  check_cu(d.cuModuleLoadData(&mod, image->image.data()), "cuModuleLoadData");
  LoadedKernel k;
  k.ctx = s.ctx;
  check_cu(d.cuModuleGetFunction(&k.fn, mod, image->lowered_name.c_str()), "cuModuleGetFunction");
  k.threads = key.threads();
  k.smem = dyn_smem;
  // Static and dynamic shared memory share one budget: past the default 48 KB
  // in total the kernel must opt in (a 48 KB row cache plus the reduction
  // scratch does).
  int static_smem = 0;
  check_cu(d.cuFuncGetAttribute(&static_smem, kFuncAttrSharedSizeBytes, k.fn), "cuFuncGetAttribute");
  const size_t total_smem = dyn_smem + static_cast<size_t>(static_smem);
  TORCH_CHECK(total_smem <= static_cast<size_t>(s.info.max_smem_optin), "rtcnorm: kernel ", key.describe(), " needs ",
              total_smem, " bytes of shared memory; the device allows ", s.info.max_smem_optin);
  if (total_smem > 48 * 1024)
    check_cu(d.cuFuncSetAttribute(k.fn, kFuncAttrMaxDynamicSharedSizeBytes, static_cast<int>(dyn_smem)),
             "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  check_cu(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&k.blocks_per_sm, k.fn, k.threads, dyn_smem),
           "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  check_cu(d.cuFuncGetAttribute(&k.registers, kFuncAttrNumRegs, k.fn), "cuFuncGetAttribute");
  TORCH_CHECK(k.blocks_per_sm > 0, "rtcnorm: kernel ", key.describe(), " cannot run: no CTA of ", k.threads,
              " threads fits on an SM");
  k.cluster = key.cluster;
  k.arch = key.arch;
  if (k.cluster > 1) {
    TORCH_CHECK(d.cuLaunchKernelEx != nullptr && d.cuOccupancyMaxActiveClusters != nullptr, "rtcnorm: kernel ",
                key.describe(), " needs thread-block clusters, which this CUDA driver (", driver_version_string(),
                ") does not offer; a CUDA 12 or newer driver does");
    // Clusters past the portable size (16 on sm_90) must be opted into.
    if (k.cluster > kMaxPortableCluster)
      check_cu(d.cuFuncSetAttribute(k.fn, kFuncAttrNonPortableClusterSizeAllowed, 1),
               "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
    const ExLaunch one(k.cluster, false, k.cluster, 1, k.threads, 1, dyn_smem, stream);
    check_cu(d.cuOccupancyMaxActiveClusters(&k.max_clusters, k.fn, &one.cfg), "cuOccupancyMaxActiveClusters");
    TORCH_CHECK(k.max_clusters > 0, "rtcnorm: kernel ", key.describe(), " cannot run: no cluster of ", k.cluster,
                " CTAs fits on the device");
  }
  g_stats.module_loads++;
  add_ms(g_stats.module_load_us, ms_since(t0));
  return s.kernels.emplace(key, k).first->second;
}

void launch(const LoadedKernel& k, unsigned grid_x, unsigned grid_y, unsigned block_x, unsigned block_y,
            CUstream stream, void* params, bool programmatic, bool cooperative) {
  void* args[] = {params};
  make_current(k.ctx);
  const DriverApi& d = driver();
  programmatic = programmatic && programmatic_arch(k.arch) && d.cuLaunchKernelEx != nullptr;
  TORCH_CHECK(!cooperative || d.cuLaunchKernelEx != nullptr,
              "rtcnorm: a cooperative launch needs cuLaunchKernelEx, "
              "which this CUDA driver (",
              driver_version_string(), ") does not offer");
  if (k.cluster > 1 || programmatic || cooperative) {
    const ExLaunch ex(k.cluster, programmatic, grid_x, grid_y, block_x, block_y, k.smem, stream, cooperative);
    check_cu(d.cuLaunchKernelEx(&ex.cfg, k.fn, args, nullptr), "cuLaunchKernelEx");
    return;
  }
  check_cu(d.cuLaunchKernel(k.fn, grid_x, grid_y, 1, block_x, block_y, 1, static_cast<unsigned>(k.smem), stream, args,
                            nullptr),
           "cuLaunchKernel");
}

JitStats stats() {
  JitStats s;
  s.memory_hits = g_stats.memory_hits.load();
  s.memory_misses = g_stats.memory_misses.load();
  s.image_hits = g_stats.image_hits.load();
  s.disk_hits = g_stats.disk_hits.load();
  s.disk_misses = g_stats.disk_misses.load();
  s.disk_corrupt = g_stats.disk_corrupt.load();
  s.disk_writes = g_stats.disk_writes.load();
  s.compiles = g_stats.compiles.load();
  s.module_loads = g_stats.module_loads.load();
  s.compile_ms = g_stats.compile_us.load() / 1000.0;
  s.disk_load_ms = g_stats.disk_load_us.load() / 1000.0;
  s.module_load_ms = g_stats.module_load_us.load() / 1000.0;
  return s;
}

void reset_stats() {
  for (auto* c : {&g_stats.memory_hits, &g_stats.memory_misses, &g_stats.image_hits, &g_stats.disk_hits,
                  &g_stats.disk_misses, &g_stats.disk_corrupt, &g_stats.disk_writes, &g_stats.compiles,
                  &g_stats.module_loads, &g_stats.compile_us, &g_stats.disk_load_us, &g_stats.module_load_us})
    c->store(0);
}

int clear_cache() {
  {
    std::lock_guard<std::mutex> lock(g_images_mutex);
    g_images.clear();
  }
  return disk_cache_clear();
}

}  // namespace rtcnorm::jit
