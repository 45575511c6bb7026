// SPDX-License-Identifier: Apache-2.0
// Fuzz target: `cumemguard report` on hostile logs: the event-log reader (tools/logreader.cpp), the
// model that merges logs, and the text, JSON and trace writers. Input: one log, or two logs
// separated by a NUL byte (merged like the logs of two ranks). Symbolization is off: a log names
// modules by path and the fuzzer must not read files.
// Invariants: no exception escapes, a log the reader accepts renders in all three forms.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <streambuf>
#include <string>
#include <string_view>
#include <vector>

#include "logreader.h"
#include "report_model.h"

namespace rp = cmg::report;

namespace {

// Discards what the writers print (counted, so the work is not optimised away).
class NullBuf : public std::streambuf {
 public:
  std::size_t n = 0;

 protected:
  int overflow(int c) override {
    ++n;
    return c;
  }
  std::streamsize xsputn(const char *, std::streamsize k) override {
    n += static_cast<std::size_t>(k);
    return k;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char *>(data), size);
  const std::size_t z = in.find('\0');
  std::vector<std::string_view> texts{in.substr(0, z)};
  if (z != std::string_view::npos) texts.push_back(in.substr(z + 1));
  std::vector<rp::Log> logs;
  std::vector<rp::LogError> errors;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    rp::ReadResult r = rp::read_log_text(texts[i], "log" + std::to_string(i));
    if (r.status == rp::ReadStatus::Ok) {
      logs.push_back(std::move(r.log));
    } else {
      if (r.error.empty()) {
        std::fprintf(stderr, "fuzz_report: a refused log without a reason\n");
        std::abort();
      }
      errors.push_back(rp::LogError{"log" + std::to_string(i), r.error, 2});
    }
  }
  rp::ReportOptions opt;
  opt.symbolize = false;
  opt.top = 0;
  const rp::Model m = rp::build_model(std::move(logs), std::move(errors), opt);
  NullBuf nb;
  std::ostream out(&nb);
  rp::write_text(m, opt, out);
  opt.json = true;
  out << rp::report_json(m, opt).dump();
  out << rp::trace_json(m, opt).dump();
  (void)m.exit_status(opt);
  return 0;
}
