#include "ops/norm/tuned_plans.h"

#include <mutex>
#include <sstream>
#include <unordered_map>

#include "jit/disk_cache.h"

namespace rtcnorm {
namespace {

constexpr const char* kLoweredName = "tuned-norm-plan";

std::string key_text(bool forward, const NormProblem& p, unsigned extra, const jit::DeviceInfo& dev) {
  std::ostringstream os;
  os << "rtcnorm " << RTCNORM_VERSION << "\ntuned norm plan 1\ndevice " << dev.name << " sm_count " << dev.sm_count
     << " arch " << dev.arch << "\n"
     << (forward ? "fwd" : "bwd") << " kind " << int(p.kind) << " dtype " << int(p.dtype) << " wdtype " << int(p.wdtype)
     << " rows " << p.rows << " hidden " << p.hidden << " vec " << p.vec() << " features " << int(p.has_weight)
     << int(p.has_bias) << int(p.zero_centered) << int(p.residual) << int(p.single_stride) << int(p.flat) << " extra "
     << extra << "\n";
  return os.str();
}

std::string encode(const TunedChoice& c) {
  std::ostringstream os;
  os << c.design;
  for (int k = 0; k < kKnobCount; ++k) os << " " << c.knobs.get(static_cast<Knob>(k));
  return os.str();
}

std::optional<TunedChoice> decode(const std::string& s) {
  std::istringstream is(s);
  TunedChoice c;
  if (!(is >> c.design) || c.design < 0) return std::nullopt;
  for (int k = 0; k < kKnobCount; ++k) {
    int v = 0;
    if (!(is >> v)) return std::nullopt;
    c.knobs.set(static_cast<Knob>(k), v);
  }
  return c;
}

struct Store {
  std::mutex mutex;
  // Misses too, so the disk is read once per problem. Bounded like the plan
  // memo (it is read only on a memo miss): a stream of ever-new row counts
  // starts it over rather than growing it (a choice kept in memory only,
  // persist=False, is then forgotten; stored ones are read again).
  std::unordered_map<std::string, std::optional<TunedChoice>> known;
  void remember(const std::string& key, const std::optional<TunedChoice>& c) {
    if (known.size() >= kKnownEntries) known.clear();
    known[key] = c;
  }
  static constexpr size_t kKnownEntries = 4096;
};

Store& store() {
  static Store s;
  return s;
}

}  // namespace

std::optional<TunedChoice> find_tuned(bool forward, const NormProblem& p, unsigned extra, const jit::DeviceInfo& dev) {
  const std::string key = key_text(forward, p, extra, dev);
  Store& s = store();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.known.find(key);
    if (it != s.known.end()) return it->second;
  }
  std::optional<TunedChoice> found;
  jit::CompiledKernel entry;
  if (jit::disk_cache_load(dev.arch, key, &entry) == jit::DiskLookup::kHit && entry.lowered_name == kLoweredName)
    found = decode(entry.image);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.remember(key, found);
  return found;
}

bool store_tuned(bool forward, const NormProblem& p, unsigned extra, const jit::DeviceInfo& dev, const TunedChoice& c,
                 bool persist) {
  const std::string key = key_text(forward, p, extra, dev);
  {
    std::lock_guard<std::mutex> lock(store().mutex);
    store().remember(key, c);
  }
  if (!persist) return false;
  jit::CompiledKernel entry;
  entry.lowered_name = kLoweredName;
  entry.target = "tuning";
  entry.is_cubin = false;
  entry.image = encode(c);
  return jit::disk_cache_store(dev.arch, key, entry);
}

void forget_tuned() {
  std::lock_guard<std::mutex> lock(store().mutex);
  store().known.clear();
}

}  // namespace rtcnorm
