// SPDX-License-Identifier: Apache-2.0
// Fuzz target: `cumemguard report` on hostile logs: the event-log reader (tools/logreader.cpp), the
// model that merges logs, and the text, JSON and trace writers. Input: one log, or two logs
// separated by a NUL byte (merged like the logs of two ranks). Symbolization is off: a log names
// modules by path and the fuzzer must not read files.
// Invariants: no exception escapes, a log the reader accepts renders in every form, the JSON
// output stays within a bound of the input's size.
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
  std::vector<std::string> copies(texts.begin(), texts.end());
  rp::ReportOptions opt;
  opt.symbolize = false;
  opt.top = 0;
  opt.slow_ns = 0;
  std::size_t trace_bytes = 0;
  auto trace = rp::trace_writer(opt, [&](std::string_view s) { trace_bytes += s.size(); });
  const rp::Model m = rp::model_of_texts(copies, opt, trace.get());
  for (const auto &e : m.errors)
    if (e.error.empty()) {
      std::fprintf(stderr, "fuzz_report: a refused log without a reason\n");
      std::abort();
    }
  NullBuf nb;
  std::ostream out(&nb);
  rp::write_text(m, opt, out);
  rp::write_html(m, opt, out);
  rp::write_suppressions(m, out);
  opt.json = true;
  const std::string json = rp::report_json(m, opt).dump();
  // Output stays bounded by what a record may hold, whatever the input's nesting.
  if (json.size() > 64 * (size + 4096) + (std::size_t{1} << 20)) {
    std::fprintf(stderr, "fuzz_report: %zu bytes of JSON from %zu of input\n", json.size(), size);
    std::abort();
  }
  out << json;
  (void)m.exit_status(opt);
  return 0;
}
