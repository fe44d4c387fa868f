// `dcp bench io`'s report: a size's summary of what the parent measured
// (medians per fio job and dcp configuration, the ratios to fio and torch
// per repetition, issue 4's checks) and the table printed from it.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_env.h"
#include "bench/io_bench.h"

namespace dcp::io_bench {
namespace {

// Issue 4's bars.
constexpr double kFioBar = 0.9;
constexpr double kTorchBar = 2.0;
constexpr int64_t kRssAllowance = int64_t{256} << 20;

}  // namespace

json Bench::Summarize(const std::string& size_text, int64_t size) {
  auto rows = [&](const std::string& measurement) {
    std::vector<const json*> out;
    for (const json& r : rows_) {
      if (r.at("measurement") == measurement) out.push_back(&r);
    }
    return out;
  };
  // fio: GB/s per job and repetition.
  std::map<std::string, std::map<int, double>> fio;
  for (const json* r : rows("fio")) {
    fio[r->at("job").get<std::string>()][r->at("rep").get<int>()] =
        r->at("gbps").get<double>();
  }
  json s = {{"size", size_text},
            {"fio_bytes", size},
            {"repetitions", flags_.repeat},
            {"load_averages", json::array()}};
  for (const json* r : rows("load_average")) {
    s["load_averages"].push_back(r->at("value"));
  }
  for (const auto& [job, by_rep] : fio) {
    std::vector<double> all;
    for (const auto& [rep, v] : by_rep) all.push_back(v);
    s["fio"][job] = {{"median_gbps", Median(all)}, {"all_gbps", all}};
  }
  bool all_pass = true;
  json checks = json::array();
  auto check = [&](const std::string& what, double value, double bar,
                   bool at_most = false) {
    const bool pass = at_most ? value <= bar : value >= bar;
    all_pass = all_pass && pass;
    checks.push_back(
        {{"check", what}, {"value", value}, {"bar", bar}, {"pass", pass}});
  };
  // dcp: per configuration and phase.
  std::map<std::string, std::map<int, double>> dcp_default;  // phase -> rep.
  for (const DcpConfig& c : configs_) {
    json config = {{"config", c.name}, {"default", IsDefault(c)}};
    for (const std::string phase : {"save", "load"}) {
      const FioJob* ref = nullptr;
      const FioJob* context = nullptr;
      for (const FioJob& job : FioJobs()) {
        if (job.write == (phase == "save") &&
            job.mode == (c.direct ? "direct" : "buffered")) {
          (job.context.empty() ? ref : context) = &job;
        }
      }
      std::vector<double> gbps, ratios, context_ratios, rss, over;
      std::string engine;
      for (const json* r : rows("dcp")) {
        if (r->at("config") != c.name || r->at("phase") != phase) continue;
        const int rep = r->at("rep").get<int>();
        const double v = r->at("gbps").get<double>();
        gbps.push_back(v);
        ratios.push_back(v / fio[ref->name][rep]);
        if (context != nullptr && fio[context->name].count(rep) > 0) {
          context_ratios.push_back(v / fio[context->name][rep]);
        }
        rss.push_back(r->at("peak_rss_bytes").get<double>());
        over.push_back(r->at("rss_over_state_bytes").get<double>());
        engine = r->at("engine").get<std::string>();
        if (IsDefault(c)) dcp_default[phase][rep] = v;
      }
      if (gbps.empty()) continue;
      const double max_over = *std::max_element(over.begin(), over.end());
      config["engine"] = engine;
      config[phase] = {{"median_gbps", Median(gbps)},
                       {"all_gbps", gbps},
                       {"fio_reference", ref->name},
                       {"vs_fio_median", Median(ratios)},
                       {"vs_fio_all", ratios},
                       {"peak_rss_bytes_median", Median(rss)},
                       {"rss_over_state_bytes_max", max_over}};
      if (!context_ratios.empty()) {
        const std::string& key = context->context;
        config[phase]["fio_" + key + "_reference"] = context->name;
        config[phase]["fio_" + key + "_note"] = context->context_note;
        config[phase]["vs_fio_" + key + "_median"] = Median(context_ratios);
        config[phase]["vs_fio_" + key + "_all"] = context_ratios;
      }
      check(absl::StrCat(c.name, " ", phase, " / fio ", ref->name),
            Median(ratios), kFioBar);
      check(absl::StrCat(c.name, " ", phase, " peak RSS over the state"),
            max_over, static_cast<double>(kRssAllowance), /*at_most=*/true);
    }
    s["dcp"].push_back(config);
  }
  std::vector<const json*> torch = rows("torch");
  if (!torch.empty()) {
    json t = {{"version", torch_version_}};
    for (const std::string phase : {"save", "load"}) {
      std::vector<double> gbps, ratios, rss;
      for (const json* r : torch) {
        const double v = r->at(phase + "_gbps").get<double>();
        gbps.push_back(v);
        rss.push_back(r->at(phase + "_peak_rss_bytes").get<double>());
        auto d = dcp_default[phase].find(r->at("rep").get<int>());
        if (d != dcp_default[phase].end()) ratios.push_back(d->second / v);
      }
      t[phase] = {{"median_gbps", Median(gbps)},
                  {"all_gbps", gbps},
                  {"peak_rss_bytes_median", Median(rss)},
                  {"dcp_default_vs_torch_median", Median(ratios)},
                  {"dcp_default_vs_torch_all", ratios}};
      if (!ratios.empty()) {
        check(absl::StrCat("default ", phase, " / torch"), Median(ratios),
              kTorchBar);
      }
    }
    t["save_rss_before_bytes_median"] = Median([&] {
      std::vector<double> v;
      for (const json* r : torch) {
        v.push_back(r->at("save_rss_before_bytes").get<double>());
      }
      return v;
    }());
    s["torch"] = t;
    for (const json* r : rows("identity")) s["identity"] = *r;
  }
  // Warm loads (page cache hot): the software path alone, no bar.
  std::map<int, double> torch_warm;  // rep -> GB/s.
  for (const json* r : torch) {
    if (r->contains("load_warm_gbps")) {
      torch_warm[r->at("rep").get<int>()] =
          r->at("load_warm_gbps").get<double>();
    }
  }
  json warm = json::array();
  for (const DcpConfig& c : configs_) {
    std::vector<double> gbps, ratios;
    for (const json* r : rows("dcp")) {
      if (r->at("config") != c.name || r->at("phase") != "load-warm") continue;
      gbps.push_back(r->at("gbps").get<double>());
      auto t = torch_warm.find(r->at("rep").get<int>());
      if (t != torch_warm.end()) ratios.push_back(gbps.back() / t->second);
    }
    if (gbps.empty()) continue;
    json w = {
        {"config", c.name}, {"median_gbps", Median(gbps)}, {"all_gbps", gbps}};
    if (!ratios.empty()) {
      w["vs_torch_warm_median"] = Median(ratios);
      w["vs_torch_warm_all"] = ratios;
    }
    warm.push_back(w);
  }
  if (!warm.empty() || !torch_warm.empty()) {
    std::vector<double> all;
    for (const auto& [rep, v] : torch_warm) all.push_back(v);
    s["warm_load"] = {{"dcp", warm}};
    if (!all.empty()) {
      s["warm_load"]["torch"] = {{"median_gbps", Median(all)},
                                 {"all_gbps", all}};
    }
  }
  for (const json* r : rows("dcp")) {
    s["state_bytes"] = r->at("bytes");
    break;
  }
  s["checks"] = checks;
  s["all_checks_pass"] = all_pass;
  return s;
}

void PrintTable(std::FILE* out, const json& s) {
  const double state = s.value("state_bytes", 0.0);
  std::fprintf(
      out,
      "\n%s: %.0f bytes of tensors, median of %d repetitions (load "
      "average at their start: %s)\n",
      s.at("size").get<std::string>().c_str(), state,
      s.at("repetitions").get<int>(),
      absl::StrJoin(s.at("load_averages").get<std::vector<std::string>>(), "; ")
          .c_str());
  std::fprintf(out, "  %-34s %9s   %s\n", "fio (bs 1M)", "GB/s", "all");
  for (const auto& [job, v] : s.at("fio").items()) {
    std::vector<std::string> all;
    for (double x : v.at("all_gbps")) all.push_back(absl::StrFormat("%.3f", x));
    std::fprintf(out, "  %-34s %9.3f   %s\n", job.c_str(),
                 v.at("median_gbps").get<double>(),
                 absl::StrJoin(all, " ").c_str());
  }
  std::fprintf(out, "  %-22s %9s %8s %9s %8s %12s %12s\n", "dcp", "save GB/s",
               "x fio", "load GB/s", "x fio", "save RSS+", "load RSS+");
  for (const json& c : s.at("dcp")) {
    auto field = [&](const char* phase, const char* key) {
      return c.contains(phase) ? c.at(phase).at(key).get<double>() : 0.0;
    };
    std::fprintf(out, "  %-22s %9.3f %8.2f %9.3f %8.2f %8.0f MiB %8.0f MiB\n",
                 (c.at("config").get<std::string>() +
                  (c.at("default").get<bool>() ? " (default)" : ""))
                     .c_str(),
                 field("save", "median_gbps"), field("save", "vs_fio_median"),
                 field("load", "median_gbps"), field("load", "vs_fio_median"),
                 field("save", "rss_over_state_bytes_max") / kMiB,
                 field("load", "rss_over_state_bytes_max") / kMiB);
  }
  std::fprintf(out,
               "  (x fio: per-repetition ratio to fio's job of the same mode, "
               "median; RSS+: the most peak RSS above the state's size)\n");
  for (const json& c : s.at("dcp")) {
    for (const char* phase : {"save", "load"}) {
      for (const FioJob& job : FioJobs()) {
        const std::string key = "vs_fio_" + job.context + "_median";
        if (job.context.empty() || !c.contains(phase) ||
            !c.at(phase).contains(key)) {
          continue;
        }
        std::fprintf(out, "  %s %s / fio %s (%s; no bar): %.2fx\n",
                     c.at("config").get<std::string>().c_str(), phase,
                     job.name.c_str(), job.context_note.c_str(),
                     c.at(phase).at(key).get<double>());
      }
    }
  }
  if (s.contains("torch")) {
    const json& t = s.at("torch");
    std::fprintf(out,
                 "  torch %s: save %.3f GB/s (dcp default %.2fx), load %.3f "
                 "GB/s (dcp default %.2fx); peak RSS save %.0f MiB, load %.0f "
                 "MiB\n",
                 t.at("version").get<std::string>().c_str(),
                 t.at("save").at("median_gbps").get<double>(),
                 t.at("save").at("dcp_default_vs_torch_median").get<double>(),
                 t.at("load").at("median_gbps").get<double>(),
                 t.at("load").at("dcp_default_vs_torch_median").get<double>(),
                 t.at("save").at("peak_rss_bytes_median").get<double>() / kMiB,
                 t.at("load").at("peak_rss_bytes_median").get<double>() / kMiB);
  }
  if (s.contains("warm_load")) {
    const json& w = s.at("warm_load");
    std::vector<std::string> parts;
    if (w.contains("torch")) {
      parts.push_back(absl::StrFormat(
          "torch %.3f GB/s", w.at("torch").at("median_gbps").get<double>()));
    }
    for (const json& c : w.at("dcp")) {
      std::string part =
          absl::StrFormat("dcp %s %.3f GB/s", c.at("config").get<std::string>(),
                          c.at("median_gbps").get<double>());
      if (c.contains("vs_torch_warm_median")) {
        absl::StrAppendFormat(&part, " (%.2fx torch)",
                              c.at("vs_torch_warm_median").get<double>());
      }
      parts.push_back(part);
    }
    std::fprintf(out,
                 "  warm load (page cache hot: the software path alone, no "
                 "bar): %s\n",
                 absl::StrJoin(parts, ", ").c_str());
  }
  for (const json& c : s.at("checks")) {
    const std::string what = c.at("check");
    const bool rss = what.find("RSS") != std::string::npos;
    const double scale = rss ? kMiB : 1;
    std::fprintf(out, "  %s %s: %.2f%s (bar %s %.2f%s)\n",
                 c.at("pass").get<bool>() ? "PASS" : "FAIL", what.c_str(),
                 c.at("value").get<double>() / scale, rss ? " MiB" : "x",
                 rss ? "<=" : ">=", c.at("bar").get<double>() / scale,
                 rss ? " MiB" : "x");
  }
}

}  // namespace dcp::io_bench
