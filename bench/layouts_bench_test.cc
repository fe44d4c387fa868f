// Smoke test of `dcp bench layouts`: runs layouts_bench --quick (dcp only,
// one repetition) on a temporary directory and checks that the JSON report
// has every field, that every load verified, that the layouts have the
// shapes the file comment of layouts_bench.cc promises, and that no
// checkpoint is left behind. No timing asserts.
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "bench/bench_env.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dcp {
namespace {

using json = nlohmann::json;

std::string Program() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir != nullptr ? srcdir : ".") + "/" +
         (workspace != nullptr ? workspace : "dcp") + "/bench/layouts_bench";
}

void ExpectFields(const json& object, const std::set<std::string>& fields,
                  const std::string& where) {
  for (const std::string& f : fields) {
    EXPECT_TRUE(object.contains(f)) << where << " lacks \"" << f << "\"";
  }
}

TEST(LayoutsBenchTest, QuickRunReportsEveryField) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      std::string(tmp != nullptr ? tmp : "/tmp") + "/layouts-bench-test";
  std::filesystem::create_directories(dir);
  ProcessRun run;
  absl::StatusOr<json> report = RunJsonProcess(
      {Program(), "--quick", "--reps", "1", "--json", "--dir", dir}, &run);
  ASSERT_TRUE(report.ok()) << report.status();

  ExpectFields(*report,
               {"started", "finished", "dir", "reps", "seed", "quick", "torch",
                "sizes", "machine", "load_average_start", "load_average_end",
                "layouts", "targets", "rows"},
               "the report");
  EXPECT_EQ(report->at("reps"), 1);
  EXPECT_EQ(report->at("quick"), true);
  ExpectFields(report->at("sizes"), {"llama_bytes", "moe_bytes", "tiny_count"},
               "sizes");

  std::set<std::string> names;
  for (const json& l : report->at("layouts")) {
    const std::string name = l.at("layout");
    names.insert(name);
    ExpectFields(l,
                 {"tensors", "bytes", "smallest_tensor_bytes",
                  "largest_tensor_bytes", "dims", "dcp"},
                 name);
    EXPECT_FALSE(l.contains("torch")) << name;  // No --torch.
    for (const char* phase : {"save", "load"}) {
      ASSERT_TRUE(l.at("dcp").contains(phase)) << name << " " << phase;
      ExpectFields(
          l.at("dcp").at(phase),
          {"median_seconds", "all_seconds", "median_gbps", "median_items_per_s",
           "median_peak_rss_bytes", "max_peak_rss_bytes",
           "median_rss_before_io_bytes", "median_cpu_seconds"},
          name + " dcp " + phase);
      EXPECT_EQ(l.at("dcp").at(phase).at("all_seconds").size(), 1u);
    }
    if (name == "llama") {
      EXPECT_EQ(l.at("smallest_tensor_bytes"), 4);  // AdamW's 0-d step.
      EXPECT_GE(l.at("tensors").get<int>(), 100);
    }
    if (name == "tiny") {
      EXPECT_EQ(l.at("tensors"), 2000);
      EXPECT_LE(l.at("largest_tensor_bytes").get<int>(), 4096);
      EXPECT_EQ(l.at("smallest_tensor_bytes"), 4);
    }
    if (name == "tiny_one_tensor") {
      EXPECT_EQ(l.at("tensors"), 1);
    }
  }
  EXPECT_EQ(names,
            (std::set<std::string>{"llama", "moe", "tiny", "tiny_one_tensor"}));

  // The tiny target (and its load counterpart), one value per repetition.
  ASSERT_EQ(report->at("targets").size(), 2u);
  for (const json& t : report->at("targets")) {
    ExpectFields(t,
                 {"target", "unit", "values", "met_each", "met_in", "of", "met",
                  "bounds", "layout", "phase", "issue_target"},
                 "a target");
    EXPECT_EQ(t.at("values").size(), 1u);
    EXPECT_EQ(t.at("bounds").size(), 1u);
  }

  int measured = 0;
  for (const json& r : report->at("rows")) {
    if (!r.contains("engine")) continue;
    ++measured;
    ExpectFields(
        r,
        {"engine", "layout", "phase", "rep", "tensors", "bytes", "seconds",
         "gbps", "items_per_s", "peak_rss_bytes", "rss_before_io_bytes",
         "process_peak_rss_bytes", "user_seconds", "system_seconds",
         "cpu_seconds", "minor_faults", "major_faults", "verified"},
        "a row");
    EXPECT_EQ(r.at("verified"), true) << r.dump();
  }
  EXPECT_EQ(measured, 8);  // 4 layouts x (save, load).

  // The work directory is gone: nothing left behind.
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

TEST(LayoutsBenchTest, UnknownLayoutFails) {
  absl::StatusOr<ProcessRun> run =
      RunProcess({Program(), "--quick", "--layouts", "gpt5", "--dir", "/tmp"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_NE(run->exit_code, 0);
}

}  // namespace
}  // namespace dcp
