#include "jit/disk_cache.h"

#include <c10/util/Exception.h>
#include <c10/util/hash.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <sstream>

#include "jit/embedded_sources.h"
#include "jit/safe_dir.h"

#ifndef RTCNORM_VERSION
#define RTCNORM_VERSION "0.0.0"
#endif

namespace rtcnorm::jit {
namespace {

constexpr char kMagic[8] = {'R', 'T', 'C', 'N', 'O', 'R', 'M', '1'};
constexpr time_t kStaleTempSeconds = 24 * 3600;  // a temp file this old has no writer left
std::atomic<bool> g_warned_unavailable{false}, g_warned_write{false}, g_warned_env{false};

void warn_unavailable(const std::string& why) {
  if (!g_warned_unavailable.exchange(true))
    TORCH_WARN("rtcnorm: the kernel disk cache is unavailable (", why,
               "); compiled kernels are kept in memory only for this process. Every folder from the cache root "
               "down must be a real folder (not a symlink) owned by you and not writable by group or others; set "
               "RTCNORM_CACHE_DIR to such a folder (docs/cache.md).");
}

void warn_write(const std::string& why) {
  if (!g_warned_write.exchange(true))
    TORCH_WARN("rtcnorm: a kernel could not be stored in the disk cache (", why,
               "); it is kept in memory for this process and later kernels are still stored. Further write "
               "failures are not reported.");
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The cache root the environment names, absolute; the trust checks start here.
std::string cache_base() {
  const std::string dir = env_or_empty("RTCNORM_CACHE_DIR");
  if (!dir.empty()) return absolute_path(dir);
  const std::string xdg = env_or_empty("XDG_CACHE_HOME");
  if (!xdg.empty()) return absolute_path(xdg + "/rtcnorm");
  const std::string home = env_or_empty("HOME");
  if (!home.empty()) return absolute_path(home + "/.cache/rtcnorm");
  return "/tmp/rtcnorm-" + std::to_string(geteuid());
}

std::string arch_name(int arch) { return "sm_" + std::to_string(arch); }
std::string entry_name(const std::string& key_text) { return c10::sha1(key_text).str() + ".bin"; }

bool is_hex40(const std::string& name) {
  return name.size() >= 40 && std::all_of(name.begin(), name.begin() + 40, [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}
bool is_entry_name(const std::string& n) { return n.size() == 44 && is_hex40(n) && n.compare(40, 4, ".bin") == 0; }
bool is_temp_name(const std::string& n) { return is_hex40(n) && n.compare(40, 9, ".bin.tmp.") == 0; }

// The verified sm_XX folder; warns once when the tree is unsafe or unusable.
PrivateDir arch_dir(int arch, bool create) {
  PrivateDir d = open_private_dir(cache_base(), {RTCNORM_VERSION, arch_name(arch)}, create);
  if (d.status == DirStatus::kUnsafe || d.status == DirStatus::kError) warn_unavailable(d.why);
  return d;
}

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }

// Everything but the trailing checksum.
std::string serialize_body(const std::string& key_text, const CompiledKernel& k) {
  std::string s(kMagic, sizeof kMagic);
  for (const std::string* f : {&key_text, &k.lowered_name, &k.target}) {
    put_u32(s, static_cast<uint32_t>(f->size()));
    s += *f;
  }
  s.push_back(k.is_cubin ? 1 : 0);
  put_u64(s, k.image.size());
  s += k.image;
  return s;
}

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool bytes(size_t n, std::string* out) {
    if (n > s_.size() - pos_) return false;
    if (out) out->assign(s_, pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool pod(T* v) {
    if (sizeof(T) > s_.size() - pos_) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool string(std::string* out) {
    uint32_t n = 0;
    return pod(&n) && bytes(n, out);
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

std::string disk_cache_root() { return cache_base() + "/" + RTCNORM_VERSION; }

bool disk_cache_enabled() {
  const std::string raw = env_or_empty("RTCNORM_DISABLE_DISK_CACHE");
  std::string v;
  for (char c : raw)
    if (!std::isspace(static_cast<unsigned char>(c))) v.push_back(static_cast<char>(std::tolower(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return false;
  if (v.empty() || v == "0" || v == "false" || v == "no" || v == "off") return true;
  if (!g_warned_env.exchange(true))
    TORCH_WARN("rtcnorm: RTCNORM_DISABLE_DISK_CACHE='", raw,
               "' is not understood; use 1, true, yes or on to turn the disk cache off, or 0, false, no, off or "
               "nothing to keep it on. The disk cache stays on.");
  return true;
}

std::string disk_key_text(const KernelKey& key) {
  std::string target;
  bool is_cubin = true;
  const std::vector<std::string> opts = compile_options(key.arch, &target, &is_cubin);
  const NvrtcInfo& info = nvrtc_info();
  std::ostringstream os;
  os << "rtcnorm " << RTCNORM_VERSION << "\nsources " << kSourcesFingerprint << "\nnvrtc " << info.major << "."
     << info.minor << "\noptions";
  for (const auto& o : opts) os << " " << o;
  os << "\nheader " << key.family->header << "\nkernel " << key.name_expression() << "\n";
  return os.str();
}

DiskLookup disk_cache_load(int arch, const std::string& key_text, CompiledKernel* out) {
  if (!disk_cache_enabled()) return DiskLookup::kDisabled;
  const PrivateDir dir = arch_dir(arch, /*create=*/false);
  if (dir.status == DirStatus::kMissing) return DiskLookup::kMiss;
  if (dir.status != DirStatus::kOk) return DiskLookup::kDisabled;
  std::string data, why;
  const FileStatus fs = read_private_file(dir.fd.get(), entry_name(key_text), &data, &why);
  if (fs == FileStatus::kMissing) return DiskLookup::kMiss;
  if (fs == FileStatus::kRejected) return DiskLookup::kCorrupt;
  Reader r(data);
  std::string magic, stored_key, checksum;
  uint8_t is_cubin = 0;
  uint64_t image_size = 0;
  CompiledKernel k;
  const bool parsed = r.bytes(sizeof kMagic, &magic) && magic == std::string(kMagic, sizeof kMagic) &&
                      r.string(&stored_key) && r.string(&k.lowered_name) && r.string(&k.target) && r.pod(&is_cubin) &&
                      r.pod(&image_size) && r.bytes(image_size, &k.image);
  const size_t body_size = r.pos();
  if (!parsed || !r.bytes(40, &checksum) || body_size + 40 != data.size()) return DiskLookup::kCorrupt;
  if (stored_key != key_text) return DiskLookup::kCorrupt;
  if (c10::sha1(data.substr(0, body_size)).str() != checksum) return DiskLookup::kCorrupt;
  k.is_cubin = is_cubin != 0;
  *out = std::move(k);
  return DiskLookup::kHit;
}

bool disk_cache_store(int arch, const std::string& key_text, const CompiledKernel& k) {
  if (!disk_cache_enabled()) return false;
  const PrivateDir dir = arch_dir(arch, /*create=*/true);
  if (dir.status != DirStatus::kOk) return false;
  std::string body = serialize_body(key_text, k);
  body += c10::sha1(body).str();
  std::string why;
  if (write_file_atomic(dir.fd.get(), entry_name(key_text), body, &why)) return true;
  warn_write(why + " in " + dir.path);
  return false;
}

DiskEntryLock::DiskEntryLock(int arch, const std::string& key_text) {
  if (!disk_cache_enabled()) return;
  const PrivateDir dir = arch_dir(arch, /*create=*/true);
  if (dir.status != DirStatus::kOk) return;
  const std::string name = entry_name(key_text) + ".lock";
  Fd f(openat(dir.fd.get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
  struct stat st {};
  if (!f.ok() || fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode) || flock(f.get(), LOCK_EX) != 0) return;
  fd_ = dup(f.get());
  if (fd_ < 0) flock(f.get(), LOCK_UN);
}

DiskEntryLock::~DiskEntryLock() {
  if (fd_ >= 0) {
    flock(fd_, LOCK_UN);
    close(fd_);
  }
}

int disk_cache_clear() {
  const PrivateDir version = open_private_dir(cache_base(), {RTCNORM_VERSION}, /*create=*/false);
  if (version.status == DirStatus::kMissing) return 0;
  if (version.status != DirStatus::kOk) {
    warn_unavailable(version.why);
    return 0;
  }
  int removed = 0;
  const time_t now = time(nullptr);
  for (const std::string& sub : list_names(version.fd.get())) {
    if (sub.rfind("sm_", 0) != 0) continue;
    const PrivateDir dir = open_private_subdir(version, sub, /*create=*/false);
    if (dir.status != DirStatus::kOk) {
      if (dir.status != DirStatus::kMissing) warn_unavailable(dir.why);
      continue;
    }
    // unlinkat never follows a symlink, and names hold no '/': nothing outside dir is touched.
    for (const std::string& name : list_names(dir.fd.get())) {
      const bool entry = is_entry_name(name);
      if (!entry && !is_temp_name(name)) continue;
      struct stat st {};
      if (fstatat(dir.fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
      if (!entry && now - st.st_mtime < kStaleTempSeconds) continue;
      if (unlinkat(dir.fd.get(), name.c_str(), 0) == 0 && entry) ++removed;
    }
  }
  return removed;
}

}  // namespace rtcnorm::jit
