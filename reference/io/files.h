// Files attest reads from users and kernels, and files it writes. Reading: only a regular
// file (open(2) with O_NONBLOCK, so that a FIFO cannot block the open, then fstat(2): no
// FIFO, device, socket or directory), optionally not through a symlink (O_NOFOLLOW: a kernel's
// output must be the file attest named in its private directory, not a link to elsewhere),
// no larger than a cap fixed before anything is allocated, and read before a deadline.
// Writing: whole or not at all: the bytes go to a temporary file beside the target
// (O_CREAT | O_EXCL), are fsync(2)ed, and rename(2) replaces the target in one step (POSIX
// rename: "the new name shall refer to the file ... at all times"), so that a full disk or a
// signal leaves the old file or the new one, never a truncated one. Temporary files and
// folders are registered while they exist, so that a signal handler can remove them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "reference/status.h"

namespace attest {

struct ReadLimits {
  uint64_t max_bytes = uint64_t{1} << 30;
  // false: a symlink at the path is refused (files a kernel wrote where attest told it to).
  bool follow_symlinks = true;
  // Reading stops with an Error once this passes (checked between chunks).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Names the file's role in messages: "case file", "outputs file".
  std::string_view what = "file";
};

// An open regular file: its descriptor (closed with the object) and size.
class RegularFile {
 public:
  RegularFile() = default;
  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Reads `count` bytes at the current position into `dst` (chunked, checking the deadline).
  Status Read(void* dst, uint64_t count);

 private:
  friend Expected<RegularFile> OpenRegularFile(const std::string& path, const ReadLimits& limits);
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
  ReadLimits limits_;
};

// Opens `path` for reading under `limits`; the Error names the path and the defect ("is a
// FIFO, not a regular file", "is 2147483648 bytes, over the 16777216-byte limit for this case
// file", "is a symlink").
Expected<RegularFile> OpenRegularFile(const std::string& path, const ReadLimits& limits);
// The whole file as text, under `limits`.
Expected<std::string> ReadRegularFile(const std::string& path, const ReadLimits& limits);

// Writes `bytes` to `path` through a temporary file in the same folder and rename(2). A path
// that exists and is a device or FIFO (/dev/stdout, /dev/null) is written in place instead:
// there is no file to replace. Errors name the path and the errno text (ENOSPC: "No space
// left on device"); on any failure the target is untouched and the temporary file removed.
Status WriteFileAtomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
Status WriteFileAtomic(const std::filesystem::path& path, std::string_view text);
// The same for a file made of `parts` one after the other (no copy into one buffer).
Status WriteFileAtomic(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> parts);

// Exclusive use of an output folder by one run (flock(2) on DIR/.attest.lock, which holds the
// owner's pid): a second run given the same folder is refused at start instead of silently
// overwriting the first one's files. The folder is created if missing; a path that exists
// and is not a folder is an Error. The lock file is removed when the lock is released.
class FolderLock {
 public:
  static Expected<FolderLock> Acquire(const std::filesystem::path& dir, std::string_view what);
  FolderLock(FolderLock&& other) noexcept;
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock();

 private:
  FolderLock() = default;
  int fd_ = -1;
  std::string path_;
};

// Temporary paths (files or folders) to remove if attest is stopped by a signal before their
// owners remove them (RemoveRegisteredTempPaths, called from the signal cleanup in
// kernels/exec/children.h). Registration is by exact path; folders are removed recursively.
void RegisterTempPath(const std::string& path);
void UnregisterTempPath(const std::string& path);
void RemoveRegisteredTempPaths();

}  // namespace attest
