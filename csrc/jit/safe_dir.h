// Private folders and files of the disk cache, checked on open handles.
//
// Trust model: a cache entry is code that will run on the GPU, so an entry is
// read only from a folder that no other user can change. From the cache root
// down, every level is opened with O_NOFOLLOW relative to the handle of the
// level above and checked on that handle (fstat): a folder, owned by the
// effective user, not writable by group or others. No path is checked and
// then used again, so swapping a level for a symlink between a check and a
// use changes nothing. The folders above the root are the user's own choice
// of path: they are opened following symlinks and not checked.
//
// Entries are opened relative to the verified handle with O_NOFOLLOW and
// O_NONBLOCK (a FIFO cannot block), and read only when they are regular files
// owned by the effective user of at most a bounded size.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace rtcnorm::jit {

// An owned file descriptor; -1 when empty.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// `path` made absolute against the current working directory, with empty and
// "." parts dropped ("tmp/x" from /work is "/work/tmp/x"). ".." is kept: it
// is resolved by the kernel when the folders are opened.
std::string absolute_path(const std::string& path);

enum class DirStatus {
  kOk,
  kMissing,  // a level does not exist (and was not to be created)
  kUnsafe,   // a level is a symlink, not a folder, another user's, or group/world-writable
  kError,    // an I/O error (no permission to create a level, ...)
};

struct PrivateDir {
  Fd fd;  // the deepest level, opened O_RDONLY|O_DIRECTORY
  DirStatus status = DirStatus::kError;
  std::string path;  // the deepest level's absolute path, for messages only
  std::string why;   // for anything but kOk: which level and what is wrong
};

// Opens `root` (absolute_path applied) and then `levels` below it, one at a
// time, each verified as described above. With `create`, a missing level is
// made with mode 0700 (mkdirat on the parent's handle) and then opened and
// verified like any other; missing folders above the root are made 0700 too.
PrivateDir open_private_dir(const std::string& root, const std::vector<std::string>& levels, bool create);

// The folder `name` inside the verified folder `parent`, verified the same way.
PrivateDir open_private_subdir(const PrivateDir& parent, const std::string& name, bool create);

// The largest entry read: over a thousand times the largest cubin seen
// (under 50 KB, sm_100 kernels of the widest rows).
constexpr size_t kMaxEntryBytes = size_t(64) << 20;

enum class FileStatus { kOk, kMissing, kRejected };

// Reads `name` in folder `dir` whole into *out, when it is a regular file
// owned by the effective user of at most kMaxEntryBytes; otherwise
// kRejected with *why set (a symlink, a FIFO, a folder, a device, too large,
// another user's, or a read error), or kMissing.
FileStatus read_private_file(int dir, const std::string& name, std::string* out, std::string* why);

// Writes `data` to a new temp file `name`.tmp.<pid>.<random> in `dir` (mode
// 0600, O_EXCL|O_NOFOLLOW), fsyncs it and renames it over `name`, so readers
// see a whole old file or a whole new one. A rename that fails because the
// temp file vanished (another process's clear) is retried once with a fresh
// temp file. Returns false with *why set on failure; never leaves the temp.
bool write_file_atomic(int dir, const std::string& name, const std::string& data, std::string* why);

// Names of folder `dir` (but "." and ".."), read through a duplicate handle.
std::vector<std::string> list_names(int dir);

}  // namespace rtcnorm::jit
