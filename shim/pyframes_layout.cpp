// SPDX-License-Identifier: Apache-2.0
// Per-version layouts (see pyframes_layout.h). Offsets for 3.10, 3.11 and 3.12 were printed with
// offsetof() from the internal headers of the interpreters on this machine (3.10.13, 3.11.2,
// 3.11.7, 3.12.1; they agree with the structure definitions at the release tags); the positions
// inside _Py_DebugOffsets for 3.13 and 3.14 likewise from those releases' headers (3.13.18,
// 3.14.10). Every offset is
// checked in use: the reader requires the types of the objects it reaches (PyCode_Type,
// PyUnicode_Type, PyBytes_Type, PyFrame_Type) and the thread list's back pointers to agree.
#include "pyframes_layout.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "pyframes_mem.h"

namespace cmg::shim::py {
namespace {

void common_311_plus(Layout &l) {
  l.linetable_pep626 = false;
  l.ob_type = 8;
  l.bytes_size = 16;
  l.bytes_data = 32;
  l.str_length = 16;
  l.str_state = 32;
}

void v310(Layout &l) {
  l.model = FrameModel::Objects;
  l.rt_interpreters_head = 32;  // pycore_runtime.h: 4 ints, _finalizing, interpreters{mutex, head}
  l.rt_interpreters_main = 40;
  l.rt_finalizing = 16;
  l.is_threads_head = 8;  // pycore_interp.h: struct _is { next; tstate_head; ... }
  l.ts_next = 8;          // cpython/pystate.h: prev, next, interp, frame, ... thread_id
  l.ts_interp = 16;
  l.ts_frame = 24;
  l.ts_cframe = 48;  // CFrame *cframe (3.10 has one for use_tracing)
  l.ts_thread_id = 176;
  l.fr_code = 32;  // cpython/frameobject.h: PyObject_VAR_HEAD, f_back, f_code, ... f_gen, f_lasti
  l.fr_previous = 24;
  l.fr_instr = 96;
  l.fr_instr_is_int = true;
  l.co_firstlineno = 40;  // cpython/code.h: PyObject_HEAD, 7 ints, co_code ... co_filename
  l.co_filename = 104;
  l.co_name = 112;
  l.co_qualname = 112;  // 3.10 code objects have no qualified name: the function's own name
  l.co_linetable = 120;
  l.linetable_pep626 = true;
  l.ob_type = 8;
  l.bytes_size = 16;
  l.bytes_data = 32;
  l.str_length = 16;
  l.str_state = 32;
  l.str_ascii_size = 48;  // PyASCIIObject with wstr
  l.str_compact_size = 72;
}

void v311(Layout &l) {
  l.model = FrameModel::Interp311;
  l.rt_interpreters_head = 40;
  l.rt_interpreters_main = 48;
  l.rt_finalizing = 24;
  l.is_threads_head = 16;
  l.ts_next = 8;
  l.ts_interp = 16;
  l.ts_frame = 56;  // cframe
  l.ts_cframe = 56;
  l.cframe_current_frame = 8;
  l.ts_thread_id = 152;
  l.fr_code = 32;
  l.fr_previous = 48;
  l.fr_instr = 56;  // prev_instr
  l.fr_is_entry = 68;
  l.fr_owner = 69;
  l.co_firstlineno = 72;
  l.co_filename = 112;
  l.co_name = 120;
  l.co_qualname = 128;
  l.co_linetable = 136;
  l.co_code_adaptive = 184;
  common_311_plus(l);
  l.str_ascii_size = 48;
  l.str_compact_size = 72;
}

void v312(Layout &l) {
  l.model = FrameModel::InterpCstack;
  l.rt_interpreters_head = 40;
  l.rt_finalizing = 24;
  l.is_threads_head = 72;  // next, id, id_refcount, requires_idref, id_mutex, 2 ints, 2 versions
  l.ts_next = 8;
  l.ts_interp = 16;
  l.ts_frame = 56;  // cframe
  l.cframe_current_frame = 0;
  l.ts_thread_id = 136;
  l.fr_code = 0;
  l.fr_previous = 8;
  l.fr_instr = 56;  // prev_instr
  l.fr_owner = 70;
  l.owner_cstack = 3;  // FRAME_OWNED_BY_CSTACK
  l.co_firstlineno = 68;
  l.co_filename = 112;
  l.co_name = 120;
  l.co_qualname = 128;
  l.co_linetable = 136;
  l.co_code_adaptive = 192;
  common_311_plus(l);
  l.str_ascii_size = 40;
  l.str_compact_size = 56;
}

// Positions of the fields the reader uses inside _Py_DebugOffsets, per minor version.
struct DebugPos {
  std::uint32_t rt_finalizing, rt_interpreters_head, is_next, is_threads_head;
  std::uint32_t ts_next, ts_interp, ts_current_frame, ts_thread_id;
  std::uint32_t fr_previous, fr_executable, fr_instr_ptr, fr_owner;
  std::uint32_t co_filename, co_name, co_qualname, co_linetable, co_firstlineno, co_code_adaptive;
  std::uint32_t ob_type, bytes_size, bytes_data, str_state, str_length, str_ascii_size;
  std::uint32_t end;  // bytes to read
};
constexpr DebugPos kDebug313{32,  40,  64,  72,  168, 176, 184, 192, 232, 240, 248, 264, 280,
                             288, 296, 304, 312, 344, 360, 520, 528, 544, 552, 560, 584};
constexpr DebugPos kDebug314{32,  40,  64,  72,  192, 200, 208, 216, 256, 264, 272, 288, 320,
                             328, 336, 344, 352, 384, 408, 600, 608, 624, 632, 640, 760};

bool from_debug_offsets(std::uintptr_t runtime, std::uint32_t hex, const DebugPos &p, Layout &l,
                        std::string &why) {
  unsigned char d[1024];
  if (p.end > sizeof d || !read(runtime, d, p.end)) {
    why = "its _Py_DebugOffsets cannot be read";
    return false;
  }
  if (std::memcmp(d, "xdebugpy", 8) != 0) {
    why = "_PyRuntime does not start with _Py_DebugOffsets";
    return false;
  }
  auto at = [&](std::uint32_t pos) {
    std::uint64_t v;
    std::memcpy(&v, d + pos, 8);
    return v;
  };
  if ((at(8) >> 16) != ((hex >> 16) & 0xffff)) {
    why = "its _Py_DebugOffsets names another version";
    return false;
  }
  if (at(16) != 0) {
    why = at(16) == 1 ? "a free-threaded build (its object layout is not modelled)"
                      : "its _Py_DebugOffsets has another layout";
    return false;
  }
  auto o32 = [&](std::uint32_t pos, std::uint32_t &dst) {
    const std::uint64_t v = at(pos);
    if (v > (1u << 24)) return false;
    dst = static_cast<std::uint32_t>(v);
    return true;
  };
  std::uint32_t str_ascii = 0;
  const bool ok = o32(p.rt_finalizing, l.rt_finalizing) &&
                  o32(p.rt_interpreters_head, l.rt_interpreters_head) &&
                  o32(p.is_next, l.is_next) && o32(p.is_threads_head, l.is_threads_head) &&
                  o32(p.ts_next, l.ts_next) && o32(p.ts_interp, l.ts_interp) &&
                  o32(p.ts_current_frame, l.ts_frame) && o32(p.ts_thread_id, l.ts_thread_id) &&
                  o32(p.fr_previous, l.fr_previous) && o32(p.fr_executable, l.fr_code) &&
                  o32(p.fr_instr_ptr, l.fr_instr) && o32(p.fr_owner, l.fr_owner) &&
                  o32(p.co_filename, l.co_filename) && o32(p.co_name, l.co_name) &&
                  o32(p.co_qualname, l.co_qualname) && o32(p.co_linetable, l.co_linetable) &&
                  o32(p.co_firstlineno, l.co_firstlineno) &&
                  o32(p.co_code_adaptive, l.co_code_adaptive) && o32(p.ob_type, l.ob_type) &&
                  o32(p.bytes_size, l.bytes_size) && o32(p.bytes_data, l.bytes_data) &&
                  o32(p.str_state, l.str_state) && o32(p.str_length, l.str_length) &&
                  o32(p.str_ascii_size, str_ascii);
  if (!ok) {
    why = "its _Py_DebugOffsets holds implausible offsets";
    return false;
  }
  l.model = FrameModel::InterpCstack;
  l.cframe_current_frame = -1;
  l.str_ascii_size = str_ascii;
  l.str_compact_size = str_ascii + 16;  // utf8_length, utf8 (cpython/unicodeobject.h)
  l.linetable_pep626 = false;
  return true;
}

// [lo, hi) over the fields (offset, size) given.
void span(std::initializer_list<std::pair<std::int64_t, std::uint32_t>> fields, std::uint32_t &lo,
          std::uint32_t &len) {
  std::int64_t a = INT64_MAX, b = 0;
  for (const auto &[off, size] : fields) {
    if (off < 0) continue;
    a = std::min(a, off);
    b = std::max(b, off + size);
  }
  lo = static_cast<std::uint32_t>(a);
  len = static_cast<std::uint32_t>(b - a);
}

bool spans(Layout &l, std::string &why) {
  const bool objects = l.model == FrameModel::Objects;
  span({{l.fr_code, 8},
        {l.fr_previous, 8},
        {l.fr_instr, l.fr_instr_is_int ? 4u : 8u},
        {objects ? -1 : std::int64_t{l.fr_owner}, 1},
        {l.fr_is_entry, 1},
        {objects ? std::int64_t{l.ob_type} : -1, 8}},
       l.fr_lo, l.fr_len);
  span({{l.ob_type, 8},
        {l.co_filename, 8},
        {l.co_qualname, 8},
        {l.co_linetable, 8},
        {l.co_firstlineno, 4}},
       l.co_lo, l.co_len);
  if (l.fr_len > kMaxSpan || l.co_len > kMaxSpan) {
    why = "its frame or code object fields lie too far apart";
    return false;
  }
  return true;
}

}  // namespace

bool layout_for(std::uintptr_t runtime, std::uint32_t hex, Layout &out, std::string &why) {
  Layout l;
  if (hex == 0) {
    l.major = 3;
    l.minor = 10;
    v310(l);
    if (!spans(l, why)) return false;
    out = l;
    return true;
  }
  l.major = static_cast<int>(hex >> 24);
  l.minor = static_cast<int>((hex >> 16) & 0xff);
  l.micro = static_cast<int>((hex >> 8) & 0xff);
  if (l.major == 3 && l.minor == 11) {
    v311(l);
  } else if (l.major == 3 && l.minor == 12) {
    v312(l);
  } else if (l.major == 3 && l.minor == 13) {
    if (!from_debug_offsets(runtime, hex, kDebug313, l, why)) return false;
    l.owner_cstack = 3;  // pycore_frame.h 3.13: FRAME_OWNED_BY_CSTACK
  } else if (l.major == 3 && l.minor == 14) {
    if (!from_debug_offsets(runtime, hex, kDebug314, l, why)) return false;
    l.owner_interpreter = 3;  // pycore_interpframe_structs.h 3.14: FRAME_OWNED_BY_INTERPRETER
    l.owner_cstack = 4;
    l.fr_code_mask = ~std::uintptr_t{7};  // _PyStackRef: tag bits (Py_TAG_BITS 3 with the GIL)
  } else {
    why = "no frame layout is known for this version (known: 3.10 to 3.14)";
    return false;
  }
  if (!spans(l, why)) return false;
  out = l;
  return true;
}

}  // namespace cmg::shim::py
