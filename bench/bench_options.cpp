#include "bench_options.hpp"

#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <sstream>
#include <string>

namespace hopattn::bench {
namespace {

// The standard sweep (FlashAttention-3 paper): 16k tokens, hidden 2048.
constexpr int kSweepTokens = 16384;
constexpr int kSweepHidden = 2048;
constexpr int kSweepSeqlens[] = {512, 1024, 2048, 4096, 8192, 16384};

int to_int(const std::string& flag, const std::string& value) {
  size_t used = 0;
  int parsed = 0;
  try {
    parsed = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty()) throw std::invalid_argument(flag + ": '" + value + "' is not an integer");
  return parsed;
}

// Random lengths that sum to batch * seqlen (each at least 1 when possible), for --varlen.
std::vector<int> random_lengths(int batch, int seqlen, std::mt19937& rng) {
  std::vector<int> lengths(batch, 0);
  const long long total = static_cast<long long>(batch) * seqlen;
  std::uniform_real_distribution<double> weight(0.25, 1.75);
  std::vector<double> w(batch);
  double sum = 0;
  for (double& x : w) sum += (x = weight(rng));
  long long assigned = 0;
  for (int b = 0; b < batch; ++b) {
    lengths[b] = static_cast<int>(total * w[b] / sum);
    assigned += lengths[b];
  }
  for (long long extra = total - assigned, b = 0; extra > 0; --extra, b = (b + 1) % batch) ++lengths[b];
  return lengths;
}

}  // namespace

const char* usage() {
  return R"(hopattn-bench: time and check hopattn's attention on a Hopper GPU.

Usage: hopattn-bench [options]
  --batch N          sequences (default 8)
  --seqlen N         query and key length (default 2048); --seqlen-q / --seqlen-k set one side
  --heads N          query heads (default 16)
  --heads-kv N       key/value heads, GQA/MQA when below --heads (default: --heads)
  --headdim N        head dim, multiple of 8 up to 256 (default 128)
  --headdim-v N      V's (and O's) head dim, multiple of 8 up to 256 (default: --headdim)
  --dtype T          bf16 or fp16 (default bf16)
  --causal           causal mask (bottom-right aligned)
  --window L,R       sliding window, -1 for unbounded on a side
  --varlen           packed batch with random lengths summing to batch * seqlen
  --deterministic    deterministic backward
  --direction D      fwd, bwd or both (default both)
  --sweep            the standard sweep: 16k tokens, hidden 2048, seqlen 512..16k,
                     head dim 64/128/256, causal and not (other shape flags ignored)
  --sweep-headdims L the sweep's head dims, comma separated (default 64,128,256)
  --warmup N         untimed launches first (default 3)
  --reps N           timed launches; the median is reported (default 20)
  --no-check         skip the comparison with the reference
  --no-forward-workspace
                     run forward() without its optional workspace (no split tail, static schedule)
  --seed N           input seed (default 0)
  --json PATH        also write results as JSON (docs/benchmarking.md schema); '-' for stdout
  -h, --help         this text
Exit status: 0 all checks passed, 1 a check failed, 2 bad usage or no Hopper GPU.
)";
}

BenchOptions parse_options(int argc, char** argv) {
  BenchOptions o;
  for (int i = 0; i < argc; ++i) o.command += (i ? " " : "") + std::string(argv[i]);

  testing::CaseSpec spec;
  spec.batch = 8;
  spec.seqlen_q = spec.seqlen_k = 2048;
  spec.heads = 16;
  spec.head_dim = 128;
  int heads_kv = -1;
  bool varlen = false, sweep = false, deterministic = false;
  std::vector<int> sweep_head_dims = {64, 128, 256};
  uint64_t seed = 0;

  std::string flag;
  int i = 1;
  auto text = [&]() -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    return argv[++i];
  };
  auto number = [&] { return to_int(flag, text()); };
  const std::map<std::string, std::function<void()>> handlers = {
      {"-h", [&] { o.help = true; }},
      {"--help", [&] { o.help = true; }},
      {"--batch", [&] { spec.batch = number(); }},
      {"--seqlen", [&] { spec.seqlen_q = spec.seqlen_k = number(); }},
      {"--seqlen-q", [&] { spec.seqlen_q = number(); }},
      {"--seqlen-k", [&] { spec.seqlen_k = number(); }},
      {"--heads", [&] { spec.heads = number(); }},
      {"--heads-kv", [&] { heads_kv = number(); }},
      {"--headdim", [&] { spec.head_dim = number(); }},
      {"--headdim-v",
       [&] {
         // Given, it must name a head dim: 0 would silently mean --headdim's.
         spec.head_dim_v = number();
         if (spec.head_dim_v < 1) throw std::invalid_argument("--headdim-v must be >= 1");
       }},
      {"--dtype",
       [&] {
         const std::string t = text();
         if (t != "bf16" && t != "fp16") throw std::invalid_argument("--dtype: '" + t + "' is not bf16 or fp16");
         spec.dtype = t == "bf16" ? DType::kBFloat16 : DType::kFloat16;
       }},
      {"--causal", [&] { spec.causal = true; }},
      {"--window",
       [&] {
         const std::string w = text();
         const size_t comma = w.find(',');
         if (comma == std::string::npos) throw std::invalid_argument("--window: expected L,R, got '" + w + "'");
         spec.window_left = to_int(flag, w.substr(0, comma));
         spec.window_right = to_int(flag, w.substr(comma + 1));
       }},
      {"--varlen", [&] { varlen = true; }},
      {"--deterministic", [&] { deterministic = true; }},
      {"--direction",
       [&] {
         const std::string d = text();
         if (d != "fwd" && d != "bwd" && d != "both") {
           throw std::invalid_argument("--direction: '" + d + "' is not fwd, bwd or both");
         }
         o.run_forward = d != "bwd";
         o.run_backward = d != "fwd";
       }},
      {"--sweep", [&] { sweep = true; }},
      {"--sweep-headdims", [&] {
         sweep_head_dims.clear();
         std::stringstream list(text());
         for (std::string item; std::getline(list, item, ',');) sweep_head_dims.push_back(to_int(flag, item));
       }},
      {"--warmup", [&] { o.warmup = number(); }},
      {"--reps", [&] { o.repetitions = number(); }},
      {"--no-check", [&] { o.check = false; }},
      {"--no-forward-workspace", [&] { o.forward_workspace = false; }},
      {"--seed", [&] { seed = static_cast<uint64_t>(number()); }},
      {"--json", [&] { o.json_path = text(); }},
  };
  for (; i < argc; ++i) {
    flag = argv[i];
    const auto handler = handlers.find(flag);
    if (handler == handlers.end()) throw std::invalid_argument("unknown option '" + flag + "' (see --help)");
    handler->second();
  }
  if (spec.batch < 0 || spec.seqlen_q < 0 || spec.seqlen_k < 0) {
    throw std::invalid_argument("--batch and --seqlen* must be >= 0");
  }
  if (spec.heads < 1 || spec.head_dim < 1) throw std::invalid_argument("--heads and --headdim must be >= 1");
  if (o.warmup < 0) throw std::invalid_argument("--warmup must be >= 0");
  if (o.repetitions < 1) throw std::invalid_argument("--reps must be >= 1");
  spec.heads_kv = heads_kv > 0 ? heads_kv : spec.heads;
  if (heads_kv == 0 || heads_kv < -1) throw std::invalid_argument("--heads-kv must be >= 1");
  spec.seed = seed;

  std::mt19937 rng(static_cast<unsigned>(seed));
  auto add = [&](testing::CaseSpec s) {
    if (varlen) {
      s.varlen_seqlens_q = random_lengths(s.batch, s.seqlen_q, rng);
      s.varlen_seqlens_k = s.seqlen_q == s.seqlen_k ? s.varlen_seqlens_q : random_lengths(s.batch, s.seqlen_k, rng);
    }
    o.problems.push_back(BenchProblem{s, deterministic});
  };
  if (!sweep) {
    add(spec);
    return o;
  }
  for (int head_dim : sweep_head_dims) {
    for (bool causal : {false, true}) {
      for (int seqlen : kSweepSeqlens) {
        testing::CaseSpec s = spec;
        s.head_dim = head_dim;
        s.heads = s.heads_kv = kSweepHidden / head_dim;
        s.seqlen_q = s.seqlen_k = seqlen;
        s.batch = kSweepTokens / seqlen;
        s.causal = causal;
        s.window_left = s.window_right = -1;
        add(s);
      }
    }
  }
  return o;
}

}  // namespace hopattn::bench
