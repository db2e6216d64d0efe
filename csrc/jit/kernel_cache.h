// The two-level kernel cache and the launch path.
//
//   get_kernel(key, device)   per-device map of loaded functions (hot path:
//                             a shared lock and a hash of a fixed-size key)
//     -> compiled_image(key)  per-process map of images by key, one build per
//                             key even under concurrent callers
//       -> disk cache         verified entries, flock'd against other processes
//         -> NVRTC            compile, then store to disk
//
// Invariants:
// - A function loaded for one device is only ever launched on that device:
//   the per-device maps are separate and the key carries the device's arch.
// - Nothing is compiled or loaded while the launching stream is capturing a
//   CUDA graph: that raises an error telling the user to warm up first.
// - Failures propagate to every waiter and leave no entry behind, so a later
//   call retries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "jit/cuda_driver.h"
#include "jit/kernel_key.h"
#include "jit/nvrtc.h"

namespace rtcnorm::jit {

struct DeviceInfo {
  int sm_count = 0;
  int arch = 0;  // major * 10 + minor
  int max_smem_optin = 0;
  std::string name;  // the driver's product name ("NVIDIA H200"): measured tuning is kept per name
};

// Queried once per device through the driver.
const DeviceInfo& device_info(int device);

struct LoadedKernel {
  CUfunction fn = nullptr;
  CUcontext ctx = nullptr;  // the device's primary context, made current before each launch
  int threads = 0;
  size_t smem = 0;        // dynamic shared memory every launch passes
  int blocks_per_sm = 0;  // occupancy at (threads, smem)
  int registers = 0;
  int cluster = 1;       // CTAs per cluster every launch uses (key.cluster)
  int arch = 0;          // key.arch: programmatic launches need sm_90+
  int max_clusters = 0;  // clusters of that shape resident on the whole device at once
};

// The loaded kernel for key on `device`, compiling or reading the disk cache
// on a miss. key.arch must be the device's arch. dyn_smem is fixed per key.
const LoadedKernel& get_kernel(const KernelKey& key, int device, CUstream stream, size_t dyn_smem);

// The compiled image for key (key.arch decides the target); no GPU needed.
// *compiled tells whether this call compiled it (rather than finding it in
// memory or on disk).
std::shared_ptr<const CompiledKernel> compiled_image(const KernelKey& key);
std::shared_ptr<const CompiledKernel> compiled_image(const KernelKey& key, bool* compiled);

// Launches `k` with a single by-value parameter block; a cluster kernel's
// grid_x must be a multiple of k.cluster. `programmatic` (honoured on sm_90+
// with a CUDA 12+ driver, a plain launch otherwise) lets k's CTAs be
// scheduled before the stream's previous kernel completes: k must then call
// grid_dependency_wait() (kernels/common/grid_dep.cuh) before touching
// memory that kernel uses. `cooperative` makes every CTA resident at once
// (the grid must fit the device at k's occupancy, else the launch fails
// rather than leaving CTAs that wait on each other unscheduled).
void launch(const LoadedKernel& k, unsigned grid_x, unsigned grid_y, unsigned block_x, unsigned block_y,
            CUstream stream, void* params, bool programmatic = false, bool cooperative = false);
// Whether launch() honours `programmatic` for a kernel of `arch` (sm_90+; the driver aside).
inline bool programmatic_arch(int arch) { return arch >= 90; }

// The current torch CUDA stream of `device`, as a driver handle.
CUstream current_stream(int device);

// Whether `stream` (of `device`) is capturing a CUDA graph.
bool stream_is_capturing(int device, CUstream stream);

struct JitStats {
  uint64_t memory_hits = 0;
  uint64_t memory_misses = 0;
  uint64_t image_hits = 0;  // compiled images found in this process (a repeated precompile, another device)
  uint64_t disk_hits = 0;
  uint64_t disk_misses = 0;
  uint64_t disk_corrupt = 0;
  uint64_t disk_writes = 0;
  uint64_t compiles = 0;
  double compile_ms = 0;
  double disk_load_ms = 0;
  uint64_t module_loads = 0;
  double module_load_ms = 0;
};

JitStats stats();
void reset_stats();

// Drops the in-process compiled images (loaded device functions stay: they
// may be in use by queued work) and the disk entries; returns disk entries removed.
int clear_cache();

// Compiles the distinct keys of `keys` (in first-seen order) on `threads`
// worker threads (0: hardware concurrency). Returns one line per distinct
// key: "<kernel> <target> <compiled|cached>".
// - on_done(done, total) runs on the calling thread after each kernel
//   finishes or fails. If it throws, no further kernel is started, the
//   workers are joined and its exception propagates.
// - Warnings raised on the workers are collected into *warnings (when given)
//   instead of going to the process's warning handler.
// - A kernel's failure is thrown after every kernel has run.
std::vector<std::string> precompile_keys(const std::vector<KernelKey>& keys, int threads,
                                         const std::function<void(size_t, size_t)>& on_done = {},
                                         std::vector<std::string>* warnings = nullptr);

}  // namespace rtcnorm::jit
