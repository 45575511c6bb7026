// SPDX-License-Identifier: Apache-2.0
// The status directory of a run and the event log check (see run_files.h).
#include "run_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "log_file.h"
#include "run_checks.h"

namespace cmg::tools {
namespace {

struct Dir {
  int fd = -1;
  DIR *d = nullptr;
  explicit Dir(const std::string &path) {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && !(d = fdopendir(fd))) {
      ::close(fd);
      fd = -1;
    }
  }
  ~Dir() {
    if (d) closedir(d);  // closes fd too
  }
  Dir(const Dir &) = delete;
  Dir &operator=(const Dir &) = delete;
};

bool dots(const char *n) {
  return !std::strcmp(n, ".") || !std::strcmp(n, "..");
}

// One record: O_NOFOLLOW (a link is not read through), O_NONBLOCK (a FIFO does not block the
// open), then fstat decides before a byte is read.
bool read_record(int dirfd, const char *name, RunStatusRecord &out) {
  const int fd = ::openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return false;
  struct stat st;
  bool ok = false;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      st.st_size == static_cast<off_t>(sizeof(RunStatusRecord))) {
    alignas(RunStatusRecord) char buf[sizeof(RunStatusRecord)];
    std::size_t got = 0;
    while (got < sizeof buf) {
      const ssize_t n = ::pread(fd, buf + got, sizeof buf - got, static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    ok = valid_run_status(buf, got, out);
  }
  ::close(fd);
  return ok;
}

}  // namespace

std::string make_status_dir(std::string &err) {
  const char *tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp == '/' ? tmp : "/tmp") + "/cumemguard-run.XXXXXX";
  if (!mkdtemp(templ.data())) {
    err = templ.substr(0, templ.size() - 6) + "*: " + std::strerror(errno);
    return {};
  }
  return templ;
}

RunTotals read_status_dir(const std::string &dir) {
  RunTotals t;
  Dir d(dir);
  if (!d.d) return t;
  struct Entry {
    std::uint64_t start;
    std::int64_t pid;
    std::string log;
  };
  std::vector<Entry> opened, unfinished;
  while (dirent *e = readdir(d.d)) {
    if (dots(e->d_name)) continue;
    if (std::string_view(e->d_name).ends_with(".loaded")) {
      // The shim's mark at load (status_channel.h): an empty regular file of this user.
      struct stat st;
      if (::fstatat(d.fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
          st.st_uid == geteuid() && st.st_size == 0) {
        ++t.loaded;
        continue;
      }
    }
    RunStatusRecord r;
    if (!read_record(d.fd, e->d_name, r)) {
      ++t.unreadable;
      continue;
    }
    ++t.processes;
    t.findings += r.findings;
    t.leaks += r.leaks;
    if (r.state == RunStatusRecord::QuickExited) ++t.leaks_unchecked;
    if (r.state == RunStatusRecord::Signalled) ++t.signalled;
    for (std::size_t i = 0; i < RunStatusRecord::kClasses; ++i) t.by_class[i] += r.by_class[i];
    const std::string log = r.log_state == 1 && r.log_len && !r.log_cut
                                ? std::string(r.log, r.log_len)
                                : std::string();
    if (!log.empty()) opened.push_back(Entry{r.start_unix_ns, r.pid, log});
    if (r.state == RunStatusRecord::Running) unfinished.push_back(Entry{r.start_unix_ns, r.pid, log});
  }
  std::sort(unfinished.begin(), unfinished.end(), [](const Entry &a, const Entry &b) {
    return a.start != b.start ? a.start < b.start : a.pid < b.pid;
  });
  // A record of the same pid started later is the image the process exec'd: this one ended there.
  std::vector<std::pair<std::int64_t, std::uint64_t>> last_start;
  for (const Entry &e : opened) last_start.emplace_back(e.pid, e.start);
  for (const Entry &e : unfinished) last_start.emplace_back(e.pid, e.start);
  for (Entry &e : unfinished) {
    const bool execd = std::any_of(last_start.begin(), last_start.end(), [&](const auto &p) {
      return p.first == e.pid && p.second > e.start;
    });
    if (!execd) t.unfinished.push_back({e.pid, std::move(e.log)});
  }
  std::sort(opened.begin(), opened.end(), [](const Entry &a, const Entry &b) {
    return a.start != b.start ? a.start < b.start : a.pid < b.pid;
  });
  for (Entry &e : opened)
    if (std::find(t.logs.begin(), t.logs.end(), e.log) == t.logs.end())
      t.logs.push_back(std::move(e.log));
  return t;
}

void remove_status_dir(const std::string &dir) {
  {
    Dir d(dir);
    if (!d.d) return;
    std::vector<std::string> names;
    while (dirent *e = readdir(d.d))
      if (!dots(e->d_name)) names.emplace_back(e->d_name);
    for (const std::string &n : names)
      if (::unlinkat(d.fd, n.c_str(), 0) != 0 && errno == EISDIR)
        (void)::unlinkat(d.fd, n.c_str(), AT_REMOVEDIR);
  }
  (void)::rmdir(dir.c_str());
}

void pass_up_totals(const std::string &outer_dir, const RunTotals &t) {
  // One record per log, at least one per process that ended by _exit or a fatal signal (its
  // leaks not checked, marked on the first records: a process with a log is not counted twice).
  const std::size_t unchecked = t.leaks_unchecked + t.signalled;
  const std::size_t records = std::max({std::size_t{1}, t.logs.size(), unchecked});
  std::size_t next_name = 64;
  for (std::size_t k = 0; k < records; ++k) {
    RunStatusRecord r{};
    start_run_status(r, getpid(), 0);
    r.state = k < t.leaks_unchecked ? RunStatusRecord::QuickExited
              : k < unchecked       ? RunStatusRecord::Signalled
                                    : RunStatusRecord::Exited;
    if (k == 0) {
      r.findings = t.findings;
      r.leaks = t.leaks;
      std::memcpy(r.by_class, t.by_class, sizeof r.by_class);
    }
    if (k < t.logs.size()) {
      set_run_status_log(r, t.logs[k].data(), t.logs[k].size());
      r.log_state = 1;
    }
    // The names the shim uses, `<pid>.<n>`, past the ones a shim of this process could take;
    // each record's search starts after the last one's name (from 64 each time, N records
    // made N^2/2 failed opens and lost every record past 4,096 names); 4,096 names more than
    // records are tried, for names taken before.
    int fd = -1;
    for (; fd < 0 && next_name < 64 + records + 4096; ++next_name) {
      const std::string path =
          outer_dir + "/" + std::to_string(getpid()) + "." + std::to_string(next_name);
      fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0 && errno != EEXIST) return;  // not ours to write: the outer run goes without
    }
    if (fd < 0) return;
    const char *p = reinterpret_cast<const char *>(&r);
    std::size_t done = 0;
    while (done < sizeof r) {
      const ssize_t n = ::write(fd, p + done, sizeof r - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
  }
}

std::string log_target_problem(const std::string &pattern) {
  const std::size_t slash = pattern.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : pattern.substr(0, slash);
  const std::string base = slash == std::string::npos ? pattern : pattern.substr(slash + 1);
  if (base.empty()) return "it names a directory, not a file";
  // Placeholders in the directory part: what differs between processes cannot be checked here;
  // the fixed directories above it must exist for any expansion to.
  const std::size_t pct = dir.find('%');
  const bool fixed = pct == std::string::npos;
  if (!fixed) {
    const std::size_t up = dir.rfind('/', pct);
    dir = up == std::string::npos ? "." : up == 0 ? "/" : dir.substr(0, up);
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return "directory " + dir + ": " + std::strerror(errno);
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (!fixed) return {};
  if (::faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0)
    return "directory " + dir + " is not writable (" + std::strerror(errno) + ")";
  // The permission bits are not the last word: root passes every access(2) check, yet /proc and
  // /sys create no file, and a read-only mount or an immutable file refuses the write. So the
  // launcher finds out the way the shim will, by creating a file there, but a probe file of its
  // own beside the log, never the log's path: another process on the same name (a second run at
  // once) may be creating that path at this moment, and removing what it made would take its log
  // away (launcher-log-shared-concurrent: 6 of 25 runs lost a process that way).
  auto probe_dir = [&]() -> std::string {
    std::string probe = dir + "/.cumemguard-probe.XXXXXX";
    const int fd = ::mkostemp(probe.data(), O_CLOEXEC);
    if (fd < 0)
      return "directory " + dir + ": cannot create a file there (" + std::strerror(errno) + ")";
    ::close(fd);
    (void)::unlink(probe.c_str());
    return {};
  };
  if (base.find('%') != std::string::npos) return probe_dir();
  constexpr int kFlags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  if (::lstat(pattern.c_str(), &st) != 0) return probe_dir();  // a new file
  std::string why = log_file_refusal(st.st_mode, st.st_uid, st.st_nlink, geteuid());
  // The shim may write to a character device, but a run's log is a file to read afterwards: the
  // list of logs would name /dev/null, which the report cannot read.
  if (why.empty() && !S_ISREG(st.st_mode))
    return S_ISCHR(st.st_mode) ? "not a regular file (a character device)"
                               : "not a regular file";
  if (why.empty()) {  // opened for writing, not truncated
    const int fd = ::open(pattern.c_str(), kFlags);
    if (fd < 0 && errno == ENOENT) return probe_dir();  // removed meanwhile: a new file again
    if (fd < 0) return std::string("not writable (") + std::strerror(errno) + ")";
    ::close(fd);
    why = log_overwrite_problem(pattern);
  }
  return why;
}

}  // namespace cmg::tools
