// SPDX-License-Identifier: Apache-2.0
// Maps the absolute return addresses of one log to module+offset and, with libdw, to function and
// line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "logreader.h"

namespace cmg::report {

struct Frame {
  // Native: a return address; Python: a frame of the interpreter's (file, qualified function
  // name, line; pc and module empty); Marker: where the Python frames stop early ("truncated",
  // "unreadable" in `function`).
  enum class Kind : std::uint8_t { Native, Python, Marker };
  Kind kind = Kind::Native;
  std::uint64_t pc = 0;
  std::string module;        // path of the module holding pc; empty when none does
  std::uint64_t offset = 0;  // pc - module base (the pc itself when no module holds it)
  std::string function;      // demangled; empty when unknown
  std::string file;          // source file; empty when no line information
  int line = 0;
  bool inlined = false;  // inlined into the next frame, which has the same pc
};

// "function (file:line)", "function (module+0x..)", "module+0x.." or "0x.." by what is known; a
// Python frame "function (file:line)"; a marker "... (Python frames truncated)".
std::string frame_text(const Frame &f);

// The stack's frames, innermost first: each return address symbolized, with the Python frames a
// record places at an eval frame shown in its place (the interpreter's frame that runs them),
// those past the last captured address after it, and the marker last.
std::vector<Frame> merge_python(std::vector<std::vector<Frame>> native, const PyStackRec *py,
                                const std::unordered_map<std::uint64_t, PyCode> &codes);

// One per log: the module map is per process (address space layout differs between processes).
class Symbolizer {
 public:
  // use_debug_info false: only module+offset, never opening a file (stable output for tests).
  Symbolizer(const std::vector<Module> &modules, bool use_debug_info);
  ~Symbolizer();
  Symbolizer(const Symbolizer &) = delete;
  Symbolizer &operator=(const Symbolizer &) = delete;
  Symbolizer(Symbolizer &&) noexcept;
  Symbolizer &operator=(Symbolizer &&) noexcept;

  // Every pc of a stack record is a return address: the call is the instruction before it, so
  // function and line are looked up at pc - 1 (the frames still report pc itself). One pc gives
  // several frames when code was inlined there: the inlined callees first, innermost first.
  const std::vector<Frame> &frames(std::uint64_t pc);

  // One line per module that could not be used as recorded (changed file, missing file).
  const std::vector<std::string> &warnings() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cmg::report
