// Command-line options of hopattn-bench and the list of problems they describe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "testing/attention_case.hpp"

namespace hopattn::bench {

struct BenchProblem {
  testing::CaseSpec spec;
  bool deterministic = false;
};

struct BenchOptions {
  std::vector<BenchProblem> problems;
  bool run_forward = true;
  bool run_backward = true;
  bool check = true;
  bool forward_workspace = true;  // pass forward() the workspace it asks for
  int warmup = 3;
  int repetitions = 20;
  std::string json_path;  // empty: no JSON; "-": stdout
  std::string command;    // the command line, recorded in the results
  bool help = false;
};

// Parses argv; throws std::invalid_argument with a message naming the bad flag.
BenchOptions parse_options(int argc, char** argv);

const char* usage();

}  // namespace hopattn::bench
