// SPDX-License-Identifier: Apache-2.0
// Whether the process a log without its end record belongs to is still running on this host.
#pragma once

#include "logreader.h"

namespace cmg::report {

// True when the header's host is this host and its pid is a live process (not a zombie) that
// started no later than the log did: a log read mid-run, not one of a killed process whose pid
// was given to another since.
bool still_running(const Header &h);

}  // namespace cmg::report
