// Checked reads and atomic writes (files.h): only regular files, capped, before a deadline;
// a write that fails (here: RLIMIT_FSIZE, the way a full disk fails a write) leaves the old
// file whole and no temporary file behind.
#include "reference/io/files.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace attest {
namespace {

namespace fs = std::filesystem;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("attest_files_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  static std::string Slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Everything in the folder: the tests check that no temporary file stays.
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

TEST_F(FilesTest, ReadsRegularFilesOnly) {
  const std::string ok = Write("a.txt", "hello");
  auto text = ReadRegularFile(ok, {});
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(*text, "hello");

  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ReadLimits limits;
  limits.what = "case file";
  const auto t0 = std::chrono::steady_clock::now();
  auto f = ReadRegularFile(fifo, limits);  // must not wait for a writer
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().message, fifo +
                                   ": cannot open: a FIFO, not a regular file (the case file "
                                   "must be a regular file)");
  auto zero = ReadRegularFile("/dev/zero", limits);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("a character device, not a regular file"), std::string::npos);
  auto folder = ReadRegularFile(dir_.string(), limits);
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.error().message.find("a directory"), std::string::npos);
  auto missing = ReadRegularFile((dir_ / "nope").string(), limits);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no such file"), std::string::npos);
}

TEST_F(FilesTest, SymlinksAreRefusedWhereTheFileMustBeTheOneNamed) {
  const std::string target = Write("real.safetensors", "x");
  const std::string link = (dir_ / "link.safetensors").string();
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_TRUE(ReadRegularFile(link, {}).ok());
  ReadLimits strict;
  strict.follow_symlinks = false;
  strict.what = "outputs file";
  auto r = ReadRegularFile(link, strict);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, link + ": is a symlink; the outputs file must be a regular file");
}

TEST_F(FilesTest, SizeCapAndDeadline) {
  const std::string p = Write("big", std::string(100, 'x'));
  ReadLimits capped;
  capped.max_bytes = 10;
  capped.what = "case file";
  auto r = ReadRegularFile(p, capped);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, p + ": is 100 bytes, over the 10-byte limit for this case file");
  ReadLimits late;
  late.deadline = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  late.what = "outputs file";
  auto d = ReadRegularFile(p, late);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("ran past its deadline"), std::string::npos);
}

TEST_F(FilesTest, AtomicWriteReplacesWholeFiles) {
  const fs::path p = dir_ / "report.json";
  ASSERT_TRUE(WriteFileAtomic(p, std::string_view("first")).ok());
  EXPECT_EQ(Slurp(p), "first");
  ASSERT_TRUE(WriteFileAtomic(p, std::string_view("second, longer")).ok());
  EXPECT_EQ(Slurp(p), "second, longer");
  EXPECT_EQ(Listing(), std::vector<std::string>{"report.json"});
  // Devices are written in place; folders and missing folders are errors naming the path.
  EXPECT_TRUE(WriteFileAtomic("/dev/null", std::string_view("x")).ok());
  auto folder = WriteFileAtomic(dir_, std::string_view("x"));
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.error().message.find("is a directory"), std::string::npos);
  auto nowhere = WriteFileAtomic(dir_ / "no" / "such" / "x", std::string_view("x"));
  ASSERT_FALSE(nowhere.ok());
  EXPECT_NE(nowhere.error().message.find("cannot open for writing"), std::string::npos);
  // A FIFO nobody reads: ENXIO at once rather than a write that waits forever.
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = WriteFileAtomic(fifo, std::string_view("x"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("cannot open for writing"), std::string::npos);
}

TEST_F(FilesTest, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const fs::path p = dir_ / "oracle.safetensors";
  const std::string old(4096, 'o');
  ASSERT_TRUE(WriteFileAtomic(p, std::string_view(old)).ok());
  // In a child: files may not grow past 1 KiB (setrlimit(2) RLIMIT_FSIZE; with SIGXFSZ
  // ignored, write(2) fails with EFBIG as it fails with ENOSPC on a full disk).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{1024, 1024};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    const Status s = WriteFileAtomic(p, std::string_view(std::string(1 << 20, 'n')));
    const bool named = !s.ok() && s.error().message.find(p.string() +
                                                         ": write failed: File too "
                                                         "large") == 0;
    ::_exit(named ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the write did not fail with a message naming the path";
  EXPECT_EQ(Slurp(p), old);
  EXPECT_EQ(Listing(), std::vector<std::string>{"oracle.safetensors"});
}

TEST_F(FilesTest, RegisteredTemporariesAreRemovedOnRequest) {
  const fs::path folder = dir_ / "attest-exec-x";
  fs::create_directories(folder / "sub");
  Write("attest-exec-x/sub/f", "x");
  RegisterTempPath(folder.string());
  const std::string kept = Write("kept", "x");
  RegisterTempPath(kept);
  UnregisterTempPath(kept);
  RemoveRegisteredTempPaths();
  EXPECT_FALSE(fs::exists(folder));
  EXPECT_TRUE(fs::exists(kept));
}

}  // namespace
}  // namespace attest
