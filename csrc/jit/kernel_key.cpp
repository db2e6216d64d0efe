#include "jit/kernel_key.h"

#include <sstream>

namespace rtcnorm::jit {

std::string KernelKey::describe() const {
  std::ostringstream os;
  os << (family ? family->name : "?") << "[dtype=" << short_name(dtype) << " wdtype=" << short_name(wdtype)
     << " N=" << hidden << " vec=" << vec << " threads_per_row=" << threads_per_row << " rows_per_cta=" << rows_per_cta
     << " vecs_per_thread=" << vecs_per_thread << " flags=0x" << std::hex << flags << std::dec << " variant=" << variant
     << " cluster=" << cluster << " arch=sm_" << arch << "]";
  return os.str();
}

}  // namespace rtcnorm::jit
