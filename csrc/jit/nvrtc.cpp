#include "jit/nvrtc.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "jit/cuda_driver.h"
#include "jit/embedded_sources.h"

namespace rtcnorm::jit {
namespace {

using nvrtcProgram = struct _nvrtcProgram*;
using nvrtcResult = int;

struct NvrtcApi {
  nvrtcResult (*nvrtcVersion)(int*, int*);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int*);
  nvrtcResult (*nvrtcGetSupportedArchs)(int*);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  nvrtcResult (*nvrtcAddNameExpression)(nvrtcProgram, const char*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetLoweredName)(nvrtcProgram, const char*, const char**);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char*);
  const char* (*nvrtcGetErrorString)(nvrtcResult);
};

struct LoadedNvrtc {
  NvrtcApi api{};
  NvrtcInfo info;
};

std::mutex g_dirs_mutex;
std::vector<std::string> g_search_dirs;

const char* const kLibNames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};

void* try_open(const std::string& path, std::vector<std::string>& tried) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* why = dlerror();
    tried.push_back(path + " (" + (why ? why : "not loadable") + ")");
  }
  return h;
}

void* open_in_dir(const std::string& dir, std::vector<std::string>& tried) {
  for (const char* name : kLibNames) {
    const std::string path = dir + "/" + name;
    if (void* h = try_open(path, tried)) return h;
  }
  return nullptr;
}

// The file a dlopen handle was loaded from ("libnvrtc.so.12" found by the
// system loader becomes its full path).
std::string loaded_path(void* lib, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name != '\0')
    return map->l_name;
  return fallback;
}

template <typename F>
void bind(void* lib, const std::string& path, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn != nullptr) return;
  dlclose(lib);
  TORCH_CHECK(false, "rtcnorm: the library loaded as NVRTC from ", path, " has no symbol ", name,
              "; it is not NVRTC or too old a version. Point RTCNORM_NVRTC_PATH at libnvrtc.so (CUDA 11.2+).");
}

LoadedNvrtc load_nvrtc() {
  std::vector<std::string> tried;
  void* lib = nullptr;
  if (const char* forced = std::getenv("RTCNORM_NVRTC_PATH"); forced != nullptr && *forced != '\0') {
    const std::string p(forced);
    lib = try_open(p, tried);
    if (lib == nullptr) lib = open_in_dir(p, tried);
    TORCH_CHECK(lib != nullptr, "rtcnorm: RTCNORM_NVRTC_PATH=", p,
                " does not name a loadable NVRTC library or a folder holding one. Tried: ", c10::Join("; ", tried));
  } else {
    std::vector<std::string> dirs;
    {
      std::lock_guard<std::mutex> lock(g_dirs_mutex);
      dirs = g_search_dirs;
    }
    for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
      if (const char* v = std::getenv(env); v != nullptr && *v != '\0') dirs.push_back(std::string(v) + "/lib64");
    dirs.push_back("/usr/local/cuda/lib64");
    for (const auto& d : dirs) {
      if ((lib = open_in_dir(d, tried)) != nullptr) break;
    }
    for (const char* name : kLibNames) {
      if (lib != nullptr) break;
      lib = try_open(name, tried);
    }
    TORCH_CHECK(lib != nullptr,
                "rtcnorm: NVRTC (libnvrtc.so) was not found. Install torch's CUDA wheels (they ship it), a CUDA "
                "toolkit, or set RTCNORM_NVRTC_PATH. Tried: ",
                c10::Join("; ", tried));
  }

  const std::string path = loaded_path(lib, "libnvrtc");
  LoadedNvrtc n;
  auto& a = n.api;
  bind(lib, path, "nvrtcVersion", a.nvrtcVersion);
  bind(lib, path, "nvrtcGetNumSupportedArchs", a.nvrtcGetNumSupportedArchs);
  bind(lib, path, "nvrtcGetSupportedArchs", a.nvrtcGetSupportedArchs);
  bind(lib, path, "nvrtcCreateProgram", a.nvrtcCreateProgram);
  bind(lib, path, "nvrtcDestroyProgram", a.nvrtcDestroyProgram);
  bind(lib, path, "nvrtcAddNameExpression", a.nvrtcAddNameExpression);
  bind(lib, path, "nvrtcCompileProgram", a.nvrtcCompileProgram);
  bind(lib, path, "nvrtcGetLoweredName", a.nvrtcGetLoweredName);
  bind(lib, path, "nvrtcGetProgramLogSize", a.nvrtcGetProgramLogSize);
  bind(lib, path, "nvrtcGetProgramLog", a.nvrtcGetProgramLog);
  bind(lib, path, "nvrtcGetCUBINSize", a.nvrtcGetCUBINSize);
  bind(lib, path, "nvrtcGetCUBIN", a.nvrtcGetCUBIN);
  bind(lib, path, "nvrtcGetPTXSize", a.nvrtcGetPTXSize);
  bind(lib, path, "nvrtcGetPTX", a.nvrtcGetPTX);
  bind(lib, path, "nvrtcGetErrorString", a.nvrtcGetErrorString);

  n.info.path = path;
  a.nvrtcVersion(&n.info.major, &n.info.minor);
  int count = 0;
  a.nvrtcGetNumSupportedArchs(&count);
  n.info.archs.resize(static_cast<size_t>(std::max(count, 0)));
  if (count > 0) a.nvrtcGetSupportedArchs(n.info.archs.data());
  std::sort(n.info.archs.begin(), n.info.archs.end());
  return n;
}

const LoadedNvrtc& loaded() {
  static const LoadedNvrtc n = load_nvrtc();
  return n;
}

// Destroys the program on every exit path.
struct ProgramGuard {
  const NvrtcApi& api;
  nvrtcProgram prog = nullptr;
  ~ProgramGuard() {
    if (prog != nullptr) api.nvrtcDestroyProgram(&prog);
  }
};

std::string program_log(const NvrtcApi& api, nvrtcProgram prog) {
  size_t n = 0;
  if (api.nvrtcGetProgramLogSize(prog, &n) != 0 || n <= 1) return "";
  std::string log(n, '\0');
  api.nvrtcGetProgramLog(prog, log.data());
  log.resize(n - 1);
  return log;
}

// A debugging switch set to exactly "1" in the environment.
bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

// RTCNORM_JIT_VERBOSE=1: each compile prints ptxas' registers, spill bytes
// and shared memory for the kernel to stderr (a tuning aid; a kernel found in
// the disk cache is not compiled, so pair it with RTCNORM_DISABLE_DISK_CACHE=1).
bool jit_verbose() { return env_is_one("RTCNORM_JIT_VERBOSE"); }

}  // namespace

void set_nvrtc_search_dirs(std::vector<std::string> dirs) {
  std::lock_guard<std::mutex> lock(g_dirs_mutex);
  g_search_dirs = std::move(dirs);
}

const NvrtcInfo& nvrtc_info() { return loaded().info; }

std::vector<std::string> compile_options(int arch, std::string* target, bool* is_cubin) {
  const NvrtcInfo& info = nvrtc_info();
  TORCH_CHECK(arch >= 80, "rtcnorm: sm_", arch, " is not supported; rtcnorm kernels need sm_80 or newer");
  TORCH_CHECK(!info.archs.empty(), "rtcnorm: NVRTC at ", info.path, " reports no supported architectures");
  const bool known = std::find(info.archs.begin(), info.archs.end(), arch) != info.archs.end();
  int ptx_arch = 0;
  if (!known) {
    // Newer than this NVRTC: emit PTX for the newest arch it knows that is
    // older than the device; the driver JIT-compiles it at load.
    for (int a : info.archs)
      if (a < arch) ptx_arch = a;
    TORCH_CHECK(ptx_arch != 0, "rtcnorm: NVRTC ", info.major, ".", info.minor, " cannot target sm_", arch);
  }
  *is_cubin = known;
  *target = known ? "sm_" + std::to_string(arch) : "compute_" + std::to_string(ptx_arch);
  std::vector<std::string> opts = {"--gpu-architecture=" + *target, "-std=c++17", "--restrict"};
  if (env_is_one("RTCNORM_JIT_LINEINFO")) opts.emplace_back("-lineinfo");
  if (jit_verbose()) opts.emplace_back("--ptxas-options=-v");
  return opts;
}

namespace {

// Throws an NVRTC step's failure with the kernel, its target, the NVRTC and
// driver versions and NVRTC's log (empty past compilation).
void nvrtc_failure(const LoadedNvrtc& n, const KernelKey& key, const std::string& target, const char* step,
                   nvrtcResult r, const std::string& log) {
  std::ostringstream os;
  os << "rtcnorm: NVRTC " << step << " failed (" << n.api.nvrtcGetErrorString(r) << ") for kernel " << key.describe()
     << "\n  instantiation: " << key.name_expression() << "\n  target: " << target << "\n  NVRTC " << n.info.major
     << "." << n.info.minor << " at " << n.info.path << ", CUDA driver " << driver_version_string() << "\n  log:\n"
     << log;
  TORCH_CHECK(false, os.str());
}

// Creates and compiles key's program with `opts`; throws with NVRTC's log on
// failure. The guard owns the program.
void compile_program(const LoadedNvrtc& n, const KernelKey& key, const std::vector<std::string>& opts,
                     const std::string& target, ProgramGuard& guard) {
  const NvrtcApi& api = n.api;
  const std::string expr = key.name_expression();
  const std::string source = std::string("#include \"") + key.family->header + "\"\n";
  std::vector<const char*> names, texts;
  for (int i = 0; i < kNumEmbeddedSources; ++i) {
    names.push_back(kEmbeddedSources[i].name);
    texts.push_back(kEmbeddedSources[i].text);
  }
  nvrtcResult r = api.nvrtcCreateProgram(&guard.prog, source.c_str(), "rtcnorm_entry.cu", kNumEmbeddedSources,
                                         texts.data(), names.data());
  if (r != 0) nvrtc_failure(n, key, target, "program creation", r, "");
  r = api.nvrtcAddNameExpression(guard.prog, expr.c_str());
  if (r != 0) nvrtc_failure(n, key, target, "name expression", r, "");
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  r = api.nvrtcCompileProgram(guard.prog, static_cast<int>(copts.size()), copts.data());
  if (r != 0) nvrtc_failure(n, key, target, "compilation", r, program_log(api, guard.prog));
}

// The number before `what` on the line of ptxas' report that holds it, or -1.
int report_number(const std::string& log, const std::string& what) {
  const size_t at = log.find(what);
  if (at == std::string::npos) return -1;
  size_t begin = at;
  while (begin > 0 && log[begin - 1] == ' ') --begin;
  size_t digits = begin;
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(log[digits - 1]))) --digits;
  return digits == begin ? -1 : std::atoi(log.c_str() + digits);
}

}  // namespace

PtxasUsage ptxas_usage(const KernelKey& key) {
  const LoadedNvrtc& n = loaded();
  std::string target;
  bool is_cubin = false;
  std::vector<std::string> opts = compile_options(key.arch, &target, &is_cubin);
  PtxasUsage u;
  u.target = target;
  if (!is_cubin) return u;  // PTX for the driver to finish: no ptxas report here
  if (std::find(opts.begin(), opts.end(), "--ptxas-options=-v") == opts.end()) opts.emplace_back("--ptxas-options=-v");
  ProgramGuard guard{n.api};
  compile_program(n, key, opts, target, guard);
  const std::string log = program_log(n.api, guard.prog);
  u.registers = report_number(log, "registers");
  u.spill_stores = report_number(log, "bytes spill stores");
  u.spill_loads = report_number(log, "bytes spill loads");
  u.stack_frame = report_number(log, "bytes stack frame");
  u.reported = u.registers >= 0 && u.spill_stores >= 0 && u.spill_loads >= 0;
  TORCH_CHECK(u.reported, "rtcnorm: no ptxas resource report for ", key.name_expression(), " (", target, "):\n", log);
  return u;
}

CompiledKernel compile_kernel(const KernelKey& key) {
  const LoadedNvrtc& n = loaded();
  const NvrtcApi& api = n.api;
  CompiledKernel out;
  const std::vector<std::string> opts = compile_options(key.arch, &out.target, &out.is_cubin);
  const std::string expr = key.name_expression();
  ProgramGuard guard{api};
  compile_program(n, key, opts, out.target, guard);
  if (jit_verbose()) std::fprintf(stderr, "rtcnorm jit: %s\n%s\n", expr.c_str(), program_log(api, guard.prog).c_str());
  const char* lowered = nullptr;
  nvrtcResult r = api.nvrtcGetLoweredName(guard.prog, expr.c_str(), &lowered);
  if (r != 0 || lowered == nullptr) nvrtc_failure(n, key, out.target, "lowered-name lookup", r, "");
  out.lowered_name = lowered;
  size_t size = 0;
  if (out.is_cubin) {
    r = api.nvrtcGetCUBINSize(guard.prog, &size);
    if (r == 0) {
      out.image.resize(size);
      r = api.nvrtcGetCUBIN(guard.prog, out.image.data());
    }
  } else {
    r = api.nvrtcGetPTXSize(guard.prog, &size);
    if (r == 0) {
      out.image.resize(size);
      r = api.nvrtcGetPTX(guard.prog, out.image.data());
    }
  }
  if (r != 0 || out.image.empty()) nvrtc_failure(n, key, out.target, "output retrieval", r, "");
  return out;
}

}  // namespace rtcnorm::jit
