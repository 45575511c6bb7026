// SPDX-License-Identifier: Apache-2.0
// PyTorch version strings and where torch keeps them. A wheel's libraries are unversioned
// (site-packages/torch/lib/libc10_cuda.so), so the package beside them says which torch it is:
// torch/version.py (written by torch's setup.py: `__version__ = '2.11.0+cu130'`) or the
// installer's torch-<version>.dist-info directory. Distribution builds may version the file name.
#include "torch_version.h"

#include <charconv>
#include <cstdlib>

namespace cmg::torchconf {
namespace {

std::string_view basename(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::string_view dirname(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string_view(".") : path.substr(0, slash);
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Reads a decimal number at `s[i]`; false when there is none.
bool number(std::string_view s, std::size_t &i, int &out) {
  const std::size_t b = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  if (i == b || i - b > 6) return false;
  std::from_chars(s.data() + b, s.data() + i, out);
  return true;
}

}  // namespace

std::string TorchVersion::release() const {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::optional<TorchVersion> parse_torch_version(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  if (!s.empty() && (s.front() == 'v' || s.front() == 'V')) s.remove_prefix(1);
  TorchVersion v;
  std::size_t i = 0;
  if (!number(s, i, v.major) || i >= s.size() || s[i] != '.') return std::nullopt;
  ++i;
  if (!number(s, i, v.minor)) return std::nullopt;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!number(s, i, v.patch)) return std::nullopt;
  }
  // What may follow: a pre-release or dev tag ("a0", "rc1", ".dev2025"), a local part ("+cu130").
  if (i < s.size() && is_digit(s[i])) return std::nullopt;
  v.text = std::string(s);
  return v;
}

TorchVersion torch_version(std::string_view text) {
  std::optional<TorchVersion> v = parse_torch_version(text);
  if (!v) std::abort();
  return *v;
}

TorchVersion grammar_version() {
  return torch_version("2.11.0");
}

std::optional<std::string> version_in_version_py(std::string_view t) {
  for (std::size_t at = t.find("__version__"); at != std::string_view::npos;
       at = t.find("__version__", at + 1)) {
    // Only an assignment at the start of a line.
    if (at > 0 && t[at - 1] != '\n') continue;
    std::size_t i = at + 11;
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
    // `__version__: str = '…'` (annotated) or `__version__ = '…'`.
    if (i < t.size() && t[i] == ':') {
      const std::size_t eq = t.find('=', i);
      if (eq == std::string_view::npos || t.substr(i, eq - i).find('\n') != std::string_view::npos)
        continue;
      i = eq;
    }
    if (i >= t.size() || t[i] != '=') continue;
    ++i;
    while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
    if (i >= t.size() || (t[i] != '\'' && t[i] != '"')) continue;
    const char q = t[i++];
    const std::size_t end = t.find(q, i);
    if (end == std::string_view::npos) continue;
    std::string v(t.substr(i, end - i));
    if (parse_torch_version(v)) return v;
  }
  return std::nullopt;
}

std::optional<std::string> version_in_dist_info(std::string_view name) {
  name = basename(name.ends_with('/') ? name.substr(0, name.size() - 1) : name);
  constexpr std::string_view kPrefix = "torch-", kSuffix = ".dist-info";
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  std::string v(name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size()));
  if (!parse_torch_version(v)) return std::nullopt;
  return v;
}

std::optional<std::string> version_in_library_name(std::string_view path) {
  const std::string_view name = basename(path);
  const std::size_t so = name.find(".so.");
  if (so == std::string_view::npos || !is_torch_library(name)) return std::nullopt;
  std::string v(name.substr(so + 4));
  if (!parse_torch_version(v)) return std::nullopt;  // "libc10.so.2" names only the ABI
  return v;
}

bool is_torch_library(std::string_view path) {
  const std::string_view name = basename(path);
  return (name.starts_with("libc10") || name.starts_with("libtorch")) &&
         name.find(".so") != std::string_view::npos;
}

bool is_torch_allocator_library(std::string_view path) {
  const std::string_view name = basename(path);
  return name.starts_with("libc10_cuda.so") || name.starts_with("libtorch_cuda.so");
}

std::optional<FoundVersion> version_of_package(const std::string &torch_dir, const FileAccess &fs) {
  const std::string py = torch_dir + "/version.py";
  if (fs.read) {
    if (std::optional<std::string> text = fs.read(py)) {
      if (std::optional<std::string> v = version_in_version_py(*text))
        return FoundVersion{*parse_torch_version(*v), py};
    }
  }
  if (fs.list) {
    const std::string site(dirname(torch_dir));
    for (const std::string &e : fs.list(site)) {
      if (std::optional<std::string> v = version_in_dist_info(e))
        return FoundVersion{*parse_torch_version(*v), site + "/" + e};
    }
  }
  return std::nullopt;
}

std::optional<FoundVersion> version_of_library(const std::string &lib_path, const FileAccess &fs) {
  if (std::optional<std::string> v = version_in_library_name(lib_path))
    return FoundVersion{*parse_torch_version(*v), lib_path};
  const std::string_view dir = dirname(lib_path);  // .../torch/lib
  if (basename(dir) != "lib") return std::nullopt;
  const std::string_view pkg = dirname(dir);  // .../torch
  if (basename(pkg) != "torch") return std::nullopt;
  return version_of_package(std::string(pkg), fs);
}

}  // namespace cmg::torchconf
