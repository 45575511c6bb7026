// SPDX-License-Identifier: Apache-2.0
// The crash stack (see crash_stack.h).
#include "crash_stack.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "jsonline.h"
#include "loader.h"
#include "pyframes.h"
#include "stackwalk.h"

namespace cmg::shim {
namespace {

constexpr int kMaxFrames = 64;

// Modules with a record in the log: appended by stacks.cpp under its table lock (one writer),
// read by the handler. Past the last slot a module is simply written again at a crash.
constexpr int kModules = 512;
std::atomic<std::uintptr_t> g_lo[kModules], g_hi[kModules];
std::atomic<int> g_modules{0};

bool written(std::uintptr_t pc) {
  const int n = g_modules.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (pc >= g_lo[i].load(std::memory_order_relaxed) &&
        pc < g_hi[i].load(std::memory_order_relaxed))
      return true;
  return false;
}

bool shim_frame(std::uintptr_t pc) { return in_self(reinterpret_cast<void *>(pc)); }

// A fault while walking a corrupted stack: the handler (crash.cpp) is re-entered on this thread
// and jumps back here; sigsetjmp saved the handler's signal mask, which siglongjmp restores.
sigjmp_buf g_walk_jmp;
std::atomic<long> g_walker{0};  // the thread walking, by kernel id

int walk(std::uintptr_t *pcs, int max) {
  static volatile int n;
  n = 0;
  sigset_t faults;
  sigemptyset(&faults);
  sigaddset(&faults, SIGSEGV);
  sigaddset(&faults, SIGBUS);
  if (sigsetjmp(g_walk_jmp, 1) == 0) {
    g_walker.store(syscall(SYS_gettid));
    pthread_sigmask(SIG_UNBLOCK, &faults, nullptr);
    n = libgcc_backtrace(pcs, max, shim_frame);
    pthread_sigmask(SIG_BLOCK, &faults, nullptr);
  }
  g_walker.store(0);
  return n;
}

// The module record of the object holding pc, as stacks.cpp writes it (path, load bias, the span
// of its PT_LOAD segments, build id), from _dl_find_object and the ELF header mapped at the
// object's start.
bool module_record(std::uintptr_t pc, JsonLine &j, std::uintptr_t &lo, std::uintptr_t &hi) {
  dl_find_object fo{};
  if (_dl_find_object(reinterpret_cast<void *>(pc), &fo) != 0 || !fo.dlfo_link_map) return false;
  const auto *eh = static_cast<const ElfW(Ehdr) *>(fo.dlfo_map_start);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) return false;
  const std::uintptr_t base = fo.dlfo_link_map->l_addr;
  const auto *ph = reinterpret_cast<const ElfW(Phdr) *>(
      static_cast<const char *>(fo.dlfo_map_start) + eh->e_phoff);
  lo = UINTPTR_MAX;
  hi = 0;
  const ElfW(Nhdr) *id = nullptr;
  for (int i = 0; i < eh->e_phnum; ++i) {
    if (ph[i].p_type == PT_LOAD) {
      if (base + ph[i].p_vaddr < lo) lo = base + ph[i].p_vaddr;
      if (base + ph[i].p_vaddr + ph[i].p_memsz > hi) hi = base + ph[i].p_vaddr + ph[i].p_memsz;
    }
    if (ph[i].p_type != PT_NOTE || id) continue;
    const char *p = reinterpret_cast<const char *>(base + ph[i].p_vaddr);
    const char *end = p + ph[i].p_memsz;
    while (!id && p + sizeof(ElfW(Nhdr)) <= end) {
      const auto *nh = reinterpret_cast<const ElfW(Nhdr) *>(p);
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
          std::memcmp(p + sizeof *nh, "GNU", 4) == 0)
        id = nh;
      p += sizeof *nh + ((nh->n_namesz + 3) & ~3u) + ((nh->n_descsz + 3) & ~3u);
    }
  }
  static char exe[4096];
  const char *path = fo.dlfo_link_map->l_name;
  if (!path || !*path) {  // the main program
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    path = exe;
  }
  j.str("k", "module").str("path", path).hex("base", base).unum("size", hi - lo);
  if (id) {
    static const char digits[] = "0123456789abcdef";
    char hex[2 * 64];
    const auto *d = reinterpret_cast<const unsigned char *>(id) + sizeof *id + 4;
    const unsigned n = id->n_descsz < 64 ? id->n_descsz : 64;
    for (unsigned k = 0; k < n; ++k) {
      hex[2 * k] = digits[d[k] >> 4];
      hex[2 * k + 1] = digits[d[k] & 15];
    }
    j.str("build_id", std::string_view(hex, 2 * n));
  }
  return true;
}

void append(char *buf, std::size_t cap, std::size_t &used, std::string_view line) {
  if (used + line.size() > cap) return;
  std::memcpy(buf + used, line.data(), line.size());
  used += line.size();
}

// `pycode` records of code objects first seen at the crash, into the crash buffer.
class CrashCodes final : public py::CodeSink {
 public:
  CrashCodes(char *buf, std::size_t cap, std::size_t &used) : buf_(buf), cap_(cap), used_(used) {}
  void code(std::uint32_t id, std::string_view file, std::string_view name, int first) override {
    static char line[2 * 4 * 4096 + 256];
    JsonLine j(line, sizeof line);
    j.ident("k", "pycode").unum("id", id).str("file", file).str("name", name).num("first", first);
    append(buf_, cap_, used_, j.finish());
  }

 private:
  char *buf_;
  std::size_t cap_;
  std::size_t &used_;
};

// The faulting thread's Python frames, in a frame of its own for sigsetjmp.
__attribute__((noinline)) const py::Stack &python_frames(const std::uintptr_t *pcs, int m,
                                                         bool python, CrashCodes &codes) {
  static py::Stack py;  // static: a small frame
  py.n = 0;
  py.end = py::End::Complete;
  if (!python) return py;
  if (sigsetjmp(g_walk_jmp, 1) != 0) {
    py.end = py::End::Unreadable;  // a fault all the same: the frames read before it stay
    g_walker.store(0);
    return py;
  }
  // Checked reads throughout; a fault all the same ends the Python part, not the handler (as in
  // walk(): the faults unblocked for the handler to be re-entered).
  sigset_t faults;
  sigemptyset(&faults);
  sigaddset(&faults, SIGSEGV);
  sigaddset(&faults, SIGBUS);
  g_walker.store(syscall(SYS_gettid));
  pthread_sigmask(SIG_UNBLOCK, &faults, nullptr);
  py::capture_in_handler(pcs, m, true, py, &codes);
  pthread_sigmask(SIG_BLOCK, &faults, nullptr);
  g_walker.store(0);
  return py;
}

}  // namespace

int write_crash_stack(const void *ucv, char *buf, std::size_t cap, std::size_t &used,
                      bool python) {
  const auto *uc = static_cast<const ucontext_t *>(ucv);
  static std::uintptr_t walked[kMaxFrames], pcs[kMaxFrames];  // static: a small frame
  const int n = walk(walked, kMaxFrames);
  // The walk passes through the kernel's signal frame: the stack starts at the interrupted
  // instruction (the fault), whatever the handler's own frames were.
  int at = 0;
  const auto rip = uc ? static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]) : 0;
  while (at < n && walked[at] != rip) ++at;
  int m = 0;
  if (at == n) {
    if (rip) pcs[m++] = rip;
  } else {
    for (int i = at; i < n; ++i) pcs[m++] = walked[i];
  }
  if (!m) return 0;
  static char line[4096 + 512];
  for (int i = 0; i < m; ++i) {
    if (written(pcs[i])) continue;
    JsonLine j(line, sizeof line);
    std::uintptr_t lo = 0, hi = 0;
    if (!module_record(pcs[i], j, lo, hi)) continue;
    append(buf, cap, used, j.finish());
    remember_module_written(lo, hi);
  }
  CrashCodes codes(buf, cap, used);
  const py::Stack &py = python_frames(pcs, m, python, codes);
  JsonLine j(line, sizeof line);
  j.str("k", "stack").unum("id", kCrashStackId).begin_array("pcs");
  for (int i = 0; i < m; ++i) j.elem_hex(pcs[i]);
  j.end_array();
  if (py.n) {
    j.begin_array("py");
    for (int i = 0; i < py.n; ++i) {
      char e[48];
      const int len = std::snprintf(e, sizeof e, "[%u,%u,%d]", unsigned{py.f[i].at}, py.f[i].code,
                                    py.f[i].line);
      j.elem_raw(std::string_view(e, static_cast<std::size_t>(len)));
    }
    j.end_array();
  }
  if (py.end == py::End::Truncated) j.ident("py_end", "truncated");
  if (py.end == py::End::Unreadable) j.ident("py_end", "unreadable");
  const std::string_view rec = j.finish();
  if (used + rec.size() > cap) return 0;
  append(buf, cap, used, rec);
  return m;
}

void remember_module_written(std::uintptr_t lo, std::uintptr_t hi) {
  const int n = g_modules.load(std::memory_order_relaxed);
  if (n >= kModules) return;
  g_lo[n].store(lo, std::memory_order_relaxed);
  g_hi[n].store(hi, std::memory_order_relaxed);
  g_modules.store(n + 1, std::memory_order_release);
}

void forget_modules_written() { g_modules.store(0, std::memory_order_release); }

void crash_stack_warm_up() {
  std::uintptr_t pc[2];
  (void)libgcc_backtrace(pc, 2, shim_frame);
}

bool crash_stack_fault_in_walk() {
  const long walker = g_walker.load();
  if (!walker || walker != syscall(SYS_gettid)) return false;
  siglongjmp(g_walk_jmp, 1);
}

}  // namespace cmg::shim
