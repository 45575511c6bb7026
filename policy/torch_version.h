// SPDX-License-Identifier: Apache-2.0
// Which PyTorch a process runs or a machine has installed: version strings as torch writes them
// (torch/version.py, the wheel's dist-info directory, a versioned library file name), parsed
// without importing torch. The readers of files are passed in, so this stays pure (the shim reads
// with open/read, the tools with the C++ library, the tests from memory).
#pragma once

#include <compare>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cmg::torchconf {

struct TorchVersion {
  int major = 0, minor = 0, patch = 0;
  std::string text;  // as written: "2.11.0+cu130", "2.10.0a0+git1234567"

  // Release order; the local part ("+cu130") and pre-release tags do not count.
  std::strong_ordering operator<=>(const TorchVersion &o) const {
    if (auto c = major <=> o.major; c != 0) return c;
    if (auto c = minor <=> o.minor; c != 0) return c;
    return patch <=> o.patch;
  }
  bool operator==(const TorchVersion &o) const { return (*this <=> o) == 0; }
  std::string release() const;  // "2.11.0"
};

// "2.11.0+cu130", "2.9.1", "2.10" (patch 0), "2.10.0a0+git…", "v2.8.0". nullopt when the text does
// not start with MAJOR.MINOR.
std::optional<TorchVersion> parse_torch_version(std::string_view text);
// For literals in the rule table ("2.10.0"); a malformed literal is a programming error (abort).
TorchVersion torch_version(std::string_view text);

// The version the allocator-config grammar of torch_conf was transliterated from and checked
// against (the H200 runs: 2.11.0), the default when no release is known. Every other release has
// its row in policy/torch_releases.def (grammar_for in torch_conf.h).
TorchVersion grammar_version();

// `__version__ = '2.11.0+cu130'` in torch/version.py (single or double quotes, any spacing).
std::optional<std::string> version_in_version_py(std::string_view file_text);
// "torch-2.11.0+cu130.dist-info" -> "2.11.0+cu130" (also "torch-2.9.1.dist-info/"). Other
// distributions' directories (torchvision-…, torch_memory_saver-…) give nullopt.
std::optional<std::string> version_in_dist_info(std::string_view dir_name);
// A versioned library file name: "libtorch_cuda.so.2.11.0", "libc10.so.2.9" -> "2.11.0", "2.9";
// nullopt for the unversioned names of the wheels ("libc10_cuda.so").
std::optional<std::string> version_in_library_name(std::string_view path);

// The libraries that identify PyTorch in a process: libc10*.so* and libtorch*.so* (basename).
bool is_torch_library(std::string_view path);
// The libraries whose cudaMalloc is the CUDA caching allocator's: libc10_cuda.so* (the allocator)
// and libtorch_cuda.so* (where some builds fold it in).
bool is_torch_allocator_library(std::string_view path);

struct FoundVersion {
  TorchVersion version;
  std::string source;  // where it was read: ".../torch/version.py", ".../torch-2.11.0.dist-info",
                       // ".../libtorch_cuda.so.2.11.0"
};

struct FileAccess {
  std::function<std::optional<std::string>(const std::string &path)> read;  // small text files
  std::function<std::vector<std::string>(const std::string &dir)> list;     // entry names
};

// The version of the torch package directory `torch_dir` (".../site-packages/torch"): its
// version.py, else a torch-*.dist-info next to it.
std::optional<FoundVersion> version_of_package(const std::string &torch_dir, const FileAccess &fs);
// The version of a loaded PyTorch library: its versioned file name, else the package it sits in
// (a wheel's ".../torch/lib/libc10_cuda.so" -> ".../torch").
std::optional<FoundVersion> version_of_library(const std::string &lib_path, const FileAccess &fs);

}  // namespace cmg::torchconf
