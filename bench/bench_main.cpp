// hopattn-bench: runs forward and backward on a default problem, on one given by flags, or on the
// standard sweep; checks each result against the GPU float64 reference with FA3's rule; prints
// median times and TFLOP/s, and optionally JSON.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/device.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"
#include "hopattn/hopattn.hpp"
#include "problem_flops.hpp"
#include "testing/attention_case.hpp"
#include "testing/gpu_oracle.hpp"

namespace hopattn::bench {
namespace {

using testing::check_cuda;

void require(const Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.message());
}

// Median over `repetitions` launches timed with CUDA events, after `warmup` untimed ones.
double median_ms(const std::function<Status()>& launch, int warmup, int repetitions) {
  for (int i = 0; i < warmup; ++i) require(launch(), "warm-up launch");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> times;
  for (int i = 0; i < repetitions; ++i) {
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    require(launch(), "timed launch");
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "kernel");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

std::string summarize(const std::vector<testing::ErrorReport>& reports) {
  std::string failures;
  for (const testing::ErrorReport& r : reports) {
    if (!r.ok) failures += (failures.empty() ? "" : "; ") + r.str();
  }
  return failures.empty() ? "pass" : "FAIL: " + failures;
}

std::vector<ResultRow> run_problem(const BenchOptions& options, const BenchProblem& problem) {
  const testing::AttentionCase c(problem.spec);
  const testing::Outputs fwd = c.new_outputs();
  const ForwardArgs forward_args = c.forward_args(fwd);
  std::vector<ResultRow> rows;

  // With the workspace the library asks for, as the Python package passes it.
  size_t forward_bytes = 0;
  if (options.forward_workspace) require(forward_workspace_size(forward_args, &forward_bytes), "forward_workspace_size");
  testing::DeviceBuffer forward_workspace(forward_bytes);
  const auto run_forward = [&] { return forward(forward_args, Workspace{forward_workspace.data(), forward_bytes}, nullptr); };
  require(run_forward(), "forward");
  if (options.run_forward) {
    ResultRow row{"hopattn", "fwd", problem};
    row.ms = median_ms(run_forward, options.warmup, options.repetitions);
    row.tflops = forward_flops(problem.spec) / (row.ms * 1e9);
    rows.push_back(row);
  }

  testing::Outputs grads;
  if (options.run_backward) {
    grads = c.new_outputs();
    BackwardArgs backward_args = c.backward_args(fwd, grads);
    backward_args.deterministic = problem.deterministic;
    size_t bytes = 0;
    require(backward_workspace_size(backward_args, &bytes), "backward_workspace_size");
    testing::DeviceBuffer workspace(bytes);
    const auto run_backward = [&] { return backward(backward_args, Workspace{workspace.data(), bytes}, nullptr); };
    ResultRow row{"hopattn", "bwd", problem};
    row.ms = median_ms(run_backward, options.warmup, options.repetitions);
    row.tflops = backward_flops(problem.spec) / (row.ms * 1e9);
    rows.push_back(row);
  }
  check_cuda(cudaDeviceSynchronize(), "benchmark");

  if (options.check) {
    const auto reports = testing::check_with_gpu_oracle(c, fwd, options.run_backward ? &grads : nullptr);
    for (ResultRow& row : rows) row.check = summarize(row.direction == "bwd" ? reports.backward : reports.forward);
  } else {
    for (ResultRow& row : rows) row.check = "skipped";
  }
  return rows;
}

// Whether the library accepts the problem the flags describe (head dim, GQA head counts, mask,
// varlen lengths) and this build has a kernel for it, decided without a GPU: the arguments get
// placeholder addresses, which validation checks for alignment but never reads.
Status check_problem(const BenchProblem& problem) {
  const testing::CaseSpec& s = problem.spec;
  void* const placeholder = reinterpret_cast<void*>(uintptr_t{1} << 32);
  const bool varlen = s.varlen();
  int64_t total_q = 0, total_k = 0;
  for (int n : s.varlen_seqlens_q) total_q += n;
  for (int n : s.varlen_seqlens_k) total_k += n;
  const auto rows = [&](int64_t heads, int64_t seqlen, int64_t total, int64_t d) {
    const int64_t stride = heads * d + s.row_padding;
    return varlen ? make_tensor(placeholder, s.dtype, {total, heads, d}, {stride, d, 1})
                  : make_tensor(placeholder, s.dtype, {s.batch, seqlen, heads, d}, {seqlen * stride, stride, d, 1});
  };
  BackwardArgs args;
  args.q = args.dq = rows(s.heads, s.seqlen_q, total_q, s.head_dim);
  args.o = args.dout = rows(s.heads, s.seqlen_q, total_q, s.value_dim());
  args.k = args.dk = rows(s.heads_kv, s.seqlen_k, total_k, s.head_dim);
  args.v = args.dv = rows(s.heads_kv, s.seqlen_k, total_k, s.value_dim());
  args.lse = varlen ? make_tensor(placeholder, DType::kFloat32, {s.heads, total_q})
                    : make_tensor(placeholder, DType::kFloat32, {s.batch, s.heads, s.seqlen_q});
  args.softmax_scale = s.softmax_scale;
  args.mask = Mask{s.causal, s.window_left, s.window_right};
  if (varlen) {
    const auto* indices = static_cast<const int32_t*>(placeholder);
    const int64_t batch = static_cast<int64_t>(s.varlen_seqlens_q.size());
    args.varlen.cu_seqlens_q = args.varlen.cu_seqlens_k = IntArray{indices, batch + 1};
    if (!s.seqused_q.empty()) args.varlen.seqused_q = IntArray{indices, batch};
    if (!s.seqused_k.empty()) args.varlen.seqused_k = IntArray{indices, batch};
    for (int n : s.varlen_seqlens_q) args.varlen.max_seqlen_q = std::max(args.varlen.max_seqlen_q, n);
    for (int n : s.varlen_seqlens_k) args.varlen.max_seqlen_k = std::max(args.varlen.max_seqlen_k, n);
  }
  args.deterministic = problem.deterministic;
  // The backward's rules cover the forward's (same q, k, v, o, lse) and need no device.
  size_t workspace_bytes = 0;
  if (Status st = backward_workspace_size(args, &workspace_bytes); !st.ok()) return st;
  const BuildInfo info = build_info();
  const bool has_dtype = std::find(info.dtypes.begin(), info.dtypes.end(), s.dtype) != info.dtypes.end();
  const bool has_head_dims = std::any_of(info.kernel_head_dims.begin(), info.kernel_head_dims.end(), [&](HeadDimPair k) {
    return k.qk >= s.head_dim && k.v >= s.value_dim();
  });
  if (!has_dtype || !has_head_dims) {
    return Status(StatusCode::kNotSupported, std::string("this build has no ") + dtype_name(s.dtype) +
                                                 " kernel for head dims " + std::to_string(s.head_dim) + " / " +
                                                 std::to_string(s.value_dim()) +
                                                 " (see CMake options HOPATTN_DTYPES and HOPATTN_HEADDIMS)");
  }
  return Status();
}

int run(int argc, char** argv) {
  BenchOptions options;
  try {
    options = parse_options(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "hopattn-bench: %s\n", e.what());
    return 2;
  }
  if (options.help) {
    std::fputs(usage(), stdout);
    return 0;
  }
  // Flags that parse but describe a problem the library rejects are usage errors too, reported
  // before any GPU is looked for.
  for (const BenchProblem& problem : options.problems) {
    if (const Status s = check_problem(problem); !s.ok()) {
      std::fprintf(stderr, "hopattn-bench: %s\n", s.message().c_str());
      return 2;
    }
  }
  const Status device = check_current_device();
  if (!device.ok()) {
    std::fprintf(stderr, "hopattn-bench: %s\nNothing was run: hopattn-bench needs an NVIDIA Hopper GPU (H100/H200).\n",
                 device.message().c_str());
    return 2;
  }

  const Environment env = read_environment(options.command);
  std::printf("hopattn %s on %s, CUDA %s, commit %s\n", build_info().version.c_str(), env.gpu.c_str(), env.cuda.c_str(),
              env.commit.c_str());
  print_header();
  std::vector<ResultRow> all;
  bool failed = false;
  const size_t n = options.problems.size();
  for (size_t i = 0; i < n; ++i) {
    const testing::CaseSpec& s = options.problems[i].spec;
    if (n > 1) {
      std::fprintf(stderr, "[%zu/%zu] d=%d %s seqlen=%d batch=%d heads=%d\n", i + 1, n, s.head_dim,
                   s.causal ? "causal" : "non-causal", s.seqlen_q, s.batch, s.heads);
    }
    try {
      for (const ResultRow& row : run_problem(options, options.problems[i])) {
        print_row(row);
        failed = failed || row.check.rfind("FAIL", 0) == 0;
        all.push_back(row);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hopattn-bench: problem %zu failed: %s\n", i + 1, e.what());
      return 1;
    }
    // Rewritten after every problem, so a long sweep that is cut short keeps what it measured.
    if (!options.json_path.empty() && options.json_path != "-") write_json(options.json_path, env, all);
  }
  if (options.json_path == "-") write_json(options.json_path, env, all);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace hopattn::bench

int main(int argc, char** argv) { return hopattn::bench::run(argc, argv); }
