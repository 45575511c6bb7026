// SPDX-License-Identifier: Apache-2.0
// `cumemguard report`: turns event logs into the text report, JSON, an HTML page or a Perfetto
// trace.
#pragma once

namespace cmg {

// argv[0] is the command's name (not read); the options and logs follow. Returns the exit status:
// 0 clean, 1 findings or a crashed/aborted process, 64 usage error, 66 a log that cannot be read,
// 73 an output that cannot be written (docs/report.md says which wins when several apply).
int report_main(int argc, char **argv);

}  // namespace cmg
