// SPDX-License-Identifier: Apache-2.0
// The program's Python frames (see program_frame.h).
#include "program_frame.h"

namespace cmg {

bool python_program_file(std::string_view file) {
  if (file.empty() || file.starts_with("<frozen ")) return false;
  if (file.find("/site-packages/") != file.npos || file.find("/dist-packages/") != file.npos)
    return false;
  // The standard library: a "lib/pythonX.Y/" directory (lib64 too), as sysconfig's stdlib path.
  for (std::size_t at = file.find("/python3."); at != file.npos;
       at = file.find("/python3.", at + 1)) {
    const std::size_t lib = file.rfind('/', at == 0 ? 0 : at - 1);
    const std::string_view dir = file.substr(lib == file.npos ? 0 : lib + 1, at - (lib + 1));
    std::size_t i = at + 9;
    while (i < file.size() && file[i] >= '0' && file[i] <= '9') ++i;
    if ((dir == "lib" || dir == "lib64") && i > at + 9 && i < file.size() && file[i] == '/')
      return false;
  }
  return true;
}

bool interpreter_call_module(std::string_view path) {
  const std::string_view base = path.substr(path.rfind('/') + 1);
  if (base.starts_with("libpython3") || base.starts_with("libffi.so") ||
      base.starts_with("_ctypes."))
    return true;
  if (!base.starts_with("python3")) return false;
  const std::string_view rest = base.substr(7);
  if (rest.empty()) return true;
  if (rest[0] != '.' || rest.size() < 2) return false;
  for (char c : rest.substr(1))
    if (!((c >= '0' && c <= '9') || c == 'd' || c == 't')) return false;
  return true;
}

}  // namespace cmg
