// Uses an installed hopattn without a GPU: the build info, the C ABI, and a call the library must
// reject with a message (validation runs before any device is looked for).
#include <cstdio>
#include <cstring>

#include <hopattn/hopattn.h>
#include <hopattn/hopattn.hpp>

int main() {
  const hopattn::BuildInfo info = hopattn::build_info();
  std::printf("hopattn %s, kernels for head dims", info.version.c_str());
  for (int d : info.head_dims) std::printf(" %d", d);
  std::printf(", dtypes");
  for (hopattn::DType t : info.dtypes) std::printf(" %s", hopattn::dtype_name(t));
  std::printf("\n");
  if (info.head_dims.empty() || info.dtypes.empty() || info.version != hopattn_version()) {
    std::fprintf(stderr, "build_info() and hopattn_version() disagree or are empty\n");
    return 1;
  }

  hopattn::ForwardArgs args;  // all tensors empty: q.rank is 0
  const hopattn::Status s = hopattn::forward(args, nullptr);
  if (s.code() != hopattn::StatusCode::kInvalidArgument || s.message().find("q.rank") == std::string::npos) {
    std::fprintf(stderr, "forward() on empty arguments: unexpected status: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("forward() rejected empty arguments: %s\n", s.message().c_str());
  return 0;
}
