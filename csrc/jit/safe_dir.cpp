#include "jit/safe_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <sstream>

namespace rtcnorm::jit {

Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

namespace {

std::string errno_text(int e) { return std::strerror(e); }

std::string octal_mode(mode_t m) {
  std::ostringstream os;
  os << "0" << std::oct << (m & 07777);
  return os.str();
}

// The handle's folder is ours alone: a folder, owned by the effective user,
// not writable by group or others.
bool verify_private(int fd, PrivateDir* r) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    r->status = DirStatus::kError;
    r->why = "cannot stat " + r->path + ": " + errno_text(errno);
    return false;
  }
  r->status = DirStatus::kUnsafe;
  if (!S_ISDIR(st.st_mode)) {
    r->why = r->path + " is not a folder";
    return false;
  }
  if (st.st_uid != geteuid()) {
    r->why = r->path + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
             std::to_string(geteuid()) + ")";
    return false;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    r->why = r->path + " is writable by group or others (mode " + octal_mode(st.st_mode) + ")";
    return false;
  }
  r->status = DirStatus::kOk;
  return true;
}

// Opens `name` below the handle `parent` into r->fd, without following a
// symlink, creating it (0700) first when asked; then verifies it.
void open_level(int parent, const std::string& name, bool create, PrivateDir* r) {
  constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int fd = openat(parent, name.c_str(), kFlags);
  if (fd < 0 && errno == ENOENT && create) {
    if (mkdirat(parent, name.c_str(), 0700) != 0 && errno != EEXIST) {
      r->status = DirStatus::kError;
      r->why = "cannot create " + r->path + ": " + errno_text(errno);
      return;
    }
    fd = openat(parent, name.c_str(), kFlags);
  }
  if (fd < 0) {
    const int e = errno;
    r->status = e == ENOENT && !create ? DirStatus::kMissing
                                       : (e == ELOOP || e == ENOTDIR ? DirStatus::kUnsafe : DirStatus::kError);
    struct stat st {};
    if (e == ELOOP ||
        (e == ENOTDIR && fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)))
      r->why = r->path + " is a symbolic link";
    else if (e == ENOTDIR)
      r->why = r->path + " is not a folder";
    else
      r->why = "cannot open " + r->path + ": " + errno_text(e);
    return;
  }
  r->fd = Fd(fd);
  if (!verify_private(fd, r)) r->fd = Fd();
}

// Creates each missing folder of the absolute path `dir` (mode 0700);
// failures show when the folder is opened.
void make_parents(const std::string& dir) {
  for (size_t at = dir.find('/', 1); at != std::string::npos; at = dir.find('/', at + 1))
    mkdir(dir.substr(0, at).c_str(), 0700);
  mkdir(dir.c_str(), 0700);
}

}  // namespace

std::string absolute_path(const std::string& path) {
  std::string base;
  if (path.empty() || path[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof cwd) == nullptr) return "";
    base = cwd;
  }
  std::string out;
  std::stringstream ss(base + "/" + path);
  std::string part;
  while (std::getline(ss, part, '/'))
    if (!part.empty() && part != ".") out += "/" + part;
  return out.empty() ? "/" : out;
}

PrivateDir open_private_subdir(const PrivateDir& parent, const std::string& name, bool create) {
  PrivateDir r;
  r.path = parent.path + "/" + name;
  open_level(parent.fd.get(), name, create, &r);
  return r;
}

PrivateDir open_private_dir(const std::string& root, const std::vector<std::string>& levels, bool create) {
  PrivateDir r;
  const std::string abs = absolute_path(root);
  if (abs.empty()) {
    r.why = "cannot resolve " + root + ": the working directory is not available";
    return r;
  }
  const size_t cut = abs.find_last_of('/');
  const std::string above = cut == 0 ? "/" : abs.substr(0, cut);
  const std::string leaf = abs.size() == 1 ? "." : abs.substr(cut + 1);
  // Above the root: the user's own path, symlinks allowed, nothing verified.
  Fd top(open(above.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!top.ok() && errno == ENOENT && create) {
    make_parents(above);
    top = Fd(open(above.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  }
  if (!top.ok()) {
    r.status = errno == ENOENT && !create ? DirStatus::kMissing : DirStatus::kError;
    r.why = "cannot open " + above + ": " + errno_text(errno);
    return r;
  }
  r.path = abs;
  open_level(top.get(), leaf, create, &r);
  for (const std::string& level : levels) {
    if (r.status != DirStatus::kOk) break;
    r = open_private_subdir(r, level, create);
  }
  return r;
}

FileStatus read_private_file(int dir, const std::string& name, std::string* out, std::string* why) {
  Fd f(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!f.ok()) {
    const int e = errno;
    if (e == ENOENT) return FileStatus::kMissing;
    *why = e == ELOOP ? "a symbolic link" : errno_text(e);
    return FileStatus::kRejected;
  }
  struct stat st {};
  if (fstat(f.get(), &st) != 0) {
    *why = errno_text(errno);
    return FileStatus::kRejected;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = "not a regular file";
    return FileStatus::kRejected;
  }
  if (st.st_uid != geteuid()) {
    *why = "owned by another user";
    return FileStatus::kRejected;
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > kMaxEntryBytes) {
    *why = "larger than the " + std::to_string(kMaxEntryBytes >> 20) + " MiB an entry may have";
    return FileStatus::kRejected;
  }
  out->assign(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out->size()) {
    const ssize_t n = read(f.get(), out->data() + got, out->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != out->size()) {
    *why = "shorter than its size";
    return FileStatus::kRejected;
  }
  return FileStatus::kOk;
}

bool write_file_atomic(int dir, const std::string& name, const std::string& data, std::string* why) {
  std::random_device rd;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::string tmp = name + ".tmp." + std::to_string(getpid()) + "." + std::to_string(rd());
    Fd f(openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!f.ok()) {
      *why = "cannot create " + tmp + ": " + errno_text(errno);
      return false;
    }
    int e = 0;
    for (size_t done = 0; done < data.size() && e == 0;) {
      const ssize_t n = write(f.get(), data.data() + done, data.size() - done);
      if (n > 0)
        done += static_cast<size_t>(n);
      else if (n == 0 || errno != EINTR)
        e = n == 0 ? EIO : errno;
    }
    if (e == 0 && fsync(f.get()) != 0) e = errno;
    if (e != 0) {
      *why = "cannot write " + tmp + ": " + errno_text(e);
      unlinkat(dir, tmp.c_str(), 0);
      return false;
    }
    f = Fd();
    if (renameat(dir, tmp.c_str(), dir, name.c_str()) == 0) return true;
    e = errno;
    unlinkat(dir, tmp.c_str(), 0);
    *why = "cannot rename " + tmp + " to " + name + ": " + errno_text(e);
    if (e != ENOENT) return false;  // ENOENT: a clear removed the temp file; write it again
  }
  return false;
}

std::vector<std::string> list_names(int dir) {
  std::vector<std::string> names;
  const int copy = fcntl(dir, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return names;
  DIR* d = fdopendir(copy);
  if (d == nullptr) {
    close(copy);
    return names;
  }
  rewinddir(d);  // the copy shares its offset with `dir`
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  return names;
}

}  // namespace rtcnorm::jit
