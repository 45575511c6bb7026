// SPDX-License-Identifier: Apache-2.0
// The frame reader's code objects (internal to shim/pyframes*.cpp): checked reads of an object's
// fields, the table that interns code objects (a `pycode` record the first time, an id after),
// their names as UTF-8, and the line of an instruction, cached.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "pyframes.h"
#include "pyframes_layout.h"
#include "pyframes_mem.h"

namespace cmg::shim::py {

// An object's fields read at once (Layout's spans), taken out by offset: in place when its pages
// were proven readable before (the calling thread's own frames and code objects, which do not
// change during its C call), else copied through the kernel once.
struct Window {
  std::uint32_t lo = 0;
  const unsigned char *p = nullptr;
  unsigned char b[kMaxSpan];
  bool load(std::uintptr_t obj, std::uint32_t from, std::uint32_t len) {
    lo = from;
    if ((p = known(obj + from, len))) return true;
    p = b;
    return read(obj + from, b, len);
  }
  template <class T>
  T get(std::uint32_t off) const {
    T v;
    std::memcpy(&v, p + (off - lo), sizeof v);
    return v;
  }
};

template <class T>
bool field(std::uintptr_t obj, std::uint32_t off, T &v, bool owned = true) {
  return read_as(obj + off, v, owned);
}

inline bool has_type(const Interp &in, std::uintptr_t obj, std::uintptr_t type) {
  std::uintptr_t t = 0;
  return obj && (obj & 7) == 0 && field(obj, in.l.ob_type, t) && t == type;
}

// A code object as interned: immutable once published.
struct Code {
  std::uintptr_t code, filename, qualname, linetable;
  std::int32_t first_line;
  std::uint32_t id;
  std::string file, name;
};

struct CodeFields {
  std::uintptr_t filename = 0, qualname = 0, linetable = 0;
  std::int32_t first_line = 0;
};

// Whether an entry was made for the code object whose fields these are: a code object freed and
// another made at its address (exec'd or generated code) has names and a table of its own.
inline bool same_code(const Code &c, std::uintptr_t code, const CodeFields &f) {
  return c.code == code && c.filename == f.filename && c.qualname == f.qualname &&
         c.linetable == f.linetable && c.first_line == f.first_line;
}

// The fields of the code object at `code`, its type checked; false for anything else. Inline: a
// repeated site checks each of its frames' code objects here (the memo's hit).
inline bool code_fields(const Interp &in, std::uintptr_t code, CodeFields &f) {
  const Layout &l = in.l;
  Window w;
  if (!code || (code & 7) || !w.load(code, l.co_lo, l.co_len) ||
      w.get<std::uintptr_t>(l.ob_type) != in.code_type)
    return false;
  f.filename = w.get<std::uintptr_t>(l.co_filename);
  f.qualname = w.get<std::uintptr_t>(l.co_qualname);
  f.linetable = w.get<std::uintptr_t>(l.co_linetable);
  f.first_line = w.get<std::int32_t>(l.co_firstlineno);
  return true;
}
// The entry of a code object interned before, or nullptr: lock-free, allocation-free.
const Code *find_code(std::uintptr_t code, const CodeFields &f);
// The entry, interned (its record written) the first time; nullptr when its names cannot be read.
const Code *intern(const Interp &in, std::uintptr_t code, const CodeFields &f);
// The line at byte offset `addr` (0: none); `may_allocate` false from a signal handler.
int line_of(const Interp &in, const Code &c, int addr, bool may_allocate = true);
// From the crash handler: a code object never interned, described through the sink.
const Code *describe_in_handler(const Interp &in, std::uintptr_t code, const CodeFields &f,
                                CodeSink *sink);

// fork(): the table's lock is held across it; the child forgets every entry and id.
void code_fork_prepare();
void code_fork_parent();
void code_fork_child();

}  // namespace cmg::shim::py
