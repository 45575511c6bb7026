// SPDX-License-Identifier: Apache-2.0
// Log files as byte sources for the reader, with a bounded number of descriptors open whatever
// the number of logs: a report over the rank logs of a large torchrun or Slurm job (thousands of
// files) must not meet EMFILE at the usual limit of 1,024 descriptors. A file whose turn it is not
// gives its descriptor back and is opened again, checked to be the same file, where it left off.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>

#include "logreader.h"

namespace cmg::report {

class FileSource;

// The descriptors the log files of one report may hold at once; the least recently read gives
// its own back when another needs one.
class FilePool {
 public:
  explicit FilePool(std::size_t max_open) : max_open_(max_open ? max_open : 1) {}
  // A quarter of the soft RLIMIT_NOFILE, at most 256 and at least 1: the rest is left to the
  // symbolizer (module files), the outputs and the standard descriptors.
  static std::size_t default_limit();
  std::size_t limit() const { return max_open_; }
  std::size_t open_now() const { return open_.size(); }
  std::size_t most_open() const { return most_open_; }

 private:
  friend class FileSource;
  void opened(FileSource *f);  // f holds a descriptor now: the least recent others may lose theirs
  void closed(FileSource *f);
  void used(FileSource *f);  // f was read: now the most recent

  std::size_t max_open_;
  std::size_t most_open_ = 0;
  std::list<FileSource *> open_;  // most recently read first
};

// Opens a log file for reading: regular files only, without blocking on a FIFO (regular_file.h);
// a path that is not one gives a reader whose open() fails with why. With a pool, the file's
// descriptor is one of the pool's.
std::unique_ptr<LogReader> open_log_file(const std::string &path, FilePool *pool = nullptr);

}  // namespace cmg::report
