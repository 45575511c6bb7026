// SPDX-License-Identifier: Apache-2.0
// Code objects of the frame reader (see pyframes_code.h).
#include "pyframes_code.h"

#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <unordered_map>
#include <vector>

#include "jsonline.h"
#include "py_linetable.h"
#include "state.h"

namespace cmg::shim::py {
namespace {

// Interned once: immutable entries, found lock-free in a fixed open-addressing table; a code
// object freed and another made at its address is told apart by its names and table (a new
// entry). The table is a cache of g_by_addr, which holds the entry of every code object address
// seen: an entry pushed out of a full neighbourhood of the table is found there again, not
// interned again (a new id and record each time it came back: 21,811 records for 20,000
// functions called once each and a quarter of them again), and an address has one entry at a
// time, the entry of the code object that lives there now.

constexpr std::size_t kCodeSlots = 1 << 14, kProbe = 16;
std::atomic<const Code *> g_codes[kCodeSlots];
std::atomic<std::uint32_t> g_next_code{0};
std::mutex g_code_mu;                          // inserts (and the records they write)
std::vector<const Code *> *g_by_id = nullptr;  // id -> entry, under g_code_mu
std::unordered_map<std::uintptr_t, const Code *> *g_by_addr = nullptr;  // under g_code_mu

// Lines per (code id, instruction): key written last, checked again after the line is read.
constexpr std::size_t kLineSlots = 1 << 15;
struct LineSlot {
  std::atomic<std::uint64_t> key{0};
  std::atomic<std::int32_t> line{0};
};
LineSlot g_lines[kLineSlots];

// The slot of a code object: 14 bits (kCodeSlots) of a multiplicative hash.
std::size_t hash_ptr(std::uintptr_t p) { return (p * 0x9E3779B97F4A7C15ull) >> 50; }

// A str's characters as UTF-8 into out[0, cap): false for what is not a compact str or does not
// fit. No allocation: the crash handler uses it too.
bool read_str_into(const Interp &in, std::uintptr_t s, char *out, std::size_t cap,
                   std::size_t &len) {
  len = 0;
  if (!has_type(in, s, in.str_type)) return false;
  std::int64_t n = 0;
  std::uint32_t state = 0;
  if (!field(s, in.l.str_length, n) || !field(s, in.l.str_state, state)) return false;
  const unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  if (!compact || n < 0 || n > 4096 || (kind != 1 && kind != 2 && kind != 4)) return false;
  std::uintptr_t data = s + (ascii ? in.l.str_ascii_size : in.l.str_compact_size);
  unsigned char chunk[256];
  std::size_t have = 0, used = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (used + kind > have) {  // the next piece of the characters
      const std::size_t left = static_cast<std::size_t>(n - i) * kind;
      have = left < sizeof chunk ? left : sizeof chunk - sizeof chunk % 4;
      if (!read(data, chunk, have)) return false;
      data += have;
      used = 0;
    }
    const unsigned char *p = chunk + used;
    used += kind;
    const std::uint32_t c =
        kind == 1   ? p[0]
        : kind == 2 ? static_cast<std::uint32_t>(p[0] | p[1] << 8)
                    : p[0] | p[1] << 8 | p[2] << 16 | static_cast<std::uint32_t>(p[3]) << 24;
    char u[4];
    std::size_t k = 0;
    if (c < 0x80) {
      u[k++] = static_cast<char>(c);
    } else if (c < 0x800) {
      u[k++] = static_cast<char>(0xc0 | c >> 6);
      u[k++] = static_cast<char>(0x80 | (c & 63));
    } else if (c < 0x10000) {
      u[k++] = static_cast<char>(0xe0 | c >> 12);
      u[k++] = static_cast<char>(0x80 | ((c >> 6) & 63));
      u[k++] = static_cast<char>(0x80 | (c & 63));
    } else {
      u[k++] = static_cast<char>(0xf0 | (c >> 18 & 7));
      u[k++] = static_cast<char>(0x80 | ((c >> 12) & 63));
      u[k++] = static_cast<char>(0x80 | ((c >> 6) & 63));
      u[k++] = static_cast<char>(0x80 | (c & 63));
    }
    if (len + k > cap) return false;
    std::memcpy(out + len, u, k);
    len += k;
  }
  return true;
}

bool read_str(const Interp &in, std::uintptr_t s, std::string &out) {
  char buf[4 * 4096];
  std::size_t len = 0;
  if (!read_str_into(in, s, buf, sizeof buf, len)) return false;
  out.assign(buf, len);
  return true;
}

void write_pycode(const Code &c) {
  State &s = state();
  if (!s.log.is_open()) return;
  char buf[8192 + 512];
  JsonLine j(buf, sizeof buf);
  j.ident("k", "pycode")
      .unum("id", c.id)
      .str("file", c.file)
      .str("name", c.name)
      .num("first", c.first_line);
  s.log.write(j.finish(), now_ns());
}

}  // namespace

// The entry of a code object interned before, or nullptr: lock-free, allocation-free.
const Code *find_code(std::uintptr_t code, const CodeFields &f) {
  const std::size_t h = hash_ptr(code);
  for (std::size_t i = 0; i < kProbe; ++i) {
    const Code *c = g_codes[(h + i) & (kCodeSlots - 1)].load(std::memory_order_acquire);
    if (!c) return nullptr;
    if (same_code(*c, code, f)) return c;
  }
  return nullptr;
}

namespace {

// Into the table, lock held: the slot of this address's earlier entry, else a free one, else
// (a full neighbourhood) the first, whose entry stays in g_by_addr.
void publish_locked(const Code *c) {
  const std::size_t h = hash_ptr(c->code);
  std::size_t at = h & (kCodeSlots - 1);
  for (std::size_t i = 0; i < kProbe; ++i) {
    const std::size_t k = (h + i) & (kCodeSlots - 1);
    const Code *old = g_codes[k].load(std::memory_order_relaxed);
    if (!old || old->code == c->code) {
      at = k;
      break;
    }
  }
  g_codes[at].store(c, std::memory_order_release);
}

}  // namespace

const Code *intern(const Interp &in, std::uintptr_t code, const CodeFields &f) {
  if (const Code *c = find_code(code, f)) return c;
  try {
    std::lock_guard lk(g_code_mu);
    if (!g_by_addr) g_by_addr = new std::unordered_map<std::uintptr_t, const Code *>;
    const Code *&known = (*g_by_addr)[code];
    if (known && same_code(*known, code, f)) {  // pushed out of the table, or just interned
      publish_locked(known);
      return known;
    }
    // New (or a new object at an old address): read its names once, write its record, publish.
    auto c = std::make_unique<Code>(
        Code{code, f.filename, f.qualname, f.linetable, f.first_line, 0, {}, {}});
    if (!read_str(in, f.filename, c->file) || !read_str(in, f.qualname, c->name)) return nullptr;
    if (!g_by_id) g_by_id = new std::vector<const Code *>;
    if (g_by_id->size() == g_by_id->capacity())  // the step that can fail, before the id is taken
      g_by_id->reserve(2 * g_by_id->size() + 64);
    c->id = g_next_code.fetch_add(1, std::memory_order_relaxed) + 1;
    g_by_id->push_back(c.get());
    write_pycode(*c);
    // Published after its record: no stack can name the id before the log has it.
    known = c.release();
    publish_locked(known);
    return known;
  } catch (...) {  // out of memory: the frame ends the Python part, the host goes on
    return nullptr;
  }
}

int line_of(const Interp &in, const Code &c, int addr, bool may_allocate) {
  const std::uint64_t key =
      (static_cast<std::uint64_t>(c.id) << 32) | static_cast<std::uint32_t>(addr + 1);
  LineSlot &slot = g_lines[(key * 0x9E3779B97F4A7C15ull) >> 49];  // 15 bits
  if (slot.key.load(std::memory_order_acquire) == key) {
    const int line = slot.line.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.key.load(std::memory_order_relaxed) == key) return line;
  }
  int line = -1;
  std::int64_t size = 0;
  // The crash handler reads the table into a static buffer (one handler runs at a time).
  static std::uint8_t in_handler[1 << 16];
  if (has_type(in, c.linetable, in.bytes_type) && field(c.linetable, in.l.bytes_size, size) &&
      size >= 0 &&
      size <= (may_allocate ? (1 << 20) : static_cast<std::int64_t>(sizeof in_handler))) {
    std::vector<std::uint8_t> heap;
    std::uint8_t *t = in_handler;
    if (may_allocate) {
      heap.resize(static_cast<std::size_t>(size));
      t = heap.data();
    }
    const auto n = static_cast<std::size_t>(size);
    if (n == 0 || read(c.linetable + in.l.bytes_data, t, n))
      line = py_line_for(std::span<const std::uint8_t>(t, n),
                         in.l.linetable_pep626 ? PyLineTable::Pep626 : PyLineTable::Locations,
                         c.first_line, addr);
  }
  if (!may_allocate) return line < 0 ? 0 : line;  // the cache is not written from a handler
  if (line < 0) line = 0;
  slot.key.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.line.store(line, std::memory_order_relaxed);
  slot.key.store(key, std::memory_order_release);
  return line;
}

// In the handler: a code object never interned gets an id of its own and its record written
// through the sink, from static buffers (one crash handler runs at a time).
const Code *describe_in_handler(const Interp &in, std::uintptr_t code, const CodeFields &f,
                                CodeSink *sink) {
  static char file[4 * 4096], name[4 * 4096];
  static Code c;
  std::size_t fl = 0, nl = 0;
  if (!sink || !read_str_into(in, f.filename, file, sizeof file, fl) ||
      !read_str_into(in, f.qualname, name, sizeof name, nl))
    return nullptr;
  c.code = code;
  c.filename = f.filename;
  c.qualname = f.qualname;
  c.linetable = f.linetable;
  c.first_line = f.first_line;
  c.id = g_next_code.fetch_add(1, std::memory_order_relaxed) + 1;
  sink->code(c.id, std::string_view(file, fl), std::string_view(name, nl), f.first_line);
  return &c;
}

bool code_info(std::uint32_t code, CodeInfo &out) {
  std::lock_guard lk(g_code_mu);
  if (!g_by_id || code == 0 || code > g_by_id->size()) return false;
  const Code *c = (*g_by_id)[code - 1];
  out.file = c->file;
  out.name = c->name;
  out.first_line = c->first_line;
  return true;
}

void code_fork_prepare() {
  g_code_mu.lock();
}

void code_fork_parent() {
  g_code_mu.unlock();
}

void code_fork_child() {
  for (auto &slot : g_codes) slot.store(nullptr, std::memory_order_relaxed);
  for (auto &slot : g_lines) slot.key.store(0, std::memory_order_relaxed);
  g_next_code.store(0, std::memory_order_relaxed);
  if (g_by_id) g_by_id->clear();
  if (g_by_addr) g_by_addr->clear();
  g_code_mu.unlock();
}

}  // namespace cmg::shim::py
