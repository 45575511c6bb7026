// SPDX-License-Identifier: Apache-2.0
// Command line of `cumemguard report`: options, reading the logs, choosing the output, exit status.
#include "report.h"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "report_model.h"

namespace cmg {
namespace {

constexpr const char *kUsage =
    "usage: cumemguard report [--json] [--trace OUT.json] [--no-symbolize] [--top N]\n"
    "                         [--fail-on-leaks] [--slow-us N] LOG...\n"
    "\n"
    "Reads cumemguard event logs (one per process or rank) and prints findings grouped by class\n"
    "and stack, leaks by allocation stack, bytes per device and memory kind, top allocation "
    "sites,\n"
    "calls per API and NCCL communicator lifecycles.\n"
    "\n"
    "  --json            one JSON document instead of text (docs/report-schema.md)\n"
    "  --trace OUT.json  also write a Chrome trace-event file for Perfetto / chrome://tracing\n"
    "  --no-symbolize    print frames as module+offset without reading the modules\n"
    "  --top N           rows of ranked lists: allocation sites, leak stacks (default 10, 0 = "
    "all)\n"
    "  --fail-on-leaks   leaks at exit make the exit status 1, like other findings\n"
    "  --slow-us N       calls of at least N microseconds become slices in the trace (default "
    "1000)\n"
    "\n"
    "Exit status: 0 no findings, 1 findings, 2 usage error or a log that cannot be read,\n"
    "3 a log written in a newer format; the highest that applies wins.\n";

bool parse_count(std::string_view s, std::int64_t &out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= 0;
}

// One line, as for the other commands; the whole usage is one --help away.
int usage_error(const std::string &msg) {
  std::cerr << "cumemguard report: " << msg << " (see cumemguard report --help)\n";
  return 2;
}

}  // namespace

int report_main(int argc, char **argv) {
  using namespace report;
  ReportOptions opt;
  std::vector<std::string> files;
  bool options_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
    if (options_done || a.empty() || a[0] != '-' || a == "-") {  // "-": the log on stdin
      files.emplace_back(a);
    } else if (a == "--") {
      options_done = true;
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--json") {
      opt.json = true;
    } else if (a == "--no-symbolize") {
      opt.symbolize = false;
    } else if (a == "--fail-on-leaks") {
      opt.fail_on_leaks = true;
    } else if (a == "--trace") {
      const char *v = value();
      if (!v || !*v) return usage_error("--trace needs an output file");
      opt.trace_path = v;
    } else if (a == "--top") {
      const char *v = value();
      std::int64_t n = 0;
      if (!v || !parse_count(v, n)) return usage_error("--top needs a number (0 = all)");
      opt.top = static_cast<std::size_t>(n);
    } else if (a == "--slow-us") {
      const char *v = value();
      std::int64_t n = 0;
      if (!v || !parse_count(v, n) || n > INT64_MAX / 1000)
        return usage_error("--slow-us needs a number of microseconds");
      opt.slow_ns = n * 1000;
    } else {
      return usage_error("unknown option " + std::string(a));
    }
  }
  if (files.empty()) return usage_error("no log given");

  try {
    // Every log is read even when one fails: in a multi-rank run the ranks that did write a log
    // still explain the crash. The failures are named on stderr and raise the exit status.
    std::vector<Log> logs;
    std::vector<LogError> errors;
    for (const auto &f : files) {
      ReadResult r = f == "-" ? read_log(std::cin, "<stdin>") : read_log_file(f);
      if (r.status == ReadStatus::Ok) {
        logs.push_back(std::move(r.log));
        continue;
      }
      const int status = r.status == ReadStatus::NewerFormat ? 3 : 2;
      std::cerr << "cumemguard report: " << f << ": " << r.error << "\n";
      errors.push_back({f, r.error, status});
    }
    if (logs.empty()) {
      int status = 0;
      for (const auto &e : errors) status = std::max(status, e.exit_status);
      return status;
    }

    Model m = build_model(std::move(logs), std::move(errors), opt);
    if (!opt.trace_path.empty()) {
      std::ofstream out(opt.trace_path, std::ios::binary | std::ios::trunc);
      if (out)
        out << trace_json(m, opt).dump(-1, ' ', false, Json::error_handler_t::replace) << '\n';
      if (!out) {
        std::cerr << "cumemguard report: " << opt.trace_path
                  << ": cannot write the trace: " << std::strerror(errno) << "\n";
        m.errors.push_back({opt.trace_path, "cannot write the trace", 2});
      } else {
        out.close();
        std::cerr << "cumemguard report: trace written to " << opt.trace_path
                  << " (open it in ui.perfetto.dev or chrome://tracing)\n";
      }
    }
    if (opt.json)
      std::cout << report_json(m, opt).dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
    else
      write_text(m, opt, std::cout);
    std::cout.flush();
    return m.exit_status(opt);
  } catch (const std::exception &e) {
    std::cerr << "cumemguard report: internal error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace cmg
