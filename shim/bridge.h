// SPDX-License-Identifier: Apache-2.0
// The legacy-IPC bridge's moving parts (docs/ipc-bridge.md): the exporter's broker thread and the
// importer's client, with their socket I/O and their own driver calls (made through CMG_REAL, so
// they are never recorded as the program's calls); bridge.cpp names the file of each. The
// bookkeeping and every format live in policy/ipc_bridge.h.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "event.h"
#include "ipc_bridge.h"
#include "jsonline.h"
#include "textbuf.h"

namespace cmg::shim::bridge {

// The statuses of the caller's API family (driver CUresult or runtime cudaError_t).
struct Codes {
  int success;
  int invalid_value;    // corrupt handle, bad flags or pointer
  int invalid_handle;   // the export is unknown to its exporter (freed, never made, forged nonce)
  int map_failed;       // the pages could not be brought here (exporter gone, another user, import)
  int invalid_context;  // opened in the exporting process, or no context
  int out_of_memory;    // the importer's driver ran out of memory or address space
};

// ---- exporter --------------------------------------------------------------------------------
ipc::ExportTable &exports();

struct Exported {
  bool ok = false;
  std::array<std::uint8_t, ipc::kHandleSize> handle{};
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;  // of the exported pages
  bool reused = false;
  std::string blocker;  // why not, when !ok
};
// Registers (or finds) the export of these pages, starting the broker on the first export.
Exported export_pages(std::uint64_t res_base, std::uint64_t res_size,
                      const std::vector<ipc::ExportPage> &pages, int dev, const EventRef &made);

// The exit summary's account of exports no peer opened (ExportTable::unrequested_within): the
// summary record's "bridge" member and a line for stderr; nothing when nothing was exported. Exit
// path: allocates nothing.
void unrequested_summary_json(JsonLine &j);
void unrequested_summary_text(TextBuf &t);

// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cached per device.
bool device_supports_posix_fd(int dev);

// ---- importer --------------------------------------------------------------------------------
struct Opened {
  int status = 0;
  std::optional<Finding> finding;  // set when status is an error
  std::uint64_t ptr = 0, span_va = 0, span = 0, bytes = 0;
  std::uint32_t pages = 0;
  unsigned refs = 0;  // 1 for a new import
  int dev = -1;
};
// runtime: the caller is cudaIpcOpenMemHandle (a missing context is created as cudart would).
Opened open(const char *api, const ipc::Handle &h, const Codes &codes, bool runtime,
            const EventRef &ev);

struct Closed {
  bool ours = false;  // false: not a bridge import, the driver decides
  int status = 0;
  unsigned refs_left = 0;
  std::uint64_t bytes = 0;
  int dev = -1;
};
Closed close(std::uint64_t ptr, const Codes &codes);

// ---- process lifetime ------------------------------------------------------------------------
// Called from the shim's pthread_atfork handlers: the child has no broker and no imports (it does
// not own its parent's CUDA objects) and must not hold its parent's sockets open.
void fork_prepare();
void fork_parent();
void fork_child();

}  // namespace cmg::shim::bridge
