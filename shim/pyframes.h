// SPDX-License-Identifier: Apache-2.0
// The calling thread's Python frames, for every stack the shim captures in a process that runs
// CPython: read, never called (no GIL, no reference counts, no interpreter API), with every read
// checked (pyframes_mem.h) and every object's type compared with the interpreter's own type
// objects, so a frame that cannot be read ends the Python part with a marker instead of a fault.
// Code objects are interned in the host (a `pycode` record the first time, an id afterwards) and
// lines cached per (code object, instruction); formatting happens in the report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cmg::shim::py {

inline constexpr int kMaxFrames = 64;  // Python frames kept per stack; deeper ones are cut

// One Python frame of a stack: the code object's id (its `pycode` record), the line running,
// and the native frame it runs in: the index of the interpreter's eval frame in the stack's
// return addresses, or the number of return addresses when that frame was not captured.
struct Frame {
  std::uint32_t code = 0;
  std::int32_t line = 0;  // 0: the location table has no line for the instruction
  std::uint16_t at = 0;
};

enum class End : std::uint8_t {
  Complete,    // every Python frame of the thread is in the stack
  Truncated,   // more than kMaxFrames
  Unreadable,  // a frame failed the checks: the frames before it are shown, native ones stay
};

struct Stack {
  Frame f[kMaxFrames];
  int n = 0;
  End end = End::Complete;
};

// Reads the calling thread's Python frames and assigns each to the eval frame among pcs[0..npcs)
// that runs it. Leaves out.n == 0 when the process runs no CPython (one load of a flag after the
// first call; a library loaded later is noticed), the thread has no Python frames, or the
// interpreter is one the reader does not know (then one note says so, once).
void capture(const std::uintptr_t *pcs, int npcs, Stack &out);

// The same from a fatal-signal handler (the crash record): no allocation, no lock. A code object
// not interned before gets an id of its own and its `pycode` record through `sink` (written from
// static buffers); a line not cached before reads 0. Nothing when `enabled` is false, or before
// an interpreter was found by an earlier capture.
class CodeSink {
 public:
  virtual void code(std::uint32_t id, std::string_view file, std::string_view name, int first) = 0;

 protected:
  ~CodeSink() = default;
};
void capture_in_handler(const std::uintptr_t *pcs, int npcs, bool enabled, Stack &out,
                        CodeSink *sink);

// The file and qualified function name of a code id (empty when unknown): the host's own uses of
// a Python frame (suppressions, the flush site).
struct CodeInfo {
  std::string file, name;
  int first_line = 0;
};
bool code_info(std::uint32_t code, CodeInfo &out);

// fork(): the code table's lock is held across it; the child's log has no `pycode` records yet.
void fork_prepare();
void fork_parent();
void fork_child();

}  // namespace cmg::shim::py
