#include "ops/grid_exchange_buffers.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "jit/kernel_cache.h"

namespace rtcnorm {
namespace {

struct Buffer {
  at::Tensor words;  // int32, on the stream of its key
  uint32_t next_base = 0;
  uint64_t last_use = 0;
};

// Buffers kept at once (one per device and stream that launched a grid
// group); past that the least recently used is dropped, which is safe at any
// time: its memory is recycled on its own stream only, behind its launches.
constexpr size_t kMaxBuffers = 64;
// Smallest buffer, so that one allocation usually serves every launch of a
// stream: 64 KB is 24 words (three slots of four tagged words) for each of
// 682 CTA rows, where a 132-SM device launches groups of at most two CTAs an
// SM, of one or two rows each.
constexpr int64_t kMinWords = 16384;

struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, jit::CUstream>, Buffer> buffers;
  uint64_t clock = 0;
};

// Deliberately never destroyed: its tensors must not be freed by static
// destructors after the CUDA runtime has shut down.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

GridExchangeLease lease_grid_exchange(int64_t words32, int64_t row_blocks, const at::Tensor& like,
                                      jit::CUstream stream) {
  TORCH_INTERNAL_ASSERT(words32 > 0 && row_blocks > 0 && row_blocks <= std::numeric_limits<int32_t>::max(),
                        "rtcnorm: grid exchange of ", words32, " words for ", row_blocks, " row blocks");
  const int device = like.get_device();
  const auto options = like.options().dtype(at::kInt);
  GridExchangeLease lease;
  // The legacy default stream (handle 0) never captures: CUDA refuses to
  // begin a capture on it, so the query (microseconds of host time a call)
  // is needed only on other streams.
  if (stream != nullptr && jit::stream_is_capturing(device, stream)) {
    lease.hold = at::zeros({words32}, options);
    lease.words = reinterpret_cast<unsigned*>(lease.hold.data_ptr<int32_t>());
    return lease;
  }
  const auto span = static_cast<uint32_t>(row_blocks);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto key = std::make_pair(device, stream);
  auto it = r.buffers.find(key);
  if (it == r.buffers.end()) {
    if (r.buffers.size() >= kMaxBuffers)
      r.buffers.erase(std::min_element(r.buffers.begin(), r.buffers.end(), [](const auto& a, const auto& b) {
        return a.second.last_use < b.second.last_use;
      }));
    it = r.buffers.emplace(key, Buffer{}).first;
  }
  Buffer& b = it->second;
  const int64_t have = b.words.defined() ? b.words.numel() : 0;
  if (have < words32 || b.next_base > std::numeric_limits<uint32_t>::max() - span) {
    b.words = at::zeros({std::max({words32, kMinWords, have})}, options);
    b.next_base = 0;
  }
  lease.hold = b.words;
  lease.words = reinterpret_cast<unsigned*>(b.words.data_ptr<int32_t>());
  lease.tag_base = b.next_base;
  b.next_base += span;
  b.last_use = ++r.clock;
  return lease;
}

void advance_grid_exchange_tags(int device, jit::CUstream stream, uint32_t next) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.buffers.find(std::make_pair(device, stream));
  if (it != r.buffers.end()) it->second.next_base = std::max(it->second.next_base, next);
}

uint32_t next_grid_exchange_tag(int device, jit::CUstream stream) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.buffers.find(std::make_pair(device, stream));
  return it == r.buffers.end() ? 0 : it->second.next_base;
}

}  // namespace rtcnorm
