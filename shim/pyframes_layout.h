// SPDX-License-Identifier: Apache-2.0
// Where CPython keeps what the frame reader needs, per interpreter version (x86-64, the default
// build with the GIL): the thread list, a thread's current frame, a frame's code object and
// instruction, a code object's names and location table, a str's characters. 3.13 and later
// publish most of these for debuggers (_Py_DebugOffsets at the start of _PyRuntime); 3.10-3.12
// take them from CPython's headers at the release tags (Include/internal/pycore_frame.h,
// pycore_code.h, pycore_interp.h, pycore_runtime.h, cpython/pystate.h, cpython/code.h,
// cpython/unicodeobject.h). An interpreter this table does not know gets native frames only.
#pragma once

#include <cstdint>
#include <string>

namespace cmg::shim::py {

enum class FrameModel : std::uint8_t {
  Objects,      // 3.10: PyFrameObject chain (f_back), one eval call per Python frame
  Interp311,    // 3.11: _PyInterpreterFrame chain, is_entry ends an eval call's frames
  InterpCstack  // 3.12+: an entry frame owned by the C stack ends an eval call's frames
};

struct Layout {
  int major = 0, minor = 0, micro = 0;
  FrameModel model = FrameModel::Interp311;
  // _PyRuntime
  std::uint32_t rt_interpreters_head = 0, rt_finalizing = 0;
  // 3.10/3.11: the thread-specific key names a thread's first state, whichever interpreter runs
  // on it now; with sub-interpreters the running state is the one whose _PyCFrame (a local of
  // the eval loop running innermost) lies deepest on the thread's stack. -1: not needed.
  std::int32_t rt_interpreters_main = -1, ts_cframe = -1;
  // PyInterpreterState
  std::uint32_t is_threads_head = 0, is_next = 0;
  // PyThreadState: the list, the owner, the current frame (through _PyCFrame for 3.11/3.12)
  std::uint32_t ts_next = 0, ts_interp = 0, ts_thread_id = 0;
  std::uint32_t ts_frame = 0;              // 3.10 frame, 3.11/3.12 cframe, 3.13+ current_frame
  std::int32_t cframe_current_frame = -1;  // offset in _PyCFrame; -1: ts_frame is the frame
  // The frame (_PyInterpreterFrame, or PyFrameObject for 3.10)
  std::uint32_t fr_code = 0, fr_previous = 0, fr_instr = 0, fr_owner = 0;
  std::int32_t fr_is_entry = -1;                     // 3.11 only
  bool fr_instr_is_int = false;                      // 3.10: f_lasti (an int in code units)
  std::uintptr_t fr_code_mask = ~std::uintptr_t{0};  // 3.14: f_executable is a tagged reference
  int owner_cstack = -1, owner_interpreter = -1;     // owner values that are not Python frames
  // PyCodeObject
  std::uint32_t co_filename = 0, co_name = 0, co_qualname = 0, co_linetable = 0;
  std::uint32_t co_firstlineno = 0, co_code_adaptive = 0;  // co_code_adaptive: 3.11+
  bool linetable_pep626 = false;  // 3.10: (bytes, line delta) pairs; 3.11+: the location table
  // PyObject, PyBytesObject, str
  std::uint32_t ob_type = 8, bytes_size = 16, bytes_data = 32;
  std::uint32_t str_length = 16, str_state = 32, str_ascii_size = 40, str_compact_size = 56;
  // The spans of a frame and of a code object holding every field above, read in one go.
  std::uint32_t fr_lo = 0, fr_len = 0, co_lo = 0, co_len = 0;
};

inline constexpr std::uint32_t kMaxSpan = 256;

// One interpreter found in the process: its layout and the addresses the reader compares with.
struct Interp {
  Layout l;
  std::uintptr_t runtime = 0, runtime_size = 0;
  std::uintptr_t code_type = 0, str_type = 0, bytes_type = 0, frame_type = 0;
  std::uintptr_t eval_lo = 0, eval_hi = 0;
};

// Fills `out` for the CPython whose _PyRuntime is at `runtime` and whose hex version is `hex`
// (Py_Version; 0 for 3.10, which has none), reading its _Py_DebugOffsets where it has them.
// Returns false with `why` set for an interpreter it does not know.
bool layout_for(std::uintptr_t runtime, std::uint32_t hex, Layout &out, std::string &why);

}  // namespace cmg::shim::py
