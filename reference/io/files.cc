// Checked reads and atomic writes (see files.h).
#include "reference/io/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

namespace attest {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

// What a non-regular file is, for messages (stat(2) S_IS* macros).
std::string_view KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a plain file";
}

// Read chunk between deadline checks: large enough to stream at disk speed.
constexpr uint64_t kReadChunk = uint64_t{16} << 20;

struct TempRegistry {
  std::mutex mu;
  std::set<std::string> paths;
};

TempRegistry& Temps() {
  // Never destroyed: a signal cleanup may run while static destructors do.
  static TempRegistry* registry = new TempRegistry();
  return *registry;
}

Status WriteAll(int fd, const std::byte* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Error{fmt::format("{}: write failed: {}", path, ErrnoText(errno))};
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

}  // namespace

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(other.fd_), size_(other.size_), path_(std::move(other.path_)), limits_(other.limits_) {
  other.fd_ = -1;
}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    limits_ = other.limits_;
    other.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status RegularFile::Read(void* dst, uint64_t count) {
  auto* p = static_cast<std::byte*>(dst);
  while (count > 0) {
    if (limits_.deadline && std::chrono::steady_clock::now() >= *limits_.deadline) {
      return Error{fmt::format("{}: reading the {} ran past its deadline", path_, limits_.what)};
    }
    const size_t chunk = static_cast<size_t>(std::min(count, kReadChunk));
    const ssize_t r = ::read(fd_, p, chunk);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Error{fmt::format("{}: read failed: {}", path_, ErrnoText(errno))};
    }
    if (r == 0)
      return Error{
          fmt::format("{}: short read (was the file changed while being "
                      "read?)",
                      path_)};
    p += r;
    count -= static_cast<uint64_t>(r);
  }
  return {};
}

Expected<RegularFile> OpenRegularFile(const std::string& path, const ReadLimits& limits) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (fifo(7)).
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  if (!limits.follow_symlinks) flags |= O_NOFOLLOW;
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Error{fmt::format("{}: cannot open: no such file", path)};
    if (err == ELOOP && !limits.follow_symlinks) {
      return Error{
          fmt::format("{}: is a symlink; the {} must be a regular file", path, limits.what)};
    }
    return Error{fmt::format("{}: cannot open: {}", path, ErrnoText(err))};
  }
  RegularFile f;
  f.fd_ = fd;
  f.path_ = path;
  f.limits_ = limits;
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return Error{fmt::format("{}: cannot stat: {}", path, ErrnoText(errno))};
  if (!S_ISREG(st.st_mode)) {
    return Error{
        fmt::format("{}: cannot open: {}, not a regular file (the {} must be a regular "
                    "file)",
                    path, KindOf(st.st_mode), limits.what)};
  }
  // Reads of a regular file never wait for a writer; blocking mode again for plain read(2).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > limits.max_bytes) {
    return Error{fmt::format("{}: is {} bytes, over the {}-byte limit for this {}", path, f.size_,
                             limits.max_bytes, limits.what)};
  }
  return f;
}

Expected<std::string> ReadRegularFile(const std::string& path, const ReadLimits& limits) {
  auto f = OpenRegularFile(path, limits);
  if (!f) return f.error();
  std::string text(static_cast<size_t>(f->size()), '\0');
  if (Status s = f->Read(text.data(), f->size()); !s) return s.error();
  return text;
}

Status WriteFileAtomic(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  const std::span<const std::byte> parts[] = {bytes};
  return WriteFileAtomic(path, parts);
}

Status WriteFileAtomic(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> parts) {
  // start_writeback: a regular file's device writes start after every kWriteChunk bytes, so
  // that they overlap the copying of the rest and the final fsync waits less.
  auto write_parts = [&](int fd, const std::string& target, bool start_writeback) -> Status {
    constexpr size_t kWriteChunk = size_t{8} << 20;
    uint64_t offset = 0;
    for (const auto& bytes : parts) {
      for (size_t done = 0; done < bytes.size();) {
        const size_t n = std::min(kWriteChunk, bytes.size() - done);
        if (Status s = WriteAll(fd, bytes.data() + done, n, target); !s) return s;
#ifdef __linux__
        // Only a hint: errors surface at fsync.
        if (start_writeback) ::sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE);
#else
        (void)start_writeback;
#endif
        done += n;
        offset += n;
      }
    }
    return {};
  };
  const std::string target = path.string();
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return Error{fmt::format("{}: cannot write: is a directory", target)};
    if (!S_ISREG(st.st_mode)) {
      // A device or FIFO (/dev/stdout, /dev/null, a pipe someone reads): nothing to replace.
      // O_NONBLOCK: a FIFO without a reader fails with ENXIO (fifo(7)) instead of waiting.
      const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
      if (fd < 0)
        return Error{fmt::format("{}: cannot open for writing: {}", target, ErrnoText(errno))};
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      Status s = write_parts(fd, target, false);
      ::close(fd);
      return s;
    }
  }
  // 1. A fresh temporary name in the target's folder (rename(2) does not cross file systems).
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = (dir / fmt::format(".{}.attest-tmp-{}-{}", path.filename().string(), ::getpid(),
                             counter.fetch_add(1)))
              .string();
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) {
      return Error{fmt::format("{}: cannot open for writing: {}", target, ErrnoText(errno))};
    }
  }
  if (fd < 0) return Error{fmt::format("{}: cannot create a temporary file beside it", target)};
  RegisterTempPath(tmp);
  auto fail = [&](std::string message) -> Status {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    UnregisterTempPath(tmp);
    return Error{std::move(message)};
  };
  // 2. The bytes, flushed to the device (so that a later ENOSPC of delayed allocation is
  //    reported here, not lost at close).
  if (Status s = write_parts(fd, target, true); !s) return fail(s.error().message);
  if (::fsync(fd) != 0) return fail(fmt::format("{}: write failed: {}", target, ErrnoText(errno)));
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return fail(fmt::format("{}: write failed: {}", target, ErrnoText(errno)));
  // 3. Replace the target in one step.
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    return fail(fmt::format("{}: cannot replace: {}", target, ErrnoText(errno)));
  }
  UnregisterTempPath(tmp);
  return {};
}

Status WriteFileAtomic(const std::filesystem::path& path, std::string_view text) {
  return WriteFileAtomic(path, std::as_bytes(std::span(text.data(), text.size())));
}

Expected<FolderLock> FolderLock::Acquire(const std::filesystem::path& dir, std::string_view what) {
  std::error_code ec;
  if (std::filesystem::exists(dir, ec) && !std::filesystem::is_directory(dir, ec)) {
    return Error{fmt::format("{} {}: exists and is not a directory", what, dir.string())};
  }
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return Error{
        fmt::format("{} {}: cannot create directory: {}", what, dir.string(), ec.message())};
  const std::string path = (dir / ".attest.lock").string();
  // Open, lock, then check that the name still refers to the locked file: a previous owner
  // may have unlinked it between our open and our lock.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return Error{
          fmt::format("{} {}: cannot create {}: {}", what, dir.string(), path, ErrnoText(errno))};
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {};
      [[maybe_unused]] const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      ::close(fd);
      return Error{
          fmt::format("{} {}: in use by another attest run (pid {}); give each run its "
                      "own folder",
                      what, dir.string(), buf[0] != '\0' ? buf : "unknown")};
    }
    struct stat by_fd {
    }, by_name{};
    if (::fstat(fd, &by_fd) == 0 && ::stat(path.c_str(), &by_name) == 0 &&
        by_fd.st_ino == by_name.st_ino && by_fd.st_dev == by_name.st_dev) {
      const std::string pid = std::to_string(::getpid());
      if (::ftruncate(fd, 0) == 0) {
        [[maybe_unused]] const ssize_t w = ::pwrite(fd, pid.data(), pid.size(), 0);
      }
      FolderLock lock;
      lock.fd_ = fd;
      lock.path_ = path;
      return lock;
    }
    ::close(fd);
  }
  return Error{fmt::format("{} {}: cannot lock {}", what, dir.string(), path)};
}

FolderLock::FolderLock(FolderLock&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    this->~FolderLock();
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

FolderLock::~FolderLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still locked, so that no one can take a stale name
  ::close(fd_);
  fd_ = -1;
}

void RegisterTempPath(const std::string& path) {
  std::lock_guard<std::mutex> lock(Temps().mu);
  Temps().paths.insert(path);
}

void UnregisterTempPath(const std::string& path) {
  std::lock_guard<std::mutex> lock(Temps().mu);
  Temps().paths.erase(path);
}

void RemoveRegisteredTempPaths() {
  std::set<std::string> paths;
  {
    std::lock_guard<std::mutex> lock(Temps().mu);
    paths.swap(Temps().paths);
  }
  for (const std::string& p : paths) {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
}

}  // namespace attest
