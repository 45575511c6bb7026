// SPDX-License-Identifier: Apache-2.0
// Writes a cumemguard log of its own call stack and module map, so the symbolization test can check
// that `report` names these functions, files and lines (this file is built with -g -O0).
#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace cmgtest {

struct Capture {
  void *pcs[32];
  int n = 0;
  int capture_line = 0;
  int inner_line = 0;
  int outer_line = 0;
};

// always_inline inlines even at -O0, so the first return address lies in inlined code.
__attribute__((always_inline)) inline void capture_here(Capture &c) {
  c.capture_line = __LINE__ + 1;
  c.n = backtrace(c.pcs, 32);
}

// noinline keeps each function a frame of its own; at -O0 no call becomes a tail jump.
__attribute__((noinline)) void inner_frame(Capture &c, int depth) {
  c.inner_line = __LINE__ + 1;
  capture_here(c);
  (void)depth;
}

__attribute__((noinline)) void outer_frame(Capture &c) {
  c.outer_line = __LINE__ + 1;
  inner_frame(c, 1);
}

}  // namespace cmgtest

namespace {

struct Mod {
  std::string path, build_id;
  std::uintptr_t base = 0, size = 0;
};

std::string quoted(const std::string &s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string hexs(std::uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "\"0x%lx\"", static_cast<unsigned long>(v));
  return buf;
}

// The module map exactly as the shim writes it: load bias, span of PT_LOAD from the lowest one,
// GNU build-id from the PT_NOTE segments.
int on_object(dl_phdr_info *info, size_t, void *data) {
  auto &mods = *static_cast<std::vector<Mod> *>(data);
  Mod m;
  m.base = info->dlpi_addr;
  if (mods.empty()) {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    m.path = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
  } else {
    m.path = info->dlpi_name ? info->dlpi_name : "";
  }
  if (m.path.empty()) return 0;
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr) &ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD) {
      if (ph.p_vaddr < lo) lo = ph.p_vaddr;
      if (ph.p_vaddr + ph.p_memsz > hi) hi = ph.p_vaddr + ph.p_memsz;
    } else if (ph.p_type == PT_NOTE) {
      const char *p = reinterpret_cast<const char *>(info->dlpi_addr + ph.p_vaddr);
      const char *end = p + ph.p_memsz;
      while (p + sizeof(ElfW(Nhdr)) <= end) {
        auto *nh = reinterpret_cast<const ElfW(Nhdr) *>(p);
        const char *name = p + sizeof(ElfW(Nhdr));
        const char *desc = name + ((nh->n_namesz + 3) & ~3u);
        if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::string(name, 3) == "GNU") {
          for (unsigned j = 0; j < nh->n_descsz; ++j) {
            char hx[3];
            std::snprintf(hx, sizeof hx, "%02x", static_cast<unsigned char>(desc[j]));
            m.build_id += hx;
          }
        }
        p = desc + ((nh->n_descsz + 3) & ~3u);
      }
    }
  }
  m.size = hi > lo ? hi - lo : 0;
  mods.push_back(m);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LOG\n", argv[0]);
    return 2;
  }
  cmgtest::Capture c;
  cmgtest::outer_frame(c);
  std::vector<Mod> mods;
  dl_iterate_phdr(on_object, &mods);

  FILE *f = std::fopen(argv[1], "w");
  if (!f) {
    std::perror(argv[1]);
    return 2;
  }
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  const long long start = static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec;
  std::fprintf(f,
               "{\"cumemguard_log\":1,\"tool\":\"0.1.0\",\"pid\":%d,\"ppid\":%d,\"rank\":-1,"
               "\"host\":\"test\",\"start_unix_ns\":%lld,\"argv\":[%s],\"mode\":\"guard\","
               "\"options\":{\"CUMEMGUARD_STACKS\":\"32\"}}\n",
               getpid(), getppid(), start, quoted(argv[0]).c_str());
  for (const Mod &m : mods) {
    std::fprintf(f, "{\"k\":\"module\",\"path\":%s,\"base\":%s,\"size\":%lu",
                 quoted(m.path).c_str(), hexs(m.base).c_str(), static_cast<unsigned long>(m.size));
    if (!m.build_id.empty()) std::fprintf(f, ",\"build_id\":\"%s\"", m.build_id.c_str());
    std::fprintf(f, "}\n");
  }
  std::string pcs;
  for (int i = 0; i < c.n; ++i)
    pcs += (i ? "," : "") + hexs(reinterpret_cast<std::uintptr_t>(c.pcs[i]));
  std::fprintf(f, "{\"k\":\"stack\",\"id\":1,\"pcs\":[%s]}\n", pcs.c_str());
  const int tid = getpid();
  std::fprintf(f,
               "{\"k\":\"call\",\"seq\":1,\"ts\":1000,\"tid\":%d,\"api\":\"cudaFree\",\"res\":0,"
               "\"dur\":500,\"args\":{\"ptr\":\"0x7f0000000000\"},\"dev\":0,\"stack\":1}\n",
               tid);
  std::fprintf(
      f,
      "{\"k\":\"finding\",\"seq\":2,\"ts\":2000,\"tid\":%d,\"class\":\"double-free\","
      "\"api\":\"cudaFree\",\"action\":\"skip\",\"res\":0,\"args\":{\"ptr\":\"0x7f0000000000\"},"
      "\"msg\":\"pointer 0x7f0000000000 was already freed\",\"stack\":1,\"related\":[{\"what\":"
      "\"first free\",\"seq\":1,\"ts\":1000,\"tid\":%d,\"api\":\"cudaFree\",\"stack\":1}]}\n",
      tid, tid);
  std::fprintf(f, "{\"k\":\"end\",\"ts\":3000}\n");
  std::fclose(f);

  // The first frames the report must print: function, file, line of the call, inlined or not.
  std::printf("cmgtest::capture_here(cmgtest::Capture&)\tsymhelper.cpp\t%d\tinlined\n",
              c.capture_line);
  std::printf("cmgtest::inner_frame(cmgtest::Capture&, int)\tsymhelper.cpp\t%d\t\n", c.inner_line);
  std::printf("cmgtest::outer_frame(cmgtest::Capture&)\tsymhelper.cpp\t%d\t\n", c.outer_line);
  return 0;
}
