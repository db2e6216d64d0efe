#include "jit/py_jit.h"

#include <c10/util/Exception.h>
#include <pybind11/stl.h>

#include <exception>
#include <mutex>
#include <utility>

#include "jit/disk_cache.h"
#include "jit/kernel_cache.h"

namespace py = pybind11;

namespace rtcnorm::jit {
namespace {

// Collects the warnings of the current thread while installed.
class Collector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
  std::vector<std::string> messages;
};

// Raises each message as a Python UserWarning (the GIL must be held); an
// error when the warnings filter turns them into exceptions.
void raise_warnings(const std::vector<std::string>& messages) {
  for (const std::string& m : messages)
    if (PyErr_WarnEx(PyExc_UserWarning, m.c_str(), 1) != 0) throw py::error_already_set();
}

// Runs fn() without the GIL, its warnings collected, then raises them in Python.
template <typename F>
auto with_python_warnings(F fn) {
  Collector collector;
  std::exception_ptr error;
  decltype(fn()) result{};
  {
    py::gil_scoped_release release;
    c10::WarningUtils::WarningHandlerGuard guard(&collector);
    try {
      result = fn();
    } catch (...) {
      error = std::current_exception();
    }
  }
  raise_warnings(collector.messages);
  if (error) std::rethrow_exception(error);
  return result;
}

py::dict stats_dict() {
  const JitStats s = stats();
  py::dict d;
  d["memory_hits"] = s.memory_hits;
  d["memory_misses"] = s.memory_misses;
  d["image_hits"] = s.image_hits;
  d["disk_hits"] = s.disk_hits;
  d["disk_misses"] = s.disk_misses;
  d["disk_corrupt"] = s.disk_corrupt;
  d["disk_writes"] = s.disk_writes;
  d["compiles"] = s.compiles;
  d["compile_ms"] = s.compile_ms;
  d["disk_load_ms"] = s.disk_load_ms;
  d["module_loads"] = s.module_loads;
  d["module_load_ms"] = s.module_load_ms;
  return d;
}

}  // namespace

std::vector<std::string> precompile_for_python(const std::vector<KernelKey>& keys, int threads,
                                               const py::object& progress) {
  std::vector<std::string> warnings;
  auto on_done = [&](size_t done, size_t total) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (!progress.is_none()) progress(done, total);
  };
  std::vector<std::string> lines;
  std::exception_ptr error;
  {
    py::gil_scoped_release release;
    try {
      lines = precompile_keys(keys, threads, on_done, &warnings);
    } catch (...) {
      error = std::current_exception();
    }
  }
  raise_warnings(warnings);
  if (error) std::rethrow_exception(error);
  return lines;
}

void bind_cache(py::module_& m) {
  m.def("cache_dir", &disk_cache_root);
  m.def("disk_cache_enabled", [] { return with_python_warnings([] { return disk_cache_enabled(); }); });
  m.def("clear_cache", [] { return with_python_warnings([] { return clear_cache(); }); });
  m.def("stats", &stats_dict);
  m.def("reset_stats", &reset_stats);
  // Tests only: reads the entry of key_text from the sm_<arch> folder through
  // the loader's own path; returns ("hit", image), or ("miss" | "corrupt" |
  // "disabled", b"").
  m.def("_disk_cache_read", [](int arch, const std::string& key_text) {
    CompiledKernel k;
    const DiskLookup r = with_python_warnings([&] { return disk_cache_load(arch, key_text, &k); });
    const char* names[] = {"hit", "miss", "corrupt", "disabled"};
    return py::make_tuple(names[static_cast<int>(r)], py::bytes(k.image));
  });
}

}  // namespace rtcnorm::jit
