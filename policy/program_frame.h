// SPDX-License-Identifier: Apache-2.0
// Which Python frame of a stack belongs to the program rather than to the interpreter, the
// standard library or an installed package: the frame a generated suppression names and the
// shim's flush site quotes. Judged by the code object's file alone (co_filename). And which native
// frames are the interpreter's own call into C, which stacks fold (the report, live messages).
#pragma once

#include <string_view>

namespace cmg {

// False for the interpreter's frozen modules ("<frozen importlib._bootstrap>"), the standard
// library (".../lib/python3.X/...") and packages (".../site-packages/...",
// ".../dist-packages/..."); true for everything else, code given with -c ("<string>") included.
bool python_program_file(std::string_view file);

// The modules of CPython's own call machinery, by path: libpython (or the interpreter executable
// it is linked into, as Debian's /usr/bin/python3.11 is: python3, python3.11, python3.12d), the
// ctypes extension (_ctypes.*) and libffi. Their frames just above a stack's innermost Python
// frame are the interpreter calling into C, the same in every stack of such a call.
bool interpreter_call_module(std::string_view path);

}  // namespace cmg
