// SPDX-License-Identifier: Apache-2.0
// Log files with a bounded number of descriptors (see log_files.h).
#include "log_files.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "regular_file.h"

namespace cmg::report {

// One log file. Reads with pread(2) at its own offset, so a descriptor opened again needs no seek;
// the identity (st_dev, st_ino) taken at the first open is checked at every later one, so a file
// replaced between two reads is an error, not another file's bytes.
class FileSource final : public ByteSource {
 public:
  FileSource(std::string path, FilePool *pool, const RegularFile &f)
      : path_(std::move(path)),
        pool_(pool),
        fd_(f.fd),
        dev_(f.dev),
        ino_(f.ino),
        size_(static_cast<std::uint64_t>(f.size)) {
    if (pool_) pool_->opened(this);
  }
  ~FileSource() override { release(); }

  long read(char *buf, std::size_t n) override {
    if (fd_ < 0 && !reopen()) return -1;
    if (pool_) pool_->used(this);
    for (;;) {
      const ssize_t r = ::pread(fd_, buf, n, static_cast<off_t>(offset_));
      if (r < 0 && errno == EINTR) continue;
      if (r > 0) offset_ += static_cast<std::uint64_t>(r);
      return static_cast<long>(r);
    }
  }
  std::optional<std::uint64_t> size_hint() const override { return size_; }
  void release() override {
    if (fd_ < 0) return;
    ::close(fd_);
    fd_ = -1;
    if (pool_) pool_->closed(this);
  }

  // The pool took the descriptor back (another file's turn); reopen() gets it again.
  void evict() {
    ::close(fd_);
    fd_ = -1;
  }
  std::list<FileSource *>::iterator where;  // in the pool's list while open

 private:
  bool reopen() {
    const RegularFile f = open_regular(path_.c_str());
    if (f.fd < 0) {
      // Deleted since (ENOENT), or something else than a file at the path now.
      errno = f.error ? f.error : ESTALE;
      return false;
    }
    if (f.dev != dev_ || f.ino != ino_) {
      ::close(f.fd);
      errno = ESTALE;  // "Stale file handle": the path names another file now
      return false;
    }
    fd_ = f.fd;
    if (pool_) pool_->opened(this);
    return true;
  }

  std::string path_;
  FilePool *pool_;
  int fd_;
  dev_t dev_;
  ino_t ino_;
  std::uint64_t size_;
  std::uint64_t offset_ = 0;
};

std::size_t FilePool::default_limit() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 256;
  return std::clamp<std::size_t>(static_cast<std::size_t>(rl.rlim_cur) / 4, 1, 256);
}

void FilePool::opened(FileSource *f) {
  open_.push_front(f);
  f->where = open_.begin();
  while (open_.size() > max_open_) {
    FileSource *old = open_.back();
    open_.pop_back();
    old->evict();
  }
  most_open_ = std::max(most_open_, open_.size());
}

void FilePool::closed(FileSource *f) {
  open_.erase(f->where);
}

void FilePool::used(FileSource *f) {
  if (f->where != open_.begin()) open_.splice(open_.begin(), open_, f->where);
}

std::unique_ptr<LogReader> open_log_file(const std::string &path, FilePool *pool) {
  const RegularFile f = open_regular(path.c_str());
  if (f.fd < 0) {
    std::string why = f.why ? f.why : "cannot open";
    // A FIFO is read from standard input, where the shell has already opened it.
    if (why.find("FIFO") != std::string::npos) why += "; a pipe is read as '-' on standard input";
    return std::make_unique<LogReader>(nullptr, path, "cannot open: " + why);
  }
  return std::make_unique<LogReader>(std::make_unique<FileSource>(path, pool, f), path);
}

}  // namespace cmg::report
