// dcp: the command line. Subcommands: demo, inspect, verify (and bench,
// launch as they land). Run `dcp --help` or `dcp SUBCOMMAND --help`.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "tools/commands.h"
#include "tools/convert.h"
#include "tools/launch.h"

namespace {

// Levenshtein distance between `a` and `b` (short words).
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dcp: a GPU-aware distributed checkpoint engine"};
  app.require_subcommand(1);

  dcp::DemoFlags demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo",
      "Save and load a synthetic model state, verify every byte, "
      "print throughput");
  demo_cmd->add_option("--size", demo.size,
                       "Approximate state size (e.g. 1GiB, 256MiB, 4G; at "
                       "most this machine's memory per rank, half that to "
                       "load). Default: 1GiB, or with --mode load the "
                       "checkpoint's");
  demo_cmd->add_option("--dir", demo.dir,
                       "Checkpoint directory (default: a temporary one, "
                       "removed afterwards)");
  demo_cmd->add_option("--seed", demo.seed,
                       "Seed of the synthetic values (0 to 2^64 - 1)");
  demo_cmd->add_option("--mode", demo.mode, "roundtrip | save | load")
      ->check(CLI::IsMember({"roundtrip", "save", "load"}));
  demo_cmd->add_flag("--json", demo.json, "Print one JSON object");
  demo_cmd
      ->add_option("--compression", demo.compression,
                   "none | zstd | zstd:LEVEL (stream extension of the "
                   "saved tensors)")
      ->capture_default_str();
  demo_cmd->add_flag("!--warm-load", demo.cold_load,
                     "Load from the page cache instead of dropping the "
                     "checkpoint's pages first");

  std::string inspect_dir;
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect",
                         "List the keys, dtypes, shapes, chunks and files of a "
                         "checkpoint");
  inspect_cmd->add_option("dir", inspect_dir, "Checkpoint directory")
      ->required();

  std::string verify_dir;
  CLI::App* verify_cmd =
      app.add_subcommand("verify",
                         "Check every checksum of a checkpoint; exits non-zero "
                         "naming what is wrong");
  verify_cmd->add_option("dir", verify_dir, "Checkpoint directory")->required();
  bool verify_clean = false;
  verify_cmd->add_flag(
      "--clean", verify_clean,
      "First remove the files of interrupted saves (under the directory's "
      "lock: fails while a save runs) and print the bytes reclaimed");

  std::string convert_src, convert_dst, convert_to, convert_shard,
      convert_dtype, convert_prefix;
  int convert_threads = 4;
  CLI::App* convert_cmd = app.add_subcommand(
      "convert",
      "Convert a dcp checkpoint to a Hugging Face directory (safetensors "
      "files and an index) or back");
  convert_cmd->add_option("src", convert_src, "Source checkpoint")->required();
  convert_cmd
      ->add_option("dst", convert_dst, "Destination directory (new or empty)")
      ->required();
  convert_cmd->add_option("--to", convert_to, "safetensors | dcp")->required();
  convert_cmd->add_option("--max-shard-size", convert_shard,
                          "Largest safetensors file (default 5GB)");
  convert_cmd->add_option("--dtype", convert_dtype,
                          "Convert floating tensors: bf16 | f16 | f32");
  convert_cmd->add_option(
      "--prefix", convert_prefix,
      "To safetensors: only tensors named PREFIX.*, written without "
      "\"PREFIX.\" (e.g. --prefix model: the model's weights alone)");
  convert_cmd->add_option("--threads", convert_threads,
                          "Reader and writer threads (default 4)");

  std::string bench_kind;
  std::vector<std::string> bench_args;
  CLI::App* bench_cmd =
      app.add_subcommand("bench", "Run a benchmark program: " +
                                      absl::StrJoin(dcp::BenchKinds(), ", "));
  bench_cmd->add_option("kind", bench_kind, "Which benchmark")->required();
  bench_cmd->add_option("args", bench_args, "Its arguments (after --)");
  bench_cmd->prefix_command();

  dcp::tools::LaunchOptions launch;
  CLI::App* launch_cmd =
      app.add_subcommand("launch", dcp::tools::kLaunchDescription);
  dcp::tools::AddLaunchOptions(*launch_cmd, &launch);

  // `dcp bench KIND ARGS...`: ARGS go to the benchmark untouched and in
  // order (CLI11 would take the values among them for "args"); a `--` before
  // them is optional.
  if (argc >= 3 && std::string(argv[1]) == "bench" && argv[2][0] != '-') {
    std::vector<std::string> args(argv + 3, argv + argc);
    if (!args.empty() && args.front() == "--") args.erase(args.begin());
    absl::Status status = dcp::RunBench(argv[2], args);
    std::fprintf(stderr, "dcp: %s\n", status.ToString().c_str());
    return 1;
  }

  // A first word that names no subcommand: say which word, and the nearest
  // subcommand, rather than CLI11's "A subcommand is required".
  if (argc >= 2 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      names.push_back(sub->get_name());
    }
    const std::string word = argv[1];
    if (std::find(names.begin(), names.end(), word) == names.end()) {
      std::string nearest;
      size_t best = 3;  // at most two edits away
      for (const std::string& name : names) {
        const size_t d = EditDistance(word, name);
        if (d < best) best = d, nearest = name;
      }
      std::fprintf(
          stderr, "dcp: unknown command \"%s\"%s; commands: %s (dcp --help)\n",
          word.c_str(),
          nearest.empty() ? ""
                          : (" (did you mean \"" + nearest + "\"?)").c_str(),
          absl::StrJoin(names, ", ").c_str());
      return 2;
    }
  }

  CLI11_PARSE(app, argc, argv);

  if (*launch_cmd) {
    absl::StatusOr<int> code = dcp::tools::Launch(launch);
    if (!code.ok()) {
      std::fprintf(stderr, "dcp launch: %s\n",
                   code.status().ToString().c_str());
      return 2;
    }
    return *code;
  }

  absl::Status status;
  if (*demo_cmd) {
    status = dcp::RunDemo(demo);
  } else if (*inspect_cmd) {
    status = dcp::RunInspect(inspect_dir);
  } else if (*verify_cmd) {
    if (verify_clean) status = dcp::RunClean(verify_dir);
    if (status.ok()) status = dcp::RunVerify(verify_dir);
  } else if (*convert_cmd) {
    absl::StatusOr<dcp::ConvertOptions> options =
        dcp::ParseConvertFlags(convert_to, convert_shard, convert_dtype,
                               convert_threads, convert_prefix);
    status = options.ok() ? dcp::RunConvert(convert_src, convert_dst, *options)
                          : options.status();
  } else if (*bench_cmd) {
    for (const std::string& extra : bench_cmd->remaining()) {
      bench_args.push_back(extra);
    }
    status = dcp::RunBench(bench_kind, bench_args);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "dcp: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
