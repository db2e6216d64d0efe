#include "jit/disk_cache.h"

#include <c10/util/Exception.h>
#include <c10/util/hash.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "jit/embedded_sources.h"

#ifndef RTCNORM_VERSION
#define RTCNORM_VERSION "0.0.0"
#endif

namespace rtcnorm::jit {
namespace {

constexpr char kMagic[8] = {'R', 'T', 'C', 'N', 'O', 'R', 'M', '1'};
std::atomic<bool> g_warned{false};
std::atomic<bool> g_broken{false};  // set after an I/O failure: memory only from then on

void warn_once(const std::string& what) {
  if (!g_warned.exchange(true))
    TORCH_WARN("rtcnorm: the kernel disk cache is unavailable (", what,
               "); compiled kernels are kept in memory only for this process.");
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Creates each missing component of `path` with mode 0700, then checks that
// the leaf is a folder owned by us and not writable by group or others.
bool ensure_private_dir(const std::string& path, std::string* why) {
  std::string partial;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    partial += "/" + part;
    if (mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) {
      *why = "cannot create " + partial + ": " + std::strerror(errno);
      return false;
    }
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *why = path + " is not a folder";
    return false;
  }
  if (st.st_uid != geteuid()) {
    *why = path + " is owned by another user";
    return false;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    *why = path + " is writable by group or others";
    return false;
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    *why = path + " is not writable";
    return false;
  }
  return true;
}

std::string arch_dir(int arch) { return disk_cache_root() + "/sm_" + std::to_string(arch); }

std::string entry_path(const KernelKey& key, const std::string& key_text) {
  return arch_dir(key.arch) + "/" + c10::sha1(key_text).str() + ".bin";
}

// Returns the arch folder when usable; warns once and returns "" otherwise.
std::string usable_dir(const KernelKey& key) {
  if (!disk_cache_enabled()) return "";
  const std::string dir = arch_dir(key.arch);
  std::string why;
  if (!ensure_private_dir(dir, &why)) {
    warn_once(why);
    return "";
  }
  return dir;
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

std::string disk_cache_root() {
  std::string root = env_or_empty("RTCNORM_CACHE_DIR");
  if (root.empty()) {
    const std::string xdg = env_or_empty("XDG_CACHE_HOME");
    const std::string home = env_or_empty("HOME");
    root = !xdg.empty() ? xdg + "/rtcnorm"
                        : (!home.empty() ? home + "/.cache/rtcnorm" : "/tmp/rtcnorm-" + std::to_string(geteuid()));
  }
  return root + "/" + RTCNORM_VERSION;
}

bool disk_cache_enabled() { return env_or_empty("RTCNORM_DISABLE_DISK_CACHE") != "1" && !g_broken.load(); }

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

DiskLookup disk_cache_load(const KernelKey& key, const std::string& key_text, CompiledKernel* out) {
  if (usable_dir(key).empty()) return DiskLookup::kDisabled;
  const std::string path = entry_path(key, key_text);
  std::ifstream f(path, std::ios::binary);
  if (!f) return DiskLookup::kMiss;
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
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

bool disk_cache_store(const KernelKey& key, const std::string& key_text, const CompiledKernel& k) {
  const std::string dir = usable_dir(key);
  if (dir.empty()) return false;
  std::string body = serialize_body(key_text, k);
  body += c10::sha1(body).str();
  const std::string final_path = entry_path(key, key_text);
  std::random_device rd;
  const std::string tmp = final_path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    warn_once("cannot write " + tmp + ": " + std::strerror(errno));
    g_broken = true;
    return false;
  }
  size_t done = 0;
  while (done < body.size()) {
    const ssize_t n = write(fd, body.data() + done, body.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == body.size() && fsync(fd) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), final_path.c_str()) != 0) {
    warn_once("cannot write " + final_path + ": " + std::strerror(errno));
    unlink(tmp.c_str());
    g_broken = true;
    return false;
  }
  return true;
}

DiskEntryLock::DiskEntryLock(const KernelKey& key, const std::string& key_text) {
  if (usable_dir(key).empty()) return;
  const std::string path = entry_path(key, key_text) + ".lock";
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ >= 0 && flock(fd_, LOCK_EX) != 0) {
    close(fd_);
    fd_ = -1;
  }
}

DiskEntryLock::~DiskEntryLock() {
  if (fd_ >= 0) {
    flock(fd_, LOCK_UN);
    close(fd_);
  }
}

int disk_cache_clear() {
  const std::string root = disk_cache_root();
  int removed = 0;
  DIR* top = opendir(root.c_str());
  if (top == nullptr) return 0;
  while (dirent* a = readdir(top)) {
    const std::string sub = a->d_name;
    if (sub.rfind("sm_", 0) != 0) continue;
    const std::string dir = root + "/" + sub;
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        if (unlink((dir + "/" + name).c_str()) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0)
          ++removed;
      }
      closedir(d);
    }
  }
  closedir(top);
  return removed;
}

}  // namespace rtcnorm::jit
