// SPDX-License-Identifier: Apache-2.0
// Unit tests of the report model: grouping across processes, byte accounting, exit status.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "report_fmt.h"
#include "report_model.h"

using namespace cmg::report;

namespace {

// One process whose module lib.so is loaded at `base`: the same code at another address.
std::string process(int pid, int rank, const char *base, const char *pc) {
  return "{\"cumemguard_log\":1,\"pid\":" + std::to_string(pid) +
         ",\"rank\":" + std::to_string(rank) +
         ",\"start_unix_ns\":0,\"argv\":[\"a\"],\"mode\":\"guard\"}\n" +
         "{\"k\":\"module\",\"path\":\"/lib.so\",\"base\":\"" + base + "\",\"size\":65536}\n" +
         "{\"k\":\"stack\",\"id\":1,\"pcs\":[\"" + pc + "\"]}\n" +
         "{\"k\":\"call\",\"seq\":1,\"ts\":10,\"tid\":1,\"api\":\"cudaMalloc\",\"res\":0,"
         "\"dev\":0,\"mem\":\"linear\",\"delta\":100,\"stack\":1}\n"
         "{\"k\":\"call\",\"seq\":2,\"ts\":20,\"tid\":1,\"api\":\"cudaMalloc\",\"res\":0,"
         "\"dev\":0,\"mem\":\"linear\",\"delta\":50,\"stack\":1}\n"
         "{\"k\":\"call\",\"seq\":3,\"ts\":30,\"tid\":1,\"api\":\"cudaFree\",\"res\":0,"
         "\"dev\":0,\"mem\":\"linear\",\"delta\":-100}\n"
         "{\"k\":\"finding\",\"seq\":4,\"ts\":40,\"tid\":1,\"class\":\"double-free\","
         "\"api\":\"cudaFree\",\"action\":\"skip\",\"stack\":1}\n"
         "{\"k\":\"end\",\"ts\":50}\n";
}

Model model_of(std::vector<std::string> texts, ReportOptions opt = {}) {
  opt.symbolize = false;
  return model_of_texts(texts, opt);
}

}  // namespace

TEST_CASE("the same code in two processes with different load addresses is one stack group") {
  Model m = model_of({process(1, 0, "0x7f0000000000", "0x7f0000001234"),
                      process(2, 1, "0x7f5500000000", "0x7f5500001234")});
  REQUIRE(m.findings.size() == 1);
  const auto &c = m.findings[0];
  CHECK(c.cls == "double-free");
  REQUIRE(c.groups.size() == 1);
  CHECK(c.groups[0].count == 2);
  CHECK(c.groups[0].logs == std::set<std::size_t>{0, 1});
  const ResolvedStack &st = m.stack(c.groups[0].stack);
  REQUIRE(st.frames.size() == 1);
  CHECK(frame_text(st.frames[0]) == "lib.so+0x1234");
  REQUIRE(m.sites.size() == 1);
  CHECK(m.sites[0].bytes == 300);
  CHECK(m.sites[0].count == 4);
}

TEST_CASE("current and peak bytes follow the deltas in seq order, per log") {
  Model m = model_of({process(1, 0, "0x1000", "0x1010")});
  REQUIRE(m.memory.size() == 1);
  CHECK(m.memory[0].current == 50);
  CHECK(m.memory[0].peak == 150);
  CHECK(m.memory[0].peak_t == 20);
  CHECK(m.memory[0].allocated == 150);
  CHECK(m.memory[0].freed == 100);
}

TEST_CASE("exit status: findings 1, leaks only with fail_on_leaks, read errors win") {
  std::string leak_only =
      "{\"cumemguard_log\":1,\"pid\":3,\"start_unix_ns\":0}\n"
      "{\"k\":\"leak\",\"what\":\"linear\",\"api\":\"cudaMalloc\",\"ptr\":\"0x10\",\"size\":8}\n"
      "{\"k\":\"end\",\"ts\":1}\n";
  ReportOptions opt;
  CHECK(model_of({leak_only}, opt).exit_status(opt) == 0);
  opt.fail_on_leaks = true;
  CHECK(model_of({leak_only}, opt).exit_status(opt) == 1);
  opt.fail_on_leaks = false;
  CHECK(model_of({process(1, 0, "0x1000", "0x1010")}, opt).exit_status(opt) == 1);

  // A log that cannot be read wins: 66 over 1.
  Model m = model_of({process(1, 0, "0x1000", "0x1010"), "{\"cumemguard_log\":2}\n"}, opt);
  CHECK(m.errors.size() == 1);
  CHECK(m.exit_status(opt) == 66);
}

TEST_CASE("labels stay unique when ranks or pids repeat") {
  Model m = model_of({process(1, 0, "0x1000", "0x1010"), process(2, 0, "0x1000", "0x1010"),
                      process(2, 0, "0x1000", "0x1010"), process(3, 1, "0x1000", "0x1010")});
  CHECK(m.labels == std::vector<std::string>{"r0/p1", "r0/p2", "r0/p2#2", "r1"});
}

namespace {

std::size_t count_of(const std::string &hay, const std::string &needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

std::string trace_of(const std::vector<std::string> &texts, std::int64_t slow_ns) {
  ReportOptions opt;
  opt.symbolize = false;
  opt.slow_ns = slow_ns;
  std::string out;
  auto t = trace_writer(opt, [&](std::string_view s) { out += s; });
  model_of_texts(texts, opt, t.get());
  return out;
}

}  // namespace

TEST_CASE("--slow-us 0 makes every call a slice, never fewer than --slow-us 1") {
  // Calls of 5 ns, 1500 ns and 0 ns (dur absent).
  std::string log = process(1, 0, "0x1000", "0x1010");
  const std::string t0 = trace_of({log}, 0), t1 = trace_of({log}, 1000);
  CHECK(count_of(t0, "\"ph\":\"X\"") == 3);
  CHECK(count_of(t1, "\"ph\":\"X\"") == 0);
}

TEST_CASE("crashed and aborted processes fail the gate; suppressed findings do not") {
  const std::string head = "{\"cumemguard_log\":1,\"pid\":3,\"start_unix_ns\":0}\n";
  ReportOptions opt;
  CHECK(model_of({head + "{\"k\":\"end\",\"ts\":1,\"signal\":11,\"signal_name\":\"SIGSEGV\"}\n"})
            .exit_status(opt) == 1);
  CHECK(model_of({head + "{\"k\":\"end\",\"ts\":1,\"aborted\":true}\n"}).exit_status(opt) == 1);
  CHECK(model_of({head + "{\"k\":\"end\",\"ts\":1}\n"}).exit_status(opt) == 0);
  Model m = model_of({head +
                      "{\"k\":\"finding\",\"seq\":1,\"ts\":1,\"class\":\"double-release\","
                      "\"suppressed\":\"double-release:*libvendor*\"}\n"
                      "{\"k\":\"summary\",\"ts\":2,\"findings\":{},\"suppressed\":[{\"class\":"
                      "\"double-release\",\"pattern\":\"*libvendor*\",\"count\":1}]}\n"
                      "{\"k\":\"end\",\"ts\":3}\n"});
  CHECK(m.exit_status(opt) == 0);
  CHECK(m.finding_count == 0);
  CHECK(m.suppressed_count == 1);
  REQUIRE(m.suppressed.size() == 1);
  CHECK(m.suppressed[0].pattern == "*libvendor*");
}

TEST_CASE("the first sticky CUDA error, the frees before it and the ranges asleep are kept") {
  const std::string log =
      "{\"cumemguard_log\":1,\"pid\":3,\"start_unix_ns\":0}\n"
      "{\"k\":\"call\",\"seq\":1,\"ts\":1,\"tid\":3,\"api\":\"cuMemAddressReserve\",\"res\":0,"
      "\"args\":{\"size\":8192,\"ptr\":\"0x10000\"}}\n"
      "{\"k\":\"call\",\"seq\":2,\"ts\":2,\"tid\":3,\"api\":\"cuMemMap\",\"res\":0,"
      "\"args\":{\"ptr\":\"0x10000\",\"size\":4096,\"handle\":\"0x5\"}}\n"
      "{\"k\":\"call\",\"seq\":3,\"ts\":3,\"tid\":3,\"api\":\"cuMemUnmap\",\"res\":0,"
      "\"args\":{\"ptr\":\"0x10000\",\"size\":4096}}\n"
      "{\"k\":\"call\",\"seq\":4,\"ts\":4,\"tid\":3,\"api\":\"cudaFree\",\"res\":0,"
      "\"args\":{\"ptr\":\"0x20000\"}}\n"
      "{\"k\":\"cuda_error\",\"seq\":6,\"ts\":6,\"tid\":4,\"api\":\"cudaFree\",\"res\":700,"
      "\"name\":\"cudaErrorIllegalAddress\",\"sticky\":true}\n"
      "{\"k\":\"call\",\"seq\":6,\"ts\":6,\"tid\":4,\"api\":\"cudaFree\",\"res\":700}\n"
      "{\"k\":\"call\",\"seq\":7,\"ts\":7,\"tid\":4,\"api\":\"cudaFree\",\"res\":700}\n";
  Model m = model_of({log});
  REQUIRE(m.outcomes.size() == 1);
  const Outcome &o = m.outcomes[0];
  CHECK(o.status == Status::Truncated);
  REQUIRE(o.first_sticky);
  CHECK(o.first_sticky->error.res == 700);
  CHECK(o.first_sticky->seq == 6);
  CHECK(o.lifecycle_before_error);
  REQUIRE(o.lifecycle.size() == 2);  // the unmap and the free before seq 6
  CHECK(o.lifecycle[0].api == "cuMemUnmap");
  CHECK(o.lifecycle[1].seq == 4);
  REQUIRE(o.asleep.size() == 1);
  CHECK(o.asleep[0].ptr == 0x10000);
  CHECK(o.asleep[0].unmap_seq == 3);
}

TEST_CASE("ranges put to sleep while the failing call waited are asleep at its error") {
  // Thread 4's synchronize begins at seq 3 and returns 700 after thread 3 unmapped at seq 4: the
  // unmap is what the kernel met. A range mapped again later (seq 6) is still named as asleep then.
  auto log = [](const char *ret) {
    return std::string(
               "{\"cumemguard_log\":1,\"pid\":3,\"start_unix_ns\":0}\n"
               "{\"k\":\"call\",\"seq\":1,\"ts\":1,\"tid\":3,\"api\":\"cuMemAddressReserve\","
               "\"res\":0,\"args\":{\"size\":8192,\"ptr\":\"0x10000\"}}\n"
               "{\"k\":\"call\",\"seq\":2,\"ts\":2,\"tid\":3,\"api\":\"cuMemMap\",\"res\":0,"
               "\"args\":{\"ptr\":\"0x10000\",\"size\":4096,\"handle\":\"0x5\"}}\n"
               "{\"k\":\"cuda_error\",\"seq\":3,\"ts\":3,\"tid\":4,"
               "\"api\":\"cudaDeviceSynchronize\",\"res\":700,\"sticky\":true") +
           ret +
           "}\n"
           "{\"k\":\"call\",\"seq\":4,\"ts\":4,\"tid\":3,\"api\":\"cuMemUnmap\",\"res\":0,"
           "\"args\":{\"ptr\":\"0x10000\",\"size\":4096}}\n"
           "{\"k\":\"call\",\"seq\":3,\"ts\":3,\"tid\":4,\"api\":\"cudaDeviceSynchronize\","
           "\"res\":700}\n"
           "{\"k\":\"call\",\"seq\":6,\"ts\":6,\"tid\":3,\"api\":\"cuMemMap\",\"res\":0,"
           "\"args\":{\"ptr\":\"0x10000\",\"size\":4096,\"handle\":\"0x6\"}}\n"
           "{\"k\":\"end\",\"ts\":7}\n";
  };
  {
    Model m = model_of({log(",\"ret_seq\":6")});
    const Outcome &o = m.outcomes[0];
    REQUIRE(o.first_sticky);
    CHECK(o.asleep_at_error);
    REQUIRE(o.asleep.size() == 1);
    CHECK(o.asleep[0].ptr == 0x10000);
    CHECK(o.asleep[0].unmap_seq == 4);
    CHECK(o.asleep[0].unmap_tid == 3);
  }
  {
    // An older log without ret_seq: as of when the call began, before the unmap.
    Model m = model_of({log("")});
    const Outcome &o = m.outcomes[0];
    CHECK(o.asleep_at_error);
    CHECK(o.asleep.empty());
  }
}

TEST_CASE("communicators: a refused destroy keeps one live, a reused address is a new row") {
  auto nccl = [](int seq, const char *event, const char *comm, int res, const char *extra = "") {
    return "{\"k\":\"nccl\",\"seq\":" + std::to_string(seq) +
           ",\"ts\":" + std::to_string(seq * 10) + ",\"tid\":1,\"event\":\"" + event + "\",\"api\":\"x\",\"comm\":\"" + comm +
           "\",\"res\":" + std::to_string(res) + extra + "}\n";
  };
  std::string log =
      "{\"cumemguard_log\":1,\"pid\":1,\"rank\":0,\"start_unix_ns\":0,\"argv\":[\"a\"]}\n";
  log += nccl(1, "init", "0xa0", 0);
  log += nccl(2, "suspend", "0xa0", 0, ",\"flags\":1,\"ranges\":2,\"range_bytes\":4194304");
  log += nccl(3, "suspend", "0xa0", 5, ",\"flags\":1");   // refused: still one interval
  log += nccl(4, "destroy", "0xa0", 1);                    // refused: still live
  log += nccl(5, "resume", "0xa0", 0);
  log += nccl(6, "suspend", "0xa0", 0, ",\"flags\":0");   // without NCCL_SUSPEND_MEM: nothing
  log += nccl(7, "register", "0xa0", 0, ",\"buff\":\"0x7f00\",\"size\":4096,\"handle\":\"0xb1\"");
  log += nccl(8, "register", "0xa0", 0, ",\"buff\":\"0x7f10\",\"size\":64,\"handle\":\"0xb1\"");
  log += nccl(9, "deregister", "0xa0", 0, ",\"handle\":\"0xb1\"");
  log += nccl(10, "abort", "0xa0", 0);
  log += nccl(11, "init", "0xa0", 0);                      // NCCL handed the address out again
  log += nccl(12, "memstats", "0xa0", 0, ",\"stat\":3,\"value\":8388608");
  log += "{\"k\":\"end\",\"ts\":200}\n";
  Model m = model_of({log});
  REQUIRE(m.comms.size() == 2);
  const CommRow &a = m.comms[0];
  REQUIRE(a.ended);
  CHECK(a.ended->event == "abort");
  CHECK(a.ended->t == 100);
  REQUIRE(a.suspended.size() == 1);
  CHECK(a.suspended[0].from == 20);
  CHECK(a.suspended[0].to == 50);
  CHECK(a.suspended[0].ranges == 2);
  CHECK(a.suspended[0].range_bytes == 4194304);
  REQUIRE(a.regs.size() == 1);  // the second registration shares the slot's handle
  CHECK(a.regs_made == 2);
  CHECK(a.regs[0].refs == 1);
  CHECK(a.regs[0].ended == 100);  // the communicator's end took it
  const CommRow &b = m.comms[1];
  CHECK_FALSE(b.ended);
  CHECK(b.created->t == 110);
  CHECK(b.mem_stats.at(3) == 8388608);
  CHECK(b.mem_stats_t == 120);
}

// A Python program's stack in the text report: the interpreter's call into C above the innermost
// Python frame (libffi, ctypes, libpython) is one line, an extension's frames above it are
// printed, and the interpreter's frames below the outermost Python frame are one line.
TEST_CASE("print_stack folds the interpreter's call into C, not an extension's frames",
          "[report]") {
  using cmg::report::Frame;
  auto native = [](const char *module, const char *fn) {
    Frame f;
    f.module = module;
    f.function = fn;
    f.pc = 0x1000;
    return f;
  };
  auto python = [](const char *fn, int line) {
    Frame f;
    f.kind = Frame::Kind::Python;
    f.function = fn;
    f.file = "/app/train.py";
    f.line = line;
    return f;
  };
  cmg::report::ResolvedStack s;
  s.id = 1;
  s.frames = {native("/usr/lib/libc10_cuda.so", "c10::cuda::CUDACachingAllocator::malloc"),
              native("/usr/lib/libtorch_python.so", "THPVariable_empty"),
              native("/usr/lib/libpython3.12.so.1.0", "cfunction_call"),
              native("/usr/lib/libpython3.12.so.1.0", "_PyObject_MakeTpCall"),
              python("step", 7),
              python("<module>", 12),
              native("/usr/lib/libpython3.12.so.1.0", "PyEval_EvalCode"),
              native("/usr/lib/libpython3.12.so.1.0", "run_mod"),
              native("/usr/bin/python3.12", "main")};
  std::ostringstream out;
  cmg::report::print_stack(out, s, "  ", false);
  CHECK(out.str() ==
        "  #0 c10::cuda::CUDACachingAllocator::malloc (libc10_cuda.so+0x0)\n"
        "  #1 THPVariable_empty (libtorch_python.so+0x0)\n"
        "  ... 2 interpreter frames calling into C (--full-stacks to show)\n"
        "  #4 step (/app/train.py:7)\n"
        "  #5 <module> (/app/train.py:12)\n"
        "  ... 3 interpreter frames (--full-stacks to show)\n");
  // ctypes: the whole top is the call machinery; one frame of it is printed, not folded.
  s.frames = {native("/usr/lib/x86_64-linux-gnu/libffi.so.8", "ffi_call"),
              native("/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so",
                     "_ctypes_callproc"),
              native("/usr/bin/python3.11", "_PyObject_MakeTpCall"), python("free", 3)};
  std::ostringstream ct;
  cmg::report::print_stack(ct, s, "  ", false);
  CHECK(ct.str() == "  ... 3 interpreter frames calling into C (--full-stacks to show)\n"
                    "  #3 free (/app/train.py:3)\n");
  s.frames = {native("/opt/app/libmine.so", "mine"), native("/usr/bin/python3.11", "call"),
              python("free", 3)};
  std::ostringstream one;
  cmg::report::print_stack(one, s, "  ", false);
  CHECK(one.str() == "  #0 mine (libmine.so+0x0)\n  #1 call (python3.11+0x0)\n"
                     "  #2 free (/app/train.py:3)\n");
}
