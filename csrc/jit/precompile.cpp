// rtcnorm.jit.precompile's engine: the distinct keys compiled on worker
// threads, progress reported on the calling thread.
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "jit/kernel_cache.h"

namespace rtcnorm::jit {
namespace {

// Keeps the warnings of the threads that install it, for the caller to re-raise.
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& w) override {
    std::lock_guard<std::mutex> lock(mutex_);
    messages_.push_back(w.msg());
  }
  std::vector<std::string> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(messages_);
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> messages_;
};

}  // namespace

std::vector<std::string> precompile_keys(const std::vector<KernelKey>& requested, int threads,
                                         const std::function<void(size_t, size_t)>& on_done,
                                         std::vector<std::string>* warnings) {
  std::vector<KernelKey> keys;
  {
    std::unordered_set<KernelKey, KernelKeyHash> seen;
    for (const KernelKey& k : requested)
      if (seen.insert(k).second) keys.push_back(k);
  }
  std::vector<std::string> lines(keys.size());
  std::vector<std::exception_ptr> errors(keys.size());
  WarningCollector collector;
  std::mutex mutex;
  std::condition_variable cv;
  size_t done = 0;  // guarded by mutex
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  auto worker = [&] {
    c10::WarningUtils::WarningHandlerGuard guard(&collector);
    for (size_t i = next++; i < keys.size() && !stop; i = next++) {
      try {
        bool compiled = false;
        auto img = compiled_image(keys[i], &compiled);
        lines[i] = keys[i].name_expression() + " " + img->target + (compiled ? " compiled" : " cached");
      } catch (...) {
        errors[i] = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++done;
      }
      cv.notify_one();
    }
  };
  int n = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  n = std::max(1, std::min<int>(n, static_cast<int>(keys.size())));
  std::vector<std::thread> pool;
  for (int i = 0; i < n; ++i) pool.emplace_back(worker);
  std::exception_ptr callback_error;
  for (size_t reported = 0; reported < keys.size() && !callback_error;) {
    size_t now = 0;
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return done > reported; });
      now = done;
    }
    try {
      while (reported < now) {
        ++reported;
        if (on_done) on_done(reported, keys.size());
      }
    } catch (...) {
      callback_error = std::current_exception();
      stop = true;
    }
  }
  for (auto& t : pool) t.join();
  if (warnings != nullptr) *warnings = collector.take();
  if (callback_error) std::rethrow_exception(callback_error);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return lines;
}

}  // namespace rtcnorm::jit
