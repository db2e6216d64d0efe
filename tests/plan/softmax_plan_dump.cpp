// Dumps every field of the softmax plans over a broad sweep of problems, so
// two trees' planners can be compared (softmax_plan_diff.py builds this once
// per tree). -DPLAN_API=1: the planner of ops/softmax_plan.h (plan_softmax(p,
// arch)); -DPLAN_API=2: the one of ops/softmax/plan/planner.h.
//   dump groups        one line per (dtype, sk): a digest of its plans
//   dump group D SK    every plan of that group, one line each
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if PLAN_API == 1
#include "ops/softmax_plan.h"
#else
#include "ops/softmax/plan/planner.h"
#endif
#include "ops/variants.h"

namespace rtcnorm {
bool register_variants(const char*, VariantFn) { return true; }
}  // namespace rtcnorm

using namespace rtcnorm;

namespace {

// variant: 0 plain, 1 masked, 2 causal, 3 aligned causal. flat: the row
// tensors are one contiguous array from a 16-byte aligned base.
struct Desc {
  jit::DType dtype;
  int64_t rows, cols, sq, bcast;
  int max_vec, variant, arch, sms;
  bool backward, flat;
};

// Sets the problem's `flat` where its planner has one (trees before flat_row
// have none, and plan every problem as not flat).
template <typename P>
auto set_flat(P& p, bool flat, int) -> decltype(p.flat = flat, void()) {
  p.flat = flat;
}
template <typename P>
void set_flat(P&, bool, long) {}

struct Out {
  jit::KernelKey key;
  bool cached, persistent;
  int ctas_per_sm, reuse_splits;
  int64_t row_blocks;
};

Out plan_of(const Desc& d) {
#if PLAN_API == 1
  SoftmaxProblem p;
  p.dtype = d.dtype;
  p.rows = d.rows;
  p.cols = d.cols;
  p.max_vec = d.max_vec;
  p.kind = d.variant == 0 ? kSoftmaxPlain : d.variant == 1 ? kSoftmaxMasked : kSoftmaxCausal;
  p.sq = d.sq;
  p.backward = d.backward;
  p.mask_bcast = d.bcast > 1;
  p.bcast = d.bcast > 1 ? d.bcast : 1;
  p.sm_count = d.sms;
  const SoftmaxPlan plan = plan_softmax(p, d.arch);
#else
  SoftmaxProblem p;
  p.variant = static_cast<SoftmaxVariant>(d.variant);
  p.backward = d.backward;
  p.dtype = d.dtype;
  p.rows = d.rows;
  p.cols = d.cols;
  p.sq = d.sq;
  p.max_vec = d.max_vec;
  p.mask_bcast = d.bcast > 1 ? d.bcast : 1;
  p.arch = SoftmaxArch(d.arch, d.sms);
  set_flat(p, d.flat, 0);
  const SoftmaxPlan plan = plan_softmax(p);
#endif
  return {plan.key, plan.cached, plan.persistent, plan.ctas_per_sm, plan.reuse_splits, plan.row_blocks};
}

int line(char* buf, size_t n, const Desc& d, const Out& o) {
  const jit::KernelKey& k = o.key;
  return std::snprintf(buf, n,
                       "p=%d/%lld/%lld/sq%lld/b%lld/v%d/k%d/a%d/s%d/%s/f%d key=%s,%d,%d,%d,%d,%d,%u,%d,%d,%d "
                       "cached=%d persistent=%d ctas_per_sm=%d reuse_splits=%d row_blocks=%lld\n",
                       int(d.dtype), (long long)d.rows, (long long)d.cols, (long long)d.sq, (long long)d.bcast,
                       d.max_vec, d.variant, d.arch, d.sms, d.backward ? "bwd" : "fwd", int(d.flat), k.family->name,
                       int(k.dtype),
                       k.hidden, k.vec, k.threads_per_row, k.rows_per_cta, k.flags, k.vecs_per_thread, k.variant,
                       k.cluster, int(o.cached), int(o.persistent), o.ctas_per_sm, o.reuse_splits,
                       (long long)o.row_blocks);
}

std::vector<int64_t> sweep_cols() {
  std::vector<int64_t> v;
  for (int64_t s = 1; s <= 1100; ++s) v.push_back(s);
  for (int64_t s = 1101; s <= 4096; s += 7) v.push_back(s);
  for (int64_t p = 1024; p <= 262144; p *= 2)
    for (int64_t d : {-1, 0, 1, 7}) v.push_back(p + d > 262144 ? 262144 : p + d);
  for (double s = 4097; s < 262144; s *= 1.07) v.push_back(static_cast<int64_t>(s) | 1);
  for (int64_t s : {3072, 3584, 5120, 6144, 7168, 9001, 9999, 12288, 20000, 40000, 49152, 100000, 196608})
    v.push_back(s);
  return v;
}

const int64_t kRows[] = {1,    2,    3,    4,     7,     8,     15,    16,     17,     31,     32,
                         33,   63,   64,   65,    100,   108,   131,   132,    133,    148,    200,
                         255,  256,  264,  500,   512,   1000,  1024,  1056,   2047,   2048,   4095,
                         4096, 4097, 8192, 16384, 32768, 65536, 65537, 131072, 262144, 524288, 1 << 20};

// Forward and backward variants: {variant, backward, sq, mask bcast}.
struct V {
  int variant;
  bool backward;
  int64_t sq, bcast;
};
const V kVariants[] = {{0, false, 0, 1}, {1, false, 0, 1},  {1, false, 0, 2},  {1, false, 0, 4},
                       {1, false, 0, 8}, {1, false, 0, 16}, {1, false, 0, 32}, {2, false, 1, 1},
                       {2, false, 2, 1}, {3, false, 1, 1},  {3, false, 7, 1},  {0, true, 0, 1},
                       {2, true, 1, 1},  {2, true, 2, 1},   {3, true, 9, 1},   {1, true, 0, 1}};
const int kArchSms[][2] = {{80, 0}, {80, 108}, {90, 0}, {90, 132}, {90, 114}, {100, 0}, {100, 148}};
const jit::DType kDtypes[] = {jit::DType::kFloat32, jit::DType::kFloat16, jit::DType::kBFloat16};

template <typename F>
void for_group(jit::DType dt, int64_t cols, F&& f) {
  for (int64_t rows : kRows)
    for (const V& v : kVariants)
      for (const auto& as : kArchSms)
        for (int max_vec : {16, 2, 1})
          for (bool flat : {true, false}) {
            if (max_vec == 2 && cols % 2 != 0) continue;  // the same plan as max_vec 1
            Desc d{dt, rows, cols, v.sq, v.bcast, max_vec, v.variant, as[0], as[1], v.backward, flat};
            f(d, plan_of(d));
          }
}

}  // namespace

int main(int argc, char** argv) {
  char buf[512];
  if (argc >= 2 && std::strcmp(argv[1], "groups") == 0) {
    for (jit::DType dt : kDtypes)
      for (int64_t cols : sweep_cols()) {
        uint64_t h = 0xcbf29ce484222325ULL;
        int64_t n = 0;
        for_group(dt, cols, [&](const Desc& d, const Out& o) {
          const int len = line(buf, sizeof buf, d, o);
          for (int i = 0; i < len; ++i) h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ULL;
          ++n;
        });
        std::printf("%d %lld %lld %016llx\n", int(dt), (long long)cols, (long long)n, (unsigned long long)h);
      }
    return 0;
  }
  if (argc >= 4 && std::strcmp(argv[1], "group") == 0) {
    const jit::DType dt = static_cast<jit::DType>(std::atoi(argv[2]));
    for_group(dt, std::atoll(argv[3]), [&](const Desc& d, const Out& o) {
      line(buf, sizeof buf, d, o);
      std::fputs(buf, stdout);
    });
    return 0;
  }
  std::fprintf(stderr, "usage: %s groups | group DTYPE SK\n", argv[0]);
  return 2;
}
