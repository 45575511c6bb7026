// SPDX-License-Identifier: Apache-2.0
// Fake driver memory model: linear arena, host blocks, VMM objects and IPC imports, one lock.
#pragma once

#include "driver_internal.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fc {

inline constexpr std::size_t kGranularity = std::size_t{2} << 20;  // real-driver.md D19
inline constexpr std::size_t kLinearAlign = 512;  // cudaMalloc pointers are 512-byte aligned
inline constexpr std::size_t kArenaHeader = std::size_t{64} << 10;

inline std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

// One memfd, mapped once MAP_SHARED (sparse: nothing is touched until used), carved into one
// segment per device. Freed blocks go to per-size LIFO bins so that the block freed last is the
// next one handed out for the same size (real-driver.md D18, bug-patterns.md P30).
struct Arena {
  struct Segment {
    std::size_t begin = 0, end = 0, bump = 0;
    std::map<std::size_t, std::vector<std::size_t>> bins;  // size -> offsets, last freed at back
  };
  int fd = -1;
  char *base = nullptr;
  std::size_t size = 0;
  unsigned long long nonce = 0;
  std::vector<Segment> segs;

  bool open(const char *name, std::size_t per_device, int devices);
  std::optional<std::size_t> carve(int dev, std::size_t size);
  void give_back(int dev, std::size_t offset, std::size_t size);
};

// Written at offset 0 of every arena: a legacy IPC importer checks it so that a reused fd number
// in the exporter never maps the wrong file.
struct ArenaHeader {
  char magic[16];
  long long pid;
  unsigned long long nonce;
};
inline constexpr char kArenaMagic[16] = "fakecuda-arena1";

// Graph: the address of a graph allocation (driver_capture.cpp), charged only while it is live.
enum class LinearKind : unsigned char { Device, Managed, Async, Graph };

struct Linear {
  std::size_t size;     // as requested
  std::size_t rounded;  // as carved and charged
  int dev;
  LinearKind kind;
  Arena *arena;
  std::size_t offset;
  unsigned long long id;
};

struct HostBlock {
  std::size_t size;
  std::size_t mapped;
  unsigned long long id;
};

struct PhysAlloc {
  int fd = -1;
  std::size_t size = 0;
  CUmemAllocationProp prop{};
  int charged_dev = -1;  // device whose memory it uses in this process; -1 host or imported
  bool imported = false;
  unsigned handle_refs = 0;
  unsigned mappings = 0;
  unsigned bindings = 0;  // multicast bindings of (part of) it: they keep it alive (driver_multicast)
};

struct Mapping {
  std::size_t size;
  unsigned long long alloc;
  std::size_t offset;
  unsigned char dev_access[kMaxDevices];  // CUmemAccess_flags per device
  unsigned char host_access;
};

// A multicast object (cuMulticastCreate): its team and what each device bound to it.
struct Multicast {
  std::size_t size = 0;
  unsigned num_devices = 0;
  unsigned long long handle_types = 0;
  std::vector<int> devices;  // added so far, in order
  struct Binding {
    int dev;
    std::size_t mc_offset, size;
    unsigned long long alloc;
    std::size_t mem_offset;
  };
  std::vector<Binding> bindings;
};

struct Reservation {
  std::size_t size;
  std::map<std::uintptr_t, Mapping> maps;  // by start address
};

struct HandleRef {
  unsigned long long alloc;
  unsigned refs;  // > 1 only with FAKECUDA_RETAIN_SAME
};

struct IpcKey {
  long long pid;
  int fd;
  unsigned long long nonce;
  std::size_t offset;
  bool operator<(const IpcKey &o) const {
    return std::tie(pid, fd, nonce, offset) < std::tie(o.pid, o.fd, o.nonce, o.offset);
  }
};

struct Import {
  IpcKey key;
  char *map_base;
  std::size_t map_len;
  std::size_t size;
  int dev;
  unsigned refs;
};

// What an address belongs to (cuPointerGetAttribute, copies, cuMemGetAddressRange).
struct Region {
  enum Kind { None, Linear, Host, Vmm, VmmUnmapped, Import } kind = None;
  std::uintptr_t base = 0;  // the range RANGE_START_ADDR reports
  std::size_t size = 0;
  std::uintptr_t map_base = 0;  // the mapping itself (VMM chunk, or == base)
  std::size_t map_size = 0;
  int dev = 0;              // -1 for host memory
  LinearKind lkind = LinearKind::Device;
  unsigned long long id = 0;
  unsigned long long handle_types = 0;
  unsigned access = 0;      // CUmemAccess_flags the current device has (VMM), RW otherwise
  bool any_access = false;  // VMM: some location was given access
};

struct Memory {
  std::mutex mu;
  Arena arena;
  bool arena_tried = false;
  std::map<std::uintptr_t, Linear> linear;
  std::map<std::uintptr_t, HostBlock> host;
  std::unordered_map<unsigned long long, PhysAlloc> allocs;
  unsigned long long next_id = 1;  // allocation ids (linear, host and physical share the counter)
  std::unordered_map<unsigned long long, HandleRef> handles;
  // The properties a released value last had: the real driver still answers
  // cuMemGetAllocationPropertiesFromHandle for it with SUCCESS (real-driver.md D23, measured).
  std::unordered_map<unsigned long long, CUmemAllocationProp> released_props;
  std::vector<unsigned long long> free_values;  // released handle values, last released at back
  unsigned long long next_value = 0x55d0c0a3b000ULL;
  std::map<std::uintptr_t, Reservation> reservations;
  std::vector<std::pair<std::uintptr_t, std::size_t>> freed_va;  // oldest first
  std::map<std::uintptr_t, Import> imports;
  std::map<IpcKey, std::uintptr_t> import_by_key;
  // Multicast objects by handle value (values come from the same issue as allocation handles).
  std::unordered_map<unsigned long long, Multicast> multicasts;
  std::size_t used[kMaxDevices] = {};

  // All with mu held.
  Arena *arena_for();
  Region describe(std::uintptr_t p);
  Reservation *reservation_of(std::uintptr_t p, std::size_t n, std::uintptr_t *base);
  std::pair<const std::uintptr_t, Mapping> *mapping_at(std::uintptr_t p);
  unsigned long long issue_value();
  void retire_value(unsigned long long v);
  void drop_if_unused(unsigned long long alloc);
  // cuMemRelease of a multicast handle: the object and its bindings go (driver_multicast.cpp).
  bool release_multicast(unsigned long long value);
};

Memory &mem();

}  // namespace fc
