// SPDX-License-Identifier: Apache-2.0
// Command line of `cumemguard report`: options, opening the logs, choosing the outputs, exit status.
#include "report.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "cli.h"
#include "cmg_config.h"
#include "log_files.h"
#include "process_alive.h"
#include "report_model.h"

namespace cmg {
namespace {

bool parse_count(std::string_view s, std::int64_t &out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= 0;
}

// One line, as for the other commands; the whole usage is one --help away.
int usage_error(const std::string &msg) {
  std::cerr << "cumemguard report: " << report::clean(msg) << " (see cumemguard report --help)\n";
  return report::kExitUsage;
}

// The first line of an existing regular file (up to 64 KiB), without blocking on a FIFO.
std::optional<std::string> first_line(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  std::optional<std::string> out;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    std::string buf(65536, '\0');
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n > 0) {
      buf.resize(static_cast<std::size_t>(n));
      out = buf.substr(0, buf.find('\n'));
    }
  }
  ::close(fd);
  return out;
}

bool is_log(const std::string &path) {
  auto line = first_line(path);
  return line && report::is_log_header(*line);
}

// `cumemguard report --trace cumemguard.*.log`: the glob fills the output slot with a log, and
// writing the trace there would destroy it. An output that cannot be written: 73.
bool refuse_over_log(const std::string &path, const char *what) {
  if (path == "-" || !is_log(path)) return false;
  std::cerr << "cumemguard report: will not write the " << what << " to " << report::clean(path)
            << ": it is a cumemguard event log (did a glob fill the output slot? name the "
               "output file first)\n";
  return true;
}

// The CUMEMGUARD_RUN_ID its header names (`cumemguard run` sets one per launch), or "".
std::string run_of(const report::Header &h) {
  for (const auto &[k, v] : h.options)
    if (k == "CUMEMGUARD_RUN_ID") return v;
  return {};
}

// Logs of more than one run merged would read as one program's: refused unless --run picks one
// or says all. Logs with no run id (a plain LD_PRELOAD, ranks under torchrun) belong to none and
// are read with the rest. Returns the exit status of the refusal, or 0 to go on.
int pick_run(std::vector<std::unique_ptr<report::LogReader>> &readers,
             const std::optional<std::string> &run) {
  if (run == "all") return 0;
  std::vector<std::pair<std::string, std::vector<std::string>>> runs;  // in order of the logs
  for (const auto &r : readers) {
    const std::string id = run_of(r->log().header);
    if (id.empty()) continue;
    auto it = std::find_if(runs.begin(), runs.end(), [&](const auto &x) { return x.first == id; });
    if (it == runs.end()) it = runs.insert(runs.end(), {id, {}});
    it->second.push_back(r->log().file);
  }
  auto listed = [&]() {
    std::vector<std::string> parts;
    for (const auto &[id, files] : runs) {
      std::string names;
      for (std::size_t i = 0; i < files.size() && i < 3; ++i) names += (i ? ", " : "") + files[i];
      if (files.size() > 3) names += fmt::format(" and {} more", files.size() - 3);
      parts.push_back(fmt::format("{} ({})", report::clean(id), names));
    }
    std::string out;
    for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
    return out;
  };
  if (!run) {
    if (runs.size() < 2) return 0;
    std::cerr << fmt::format(
        "cumemguard report: the logs are of {} runs, not one: {}; report one with --run ID (or "
        "name its logs only), or all together with --run all\n",
        runs.size(), listed());
    return report::kExitUsage;
  }
  // A run's id or its start, as git takes a commit's: "21948" for "21948-1796657738925562616",
  // when one run's id starts so; two that do are named rather than guessed between.
  std::string id = *run;
  if (std::none_of(runs.begin(), runs.end(), [&](const auto &x) { return x.first == id; })) {
    std::vector<std::string> starts;
    for (const auto &x : runs)
      if (!id.empty() && x.first.starts_with(id)) starts.push_back(x.first);
    if (starts.size() > 1) {
      std::string names;
      for (const std::string &n : starts) names += (names.empty() ? "" : ", ") + report::clean(n);
      std::cerr << fmt::format("cumemguard report: --run {} names {} runs: {}; give more of the id\n",
                               report::clean(id), starts.size(), names);
      return report::kExitUsage;
    }
    if (starts.size() == 1) id = starts.front();
  }
  const std::size_t before = readers.size();
  std::erase_if(readers, [&](const auto &r) { return run_of(r->log().header) != id; });
  if (readers.empty()) {
    std::cerr << fmt::format("cumemguard report: no log of run {} among the logs (runs: {})\n",
                             report::clean(*run), runs.empty() ? "none named" : listed());
    return report::kExitUsage;
  }
  if (readers.size() < before)
    std::cerr << fmt::format(
        "cumemguard report: --run {}: {} of other runs (or of none) left out\n",
        report::clean(id),
        before - readers.size() == 1 ? std::string("1 log")
                                     : fmt::format("{} logs", before - readers.size()));
  return 0;
}

// Whether two output names are one file: the same device and inode when both exist (a link or
// another spelling of the path), else the same absolute path once `.`, `..` and the links of the
// part that exists are resolved. A device both name (/dev/null) is no file one output replaces.
bool same_file(const std::string &a, const std::string &b) {
  struct stat sa {};
  struct stat sb {};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  namespace fs = std::filesystem;
  std::error_code ec1, ec2;
  const fs::path pa = fs::weakly_canonical(fs::absolute(a, ec1), ec1);
  const fs::path pb = fs::weakly_canonical(fs::absolute(b, ec2), ec2);
  return ec1 || ec2 ? fs::path(a).lexically_normal() == fs::path(b).lexically_normal() : pa == pb;
}

// `-o same.out --html same.out`: the second output truncated the first's file and the last one
// written won, while both were said to be written. Refused before anything is: one line, 64.
int same_output_refusal(const report::ReportOptions &opt, const std::string &output_flag) {
  const std::tuple<std::string, const std::string *> outs[] = {
      {output_flag, &opt.output_path}, {"--html", &opt.html_path}, {"--trace", &opt.trace_path}};
  for (std::size_t i = 0; i < std::size(outs); ++i)
    for (std::size_t j = i + 1; j < std::size(outs); ++j) {
      const auto &[na, pa] = outs[i];
      const auto &[nb, pb] = outs[j];
      if (pa->empty() || pb->empty() || *pa == "-" || *pb == "-" || !same_file(*pa, *pb))
        continue;  // "-" twice is refused above, as standard output
      const std::string both = *pa == *pb ? *pa : fmt::format("{} and {}", *pa, *pb);
      return usage_error(fmt::format(
          "{} and {} name the same file ({}): give each output a file of its own", na, nb, both));
    }
  return 0;
}

}  // namespace

int report_main(int argc, char **argv) {
  using namespace report;
  ReportOptions opt;
  std::vector<std::string> files;
  std::optional<std::pair<std::string, std::string>> diff;
  std::optional<std::string> run;  // --run ID | all
  bool options_done = false;
  std::string output_flag = "-o";  // as the user spelled it, for the line that names it
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
    if (options_done || a.empty() || a[0] != '-' || a == "-") {  // "-": the log on stdin
      files.emplace_back(a);
    } else if (a == "--") {
      options_done = true;
    } else if (a == "--help" || a == "-h") {
      std::cout << tools::cli::help_text(tools::cli::command("report"));
      return 0;
    } else if (a == "--version") {
      std::cout << "cumemguard report " << CMG_VERSION << "\n";
      return 0;
    } else if (a == "--json") {
      opt.json = true;
    } else if (a == "--no-symbolize") {
      opt.symbolize = false;
    } else if (a == "--fail-on-leaks") {
      opt.fail_on_leaks = true;
    } else if (a == "--run") {
      const char *v = value();
      if (!v || !*v) return usage_error("--run needs a run id (or all)");
      run = v;
    } else if (a == "--full-stacks") {
      opt.full_stacks = true;
    } else if (a == "--gen-suppressions") {
      opt.gen_suppressions = true;
    } else if (a == "--diff") {
      const char *x = value();
      const char *y = value();
      if (!x || !y || !*x || !*y) return usage_error("--diff needs two snapshots: A B");
      diff = {x, y};
    } else if (a == "--trace" || a == "--html" || a == "-o" || a == "--output") {
      const char *v = value();
      if (!v || !*v) return usage_error(std::string(a) + " needs an output file");
      (a == "--trace" ? opt.trace_path : a == "--html" ? opt.html_path : opt.output_path) = v;
      if (a == "-o" || a == "--output") output_flag = a;
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
      return usage_error("unknown option '" + std::string(a) + "'" +
                         tools::cli::option_hint(tools::cli::command("report"), a));
    }
  }
  // "-" is standard output, as for any tool that writes a file (it wrote a file named "-"). One
  // output at most goes there: a page and a trace, or a page and the report, in one stream could
  // be read as neither.
  {
    std::vector<std::string> to_stdout;
    if (opt.output_path == "-") to_stdout.push_back("-o -");
    if (opt.html_path == "-") to_stdout.push_back("--html -");
    if (opt.trace_path == "-") to_stdout.push_back("--trace -");
    if (to_stdout.size() > 1)
      return usage_error(
          fmt::format("{} and {} both write to standard output; name a file for "
                      "one of them",
                      to_stdout[0], to_stdout[1]));
    if (!to_stdout.empty() && opt.output_path.empty() && (opt.json || opt.gen_suppressions))
      return usage_error(
          fmt::format("{} writes to standard output, where {} writes too; give "
                      "that a file with -o OUT",
                      to_stdout[0], opt.json ? "the JSON report" : "--gen-suppressions"));
  }
  if (const int rc = same_output_refusal(opt, output_flag)) return rc;
  if (diff) {
    if (!files.empty()) return usage_error("--diff compares two snapshots; it takes no other log");
    if (run) return usage_error("--diff names its snapshots' logs; it takes no --run");
    if (!opt.trace_path.empty() || opt.gen_suppressions)
      return usage_error("--diff writes text, --json or --html");
    if ((!opt.html_path.empty() && refuse_over_log(opt.html_path, "HTML page")) ||
        (!opt.output_path.empty() && refuse_over_log(opt.output_path, "diff")))
      return kExitCantCreate;
    try {
      return diff_main(diff->first, diff->second, opt);
    } catch (const std::exception &e) {
      std::cerr << "cumemguard report: internal error: " << e.what() << "\n";
      return kExitNoInput;
    }
  }
  if (opt.gen_suppressions && opt.json)
    return usage_error("--gen-suppressions prints rules, not a JSON report: give one of them");
  if (files.empty()) {
    // `report --trace k.log`: the log went to the output slot, which takes a file first.
    for (const auto &[name, path, out] : {std::tuple{"--trace", &opt.trace_path, "OUT.json"},
                                          std::tuple{"--html", &opt.html_path, "OUT.html"},
                                          std::tuple{"-o", &opt.output_path, "OUT"}})
      if (!path->empty() && is_log(*path))
        return usage_error(fmt::format(
            "no log given: {} takes an output file first, then the logs: cumemguard report {} "
            "{} LOG... ({} was taken as the output)",
            name, name, out, *path));
    return usage_error("no log given");
  }
  if ((!opt.trace_path.empty() && refuse_over_log(opt.trace_path, "trace")) ||
      (!opt.html_path.empty() && refuse_over_log(opt.html_path, "HTML page")) ||
      (!opt.output_path.empty() && refuse_over_log(opt.output_path, "report")))
    return kExitCantCreate;

  try {
    // Every log is read even when one fails: in a multi-rank run the ranks that did write a log
    // still explain the crash. The failures are named on stderr and raise the exit status.
    // Bounded whatever the number of logs: descriptors (log_files.h) and line buffers (a share
    // of kBufferBudget each). Declared before the readers: they give their descriptors back to it.
    FilePool pool(FilePool::default_limit());
    const std::size_t share = kBufferBudget / std::max<std::size_t>(files.size(), 1);
    std::vector<std::unique_ptr<LogReader>> readers;
    std::vector<LogError> errors;
    std::vector<std::string> duplicates;
    std::map<std::pair<dev_t, ino_t>, std::string> seen_files;
    std::map<std::tuple<std::string, std::int64_t, std::int64_t>, std::string> seen_procs;
    bool stdin_used = false;
    for (const auto &f : files) {
      const std::string shown = clean(f);
      std::unique_ptr<LogReader> r;
      if (f == "-") {
        if (stdin_used) continue;
        stdin_used = true;
        r = std::make_unique<LogReader>(fd_source(0, false), "<stdin>");
      } else {
        struct stat st {};
        if (::stat(f.c_str(), &st) == 0) {
          auto [it, fresh] = seen_files.try_emplace({st.st_dev, st.st_ino}, shown);
          if (!fresh) {
            duplicates.push_back(
                fmt::format("{}: the same file as {}; counted once", shown, it->second));
            std::cerr << "cumemguard report: " << duplicates.back() << "\n";
            continue;
          }
        }
        r = open_log_file(f, &pool);
      }
      r->set_buffer(share);
      if (!r->open()) {
        std::cerr << "cumemguard report: " << shown << ": " << r->error() << "\n";
        errors.push_back({shown, r->error(), kExitNoInput});
        continue;
      }
      // A copy of a log is the same process: counted once too.
      const Header &h = r->log().header;
      if (h.start_unix_ns != 0 && h.pid != 0) {
        auto [it, fresh] = seen_procs.try_emplace({h.host, h.pid, h.start_unix_ns}, shown);
        if (!fresh) {
          duplicates.push_back(fmt::format(
              "{}: the same log as {} (pid {}, same start); counted once", shown, it->second,
              h.pid));
          std::cerr << "cumemguard report: " << duplicates.back() << "\n";
          continue;
        }
      }
      if (f != "-") r->log().file = shown;
      r->log().running = still_running(h);
      readers.push_back(std::move(r));
    }
    if (const int refused = pick_run(readers, run)) return refused;
    if (readers.empty() && !opt.json) {
      int status = 0;
      for (const auto &e : errors) status = std::max(status, e.exit_status);
      return status;
    }

    int write_status = 0;
    auto cannot_write = [&](const std::string &path, const char *what) {
      std::cerr << "cumemguard report: " << clean(path) << ": cannot write the " << what << ": "
                << std::strerror(errno) << "\n";
      write_status = kExitCantCreate;
    };

    // Every output file asked for is opened before anything is printed: one that cannot be
    // written is said, with status 73, and no report goes to stdout in its place.
    // "-" (standard output) is no file to open: the stream is there already.
    const bool report_file = !opt.output_path.empty() && opt.output_path != "-";
    const bool html_stdout = opt.html_path == "-", trace_stdout = opt.trace_path == "-";
    std::ofstream html, file;
    if (report_file) {
      file.open(opt.output_path, std::ios::binary | std::ios::trunc);
      if (!file) cannot_write(opt.output_path, "report");
    }
    if (!opt.html_path.empty() && !html_stdout) {
      html.open(opt.html_path, std::ios::binary | std::ios::trunc);
      if (!html) cannot_write(opt.html_path, "HTML page");
    }
    std::unique_ptr<EventSink> trace;
    std::FILE *trace_file = nullptr;
    bool trace_failed = false;
    if (!opt.trace_path.empty() && !write_status) {
      trace_file = trace_stdout ? stdout : std::fopen(opt.trace_path.c_str(), "we");
      if (!trace_file) {
        cannot_write(opt.trace_path, "trace");
      } else {
        trace = trace_writer(opt, [&](std::string_view s) {
          if (!trace_failed && std::fwrite(s.data(), 1, s.size(), trace_file) != s.size())
            trace_failed = true;
        });
      }
    }
    if (write_status) return write_status;

    Model m = read_model(std::move(readers), std::move(errors), opt, trace.get());
    m.duplicates = std::move(duplicates);
    // Said where a --json or --html user sees it too: these lines were not read at all.
    for (const auto &l : m.logs)
      if (l.overlong)
        std::cerr << "cumemguard report: " << l.file << ": skipped "
                  << (l.overlong == 1 ? std::string("1 line") : fmt::format("{} lines", l.overlong))
                  << " over " << (kMaxLine >> 20)
                  << " MiB (no record the shim writes is that long)\n";
    if (trace_stdout) {
      if (std::fflush(stdout) != 0 || trace_failed) cannot_write("standard output", "trace");
    } else if (trace_file) {
      if (std::fclose(trace_file) != 0 || trace_failed) {
        cannot_write(opt.trace_path, "trace");
      } else {
        std::cerr << "cumemguard report: trace written to " << clean(opt.trace_path)
                  << " (open it in ui.perfetto.dev or chrome://tracing)\n";
      }
    }
    if (html_stdout) {
      write_html(m, opt, std::cout);
      if (!std::cout.flush()) cannot_write("standard output", "HTML page");
    } else if (!opt.html_path.empty()) {
      write_html(m, opt, html);
      html.close();
      if (!html)
        cannot_write(opt.html_path, "HTML page");
      else
        std::cerr << "cumemguard report: HTML page written to " << clean(opt.html_path) << "\n";
    }

    std::ostream &out = report_file ? static_cast<std::ostream &>(file) : std::cout;
    if (!report_file || file) {
      if (opt.gen_suppressions)
        write_suppressions(m, out);
      else if (opt.json)
        out << report_json(m, opt).dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
      // The page or the trace is the report asked for: stdout says what is in it, in one line;
      // stderr does when the page or the trace is what stdout holds.
      else if ((!opt.trace_path.empty() || !opt.html_path.empty()) && opt.output_path.empty())
        write_headline(m, html_stdout || trace_stdout ? std::cerr : out);
      else
        write_text(m, opt, out);
      out.flush();
      if (report_file) {
        file.close();
        if (!file) cannot_write(opt.output_path, "report");
      } else if (!out) {
        cannot_write("standard output", "report");
      }
    }
    // --gen-suppressions succeeded when it printed the rules: the findings are what they are for.
    int status = m.exit_status(opt);
    if (opt.gen_suppressions) {
      status = 0;
      for (const auto &e : m.errors) status = std::max(status, e.exit_status);
    }
    return std::max(status, write_status);
  } catch (const std::exception &e) {
    std::cerr << "cumemguard report: internal error: " << e.what() << "\n";
    return kExitNoInput;
  }
}

}  // namespace cmg
