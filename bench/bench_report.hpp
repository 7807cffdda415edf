// Results of hopattn-bench: one console line per timing, and the JSON every results tool reads.
#pragma once

#include <string>
#include <vector>

#include "bench_options.hpp"

namespace hopattn::bench {

struct ResultRow {
  std::string impl = "hopattn";
  std::string direction;  // "fwd" or "bwd"
  BenchProblem problem;
  double ms = 0;
  double tflops = 0;
  std::string check;  // "pass", "FAIL: ...", or "skipped"
};

struct Environment {
  std::string date, gpu, driver, cuda, commit, command;
};

Environment read_environment(const std::string& command);

void print_header();
void print_row(const ResultRow& row);

// Writes {"env": {...}, "rows": [...]} to `path` ("-": stdout).
void write_json(const std::string& path, const Environment& env, const std::vector<ResultRow>& rows);

}  // namespace hopattn::bench
