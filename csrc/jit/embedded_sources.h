// Kernel sources embedded into the library at build time (setup.py generates
// the definitions from csrc/kernels/**/*.cuh), so the installed package and
// the kernels it compiles can never disagree.
#pragma once

namespace rtcnorm::jit {

struct EmbeddedSource {
  const char* name;  // path relative to csrc/kernels, e.g. "common/vec.cuh"
  const char* text;
};

extern const EmbeddedSource kEmbeddedSources[];
extern const int kNumEmbeddedSources;
// sha256 over every embedded name and text: part of every disk-cache key.
extern const char kSourcesFingerprint[];

}  // namespace rtcnorm::jit
