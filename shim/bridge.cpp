// SPDX-License-Identifier: Apache-2.0
// The legacy-IPC bridge (bridge.h, docs/ipc-bridge.md) in its parts: the exporter's broker
// (bridge_broker.cpp) and its driver calls (bridge_export.cpp), the importer's client
// (bridge_import.cpp), and their socket I/O (bridge_io.cpp). Here: the process lifetime the
// shim's fork handlers call, in lock order.
#include "bridge.h"

#include "bridge_io.h"

namespace cmg::shim::bridge {

void fork_prepare() {
  broker_fork_prepare();
  import_fork_prepare();
}

void fork_parent() {
  import_fork_parent();
  broker_fork_parent();
}

void fork_child() {
  import_fork_child();
  broker_fork_child();
}

}  // namespace cmg::shim::bridge
