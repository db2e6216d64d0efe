// The on-disk kernel cache (docs/cache.md).
//
// Location: $RTCNORM_CACHE_DIR (a relative path is taken from the working
// directory), else $XDG_CACHE_HOME/rtcnorm, else ~/.cache/rtcnorm, else
// /tmp/rtcnorm-<uid>; entries live in <root>/<version>/sm_XX/<sha1>.bin.
//
// Invariants:
// - A cache file is code that will run on the GPU. The root, the version
//   folder and the sm_XX folder are opened and verified on their handles
//   (jit/safe_dir.h): a level that is a symlink, another user's, or writable
//   by group or others makes the disk cache unavailable (one warning per
//   process), and nothing inside or below it is read, written or deleted.
// - Entries are read through the verified handle: regular files of this
//   user of at most kMaxEntryBytes. Anything else is a corrupt entry.
// - An entry is written to a unique temp file in the same folder, then
//   renamed over its final name: readers see a whole old file or a whole new
//   one, never a partial one. Racing writers each leave one valid file.
// - Every entry carries its full key text and a SHA-1 of its contents; both
//   are checked on read. A corrupt, truncated or foreign entry is reported as
//   such, recompiled and replaced; it is never loaded. The checksum detects
//   damage; the folder checks give the trust.
// - Any I/O failure degrades that one kernel to the memory cache, with one
//   warning per process; it never fails the op and never turns the disk cache
//   off for later kernels. A read-only cache is still read.
// - RTCNORM_DISABLE_DISK_CACHE=1 (or true, yes, on) turns the disk cache off.
#pragma once

#include <string>

#include "jit/nvrtc.h"

namespace rtcnorm::jit {

enum class DiskLookup { kHit, kMiss, kCorrupt, kDisabled };

// <root>/<version>, resolved from the environment now (not created).
std::string disk_cache_root();
// False when RTCNORM_DISABLE_DISK_CACHE asks so; warns once about a value
// that is neither true-like nor false-like (and keeps the cache on).
bool disk_cache_enabled();

// Full text identifying an entry: version, source fingerprint, NVRTC version,
// options, target and instantiation.
std::string disk_key_text(const KernelKey& key);

// The entry of `key_text` in the sm_<arch> folder.
DiskLookup disk_cache_load(int arch, const std::string& key_text, CompiledKernel* out);
// Returns false (after warning once) when the entry could not be written.
bool disk_cache_store(int arch, const std::string& key_text, const CompiledKernel& k);

// Holds an advisory flock on an entry's lock file so that processes compiling
// the same kernel wait for each other and re-check instead of compiling twice.
// Best effort: with no usable folder it holds nothing.
class DiskEntryLock {
 public:
  DiskEntryLock(int arch, const std::string& key_text);
  ~DiskEntryLock();
  DiskEntryLock(const DiskEntryLock&) = delete;
  DiskEntryLock& operator=(const DiskEntryLock&) = delete;

 private:
  int fd_ = -1;
};

// Removes the entries (regular files named <sha1>.bin) of every verified
// sm_XX folder under disk_cache_root(), and temp files a crashed writer left
// more than a day ago; returns the number of entries removed. Lock files and
// fresh temp files (another process may be writing them) stay.
int disk_cache_clear();

}  // namespace rtcnorm::jit
