// SPDX-License-Identifier: Apache-2.0
// Which Python frame of a stack belongs to the program rather than to the interpreter, the
// standard library or an installed package: the frame a generated suppression names and the
// shim's flush site quotes. Judged by the code object's file alone (co_filename).
#pragma once

#include <string_view>

namespace cmg {

// False for the interpreter's frozen modules ("<frozen importlib._bootstrap>"), the standard
// library (".../lib/python3.X/...") and packages (".../site-packages/...",
// ".../dist-packages/..."); true for everything else, code given with -c ("<string>") included.
bool python_program_file(std::string_view file);

}  // namespace cmg
