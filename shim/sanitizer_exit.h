// SPDX-License-Identifier: Apache-2.0
// The exit summary of a program built with a sanitizer. AddressSanitizer's error report and
// LeakSanitizer's leak check at exit end the process with the exit_group system call (the
// sanitizer's Die()): no exit handler runs after them, so without this the shim's summary, its
// leak records and the log's `end` were lost whenever a sanitized program had a host leak or a
// host memory error, and the report read the log as cut off. The sanitizers call one death
// callback before they exit: the shim sets it at load to write the exit records then.
#pragma once

namespace cmg::shim {

// At load, when a sanitizer runtime is in the process (__sanitizer_set_death_callback resolves):
// sets the death callback. A program that sets its own later replaces it (the summary is then lost
// in those exits, as without this). Nothing when no sanitizer is loaded.
void sanitizer_exit_install();

}  // namespace cmg::shim
