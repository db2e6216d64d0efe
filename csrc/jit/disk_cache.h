// The on-disk kernel cache.
//
// Location: $RTCNORM_CACHE_DIR, else $XDG_CACHE_HOME/rtcnorm, else
// ~/.cache/rtcnorm; entries live in <root>/<version>/sm_XX/.
//
// Invariants:
// - A cache file is code that will run on the GPU. Every folder rtcnorm
//   creates is mode 0700, and a folder not owned by the current user, or
//   writable by group or others, is never read or written.
// - An entry is written to a unique temp file in the same folder, then
//   renamed over its final name: readers see a whole old file or a whole new
//   one, never a partial one. Racing writers each leave one valid file.
// - Every entry carries its full key text and a SHA-1 of its contents; both
//   are checked on read. A corrupt, truncated or foreign entry is reported as
//   such, recompiled and replaced; it is never loaded.
// - Any I/O failure degrades to the memory cache with one warning per
//   process; it never fails the op.
// - RTCNORM_DISABLE_DISK_CACHE=1 turns the disk cache off.
#pragma once

#include <string>

#include "jit/nvrtc.h"

namespace rtcnorm::jit {

enum class DiskLookup { kHit, kMiss, kCorrupt, kDisabled };

// <root>/<version>, resolved from the environment now (not created).
std::string disk_cache_root();
bool disk_cache_enabled();

// Full text identifying an entry: version, source fingerprint, NVRTC version,
// options, target and instantiation.
std::string disk_key_text(const KernelKey& key);

DiskLookup disk_cache_load(const KernelKey& key, const std::string& key_text, CompiledKernel* out);
// Returns false (after warning once) when the entry could not be written.
bool disk_cache_store(const KernelKey& key, const std::string& key_text, const CompiledKernel& k);

// Holds an advisory flock on an entry's lock file so that processes compiling
// the same kernel wait for each other and re-check instead of compiling twice.
// Best effort: with no usable folder it holds nothing.
class DiskEntryLock {
 public:
  DiskEntryLock(const KernelKey& key, const std::string& key_text);
  ~DiskEntryLock();
  DiskEntryLock(const DiskEntryLock&) = delete;
  DiskEntryLock& operator=(const DiskEntryLock&) = delete;

 private:
  int fd_ = -1;
};

// Removes every entry under disk_cache_root(); returns the number removed.
int disk_cache_clear();

}  // namespace rtcnorm::jit
