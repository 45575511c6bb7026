// SPDX-License-Identifier: Apache-2.0
// `cumemguard report`: turns event logs into the text report, JSON or a Perfetto trace.
#pragma once

namespace cmg {

// argv[0] is the command's name (not read); the options and logs follow. Returns the exit status:
// 0 clean, 1 findings, 2 usage error or a log that cannot be read, 3 a log of a newer format
// (docs/report.md says which wins when several apply).
int report_main(int argc, char **argv);

}  // namespace cmg
