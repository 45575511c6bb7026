// SPDX-License-Identifier: Apache-2.0
// Stacks under a live finding message (see live_stacks.h). Findings are rare and the message
// count is capped (CUMEMGUARD_WARN_LIMIT), so the symbolization here costs nothing per call.
#include "live_stacks.h"

#include <algorithm>
#include <iterator>

#include "flush.h"
#include "options.h"
#include "program_frame.h"
#include "pyframes.h"
#include "stacks.h"
#include "symtab.h"

namespace cmg::shim {
namespace {

// One frame's line; names come from files on disk and from the program's code objects: a hostile
// symbol or file name must not drive the terminal.
void append_frame(std::string &out, std::string_view prefix, int k, std::string_view text) {
  std::size_t used = 0;
  out.append(prefix)
      .append("    #")
      .append(std::to_string(k))
      .append(" ")
      .append(escape_controls(text, 512, used))
      .append("\n");
}

// The frames innermost first, as the report merges them (tools/symbolize.cpp merge_python): the
// Python frames an eval frame runs in place of that native frame, several for one eval frame on
// 3.11 and later, and those whose eval frame was not captured after the native ones. At most
// `frames` native frames and as many Python ones: deep native frames between the call and the
// program's Python code (an FFI, an interpreter, a framework) are counted in one line, so the
// Python frames still show; frame numbers are positions in the whole stack.
void append_stack(std::string &out, std::uint32_t id, int frames, std::string_view prefix) {
  Captured c;
  if (!stack_frames(id, c) || (c.n <= 0 && c.py.n <= 0)) {
    out.append(prefix).append("    (stack not known)\n");
    return;
  }
  const FrameSym *fs[std::size(c.pc)];
  frame_syms(c.pc, c.n, patterns(), fs);
  int k = 0, natives = 0, pythons = 0, skipped = 0;
  auto python = [&](const py::Frame &f) {
    if (pythons >= frames) return;
    if (skipped)
      out.append(prefix)
          .append("    ... ")
          .append(std::to_string(skipped))
          .append(skipped == 1 ? " native frame\n" : " native frames\n");
    skipped = 0;
    py::CodeInfo ci;
    append_frame(out, prefix, k++,
                 py::code_info(f.code, ci)
                     ? ci.name + " (" + ci.file + ":" + std::to_string(f.line) + ")"
                     : "<python code " + std::to_string(f.code) + ">");
    ++pythons;
  };
  // The interpreter's own call into C just above the innermost Python frame (ctypes, libffi,
  // libpython) is one line, as the report prints it: a ctypes program's message began with
  // seven such frames, and the Python ones only just fit under the limit.
  const int inner = c.py.n > 0 && c.py.f[0].at < c.n ? c.py.f[0].at : c.n;
  int call_from = inner;
  while (inner < c.n && call_from > 0 && fs[call_from - 1] &&
         interpreter_call_module(fs[call_from - 1]->module))
    --call_from;
  if (inner - call_from < 2) call_from = inner;
  // Below the outermost Python frame the native frames are the interpreter's start-up and eval
  // loop, the same in every stack of the program: one line says how many (the report's fold).
  const int outer = c.py.n > 0 && c.py.f[c.py.n - 1].at < c.n ? c.py.f[c.py.n - 1].at : c.n;
  const int below = outer < c.n ? c.n - outer - 1 : 0;
  int next = 0;
  for (int i = 0; i < c.n; ++i) {
    if (below >= 2 && i == outer + 1) {
      for (; next < c.py.n && c.py.f[next].at < c.n; ++next) python(c.py.f[next]);
      out.append(prefix)
          .append("    ... ")
          .append(std::to_string(below))
          .append(" interpreter frames\n");
      k += below;
      break;
    }
    if (i == call_from && call_from < inner) {
      out.append(prefix)
          .append("    ... ")
          .append(std::to_string(inner - call_from))
          .append(" interpreter frames calling into C\n");
      k += inner - call_from;
      i = inner - 1;
      continue;
    }
    bool replaced = false;
    for (; next < c.py.n && c.py.f[next].at == i; ++next) {
      python(c.py.f[next]);
      replaced = true;
    }
    if (replaced) continue;
    if (natives < frames) {
      append_frame(out, prefix, k,
                   fs[i] ? frame_text(*fs[i], c.pc[i]) : frame_text(FrameSym{}, c.pc[i]));
      ++natives;
    } else {
      ++skipped;
    }
    ++k;
  }
  for (; next < c.py.n; ++next) python(c.py.f[next]);
  if (c.py.n && c.py.end != py::End::Complete)
    out.append(prefix).append(c.py.end == py::End::Truncated
                                  ? "    (more Python frames than the shim keeps)\n"
                                  : "    (a Python frame could not be read)\n");
}

}  // namespace

std::string finding_stack_lines(const Finding &f, std::uint32_t call_stack, int frames,
                                std::string_view prefix) {
  std::string out;
  if (frames <= 0) return out;
  try {
    if (call_stack) append_stack(out, call_stack, frames, prefix);
    for (const Related &r : f.related) {
      if (!r.ev.known() || !r.ev.stack) continue;
      // As the report heads them: "allocation: cudaMalloc, thread 4242, seq 1".
      out.append(prefix).append("  ").append(r.what).append(":");
      if (r.ev.api) out.append(" ").append(r.ev.api).append(",");
      out.append(" thread ")
          .append(std::to_string(r.ev.tid))
          .append(", seq ")
          .append(std::to_string(r.ev.seq))
          .append("\n");
      append_stack(out, r.ev.stack, frames, prefix);
    }
  } catch (...) {
    out.clear();  // out of memory: the one-line message alone
  }
  return out;
}

}  // namespace cmg::shim
