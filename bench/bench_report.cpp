#include "bench_report.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "hopattn/hopattn.h"

namespace hopattn::bench {
namespace {

std::string cuda_version_string(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The driver's own version (e.g. "580.159.04") through NVML, loaded only if present so that the
// benchmark does not depend on it; falls back to the driver's CUDA API version.
std::string driver_version() {
  int cuda_driver = 0;
  cudaDriverGetVersion(&cuda_driver);
  std::string version = "CUDA " + cuda_version_string(cuda_driver);
  void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml == nullptr) return version;
  using InitFn = int (*)();
  using VersionFn = int (*)(char*, unsigned);
  auto init = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlInit_v2"));
  auto get = reinterpret_cast<VersionFn>(dlsym(nvml, "nvmlSystemGetDriverVersion"));
  auto shutdown = reinterpret_cast<InitFn>(dlsym(nvml, "nvmlShutdown"));
  char buffer[96] = {};
  if (init && get && shutdown && init() == 0) {
    if (get(buffer, sizeof buffer) == 0) version = buffer;
    shutdown();
  }
  dlclose(nvml);
  return version;
}

int total_tokens(const std::vector<int>& lengths) {
  int total = 0;
  for (int n : lengths) total += n;
  return total;
}

}  // namespace

Environment read_environment(const std::string& command) {
  Environment env;
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  env.date = date;
  int device = 0, runtime = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    env.gpu = prop.name;
  cudaRuntimeGetVersion(&runtime);
  env.driver = driver_version();
  env.cuda = cuda_version_string(runtime);
  env.commit = hopattn_build_commit();
  env.command = command;
  return env;
}

void print_header() {
  std::printf("%-8s %-4s %-5s %7s %-9s %5s %5s %5s %6s %6s %6s %10s %9s  %s\n", "impl", "dir", "dtype", "d", "mask",
              "batch", "heads", "kv", "sq", "sk", "varlen", "ms", "TFLOP/s", "check");
}

void print_row(const ResultRow& r) {
  const testing::CaseSpec& s = r.problem.spec;
  std::string mask = s.causal ? "causal" : "none";
  if (s.window_left >= 0 || s.window_right >= 0) {
    mask =
        (s.causal ? "c" : "") + std::string("w") + std::to_string(s.window_left) + "," + std::to_string(s.window_right);
  }
  // The head dim, or Q/K's and V's where they differ.
  const std::string dims =
      std::to_string(s.head_dim) + (s.value_dim() != s.head_dim ? "/" + std::to_string(s.value_dim()) : "");
  std::printf("%-8s %-4s %-5s %7s %-9s %5d %5d %5d %6d %6d %6s %10.3f %9.1f  %s\n", r.impl.c_str(), r.direction.c_str(),
              s.dtype == DType::kBFloat16 ? "bf16" : "fp16", dims.c_str(), mask.c_str(),
              s.varlen() ? int(s.varlen_seqlens_q.size()) : s.batch, s.heads, s.heads_kv, s.seqlen_q, s.seqlen_k,
              s.varlen() ? "yes" : "no", r.ms, r.tflops, r.check.c_str());
  std::fflush(stdout);
}

void write_json(const std::string& path, const Environment& env, const std::vector<ResultRow>& rows) {
  std::ostringstream out;
  out << "{\n  \"env\": {\"date\": " << json_string(env.date) << ", \"gpu\": " << json_string(env.gpu)
      << ", \"driver\": " << json_string(env.driver) << ", \"cuda\": " << json_string(env.cuda)
      << ", \"torch\": null, \"cudnn\": null, \"commit\": " << json_string(env.commit)
      << ", \"command\": " << json_string(env.command) << "},\n  \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const ResultRow& r = rows[i];
    const testing::CaseSpec& s = r.problem.spec;
    out << (i ? "," : "") << "\n    {\"impl\": " << json_string(r.impl)
        << ", \"direction\": " << json_string(r.direction) << ", \"dtype\": \""
        << (s.dtype == DType::kBFloat16 ? "bf16" : "fp16") << "\", \"hdim\": " << s.head_dim
        << ", \"hdim_v\": " << s.value_dim()
        << ", \"causal\": " << (s.causal ? "true" : "false") << ", \"window_left\": " << s.window_left
        << ", \"window_right\": " << s.window_right
        << ", \"batch\": " << (s.varlen() ? int(s.varlen_seqlens_q.size()) : s.batch) << ", \"heads\": " << s.heads
        << ", \"heads_kv\": " << s.heads_kv << ", \"seqlen_q\": " << s.seqlen_q << ", \"seqlen_k\": " << s.seqlen_k
        << ", \"varlen\": " << (s.varlen() ? "true" : "false")
        << ", \"deterministic\": " << (r.problem.deterministic ? "true" : "false") << ", \"ms\": " << r.ms
        << ", \"tflops\": " << r.tflops << ", \"check\": " << json_string(r.check);
    if (s.varlen()) {
      out << ", \"total_q\": " << total_tokens(s.varlen_seqlens_q)
          << ", \"total_k\": " << total_tokens(s.varlen_seqlens_k);
    }
    out << "}";
  }
  out << "\n  ]\n}\n";
  if (path == "-") {
    std::cout << out.str();
    return;
  }
  std::ofstream file(path);
  if (!file) throw std::runtime_error("cannot write " + path);
  file << out.str();
}

}  // namespace hopattn::bench
