// `attest golden verify` end to end: the committed golden cases
// pass; on a scratch copy, one corrupted output value (with its hash updated) exits 1 naming
// the case and the tensor, and a corrupted hash exits 2.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "reference/golden/manifest.h"
#include "reference/golden/sha256.h"
#include "reference/io/safetensors.h"

namespace attest {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun Attest(const std::string& args) {
  const std::string cmd = std::string(ATTEST_CLI) + " " + args + " 2>&1";
  CliRun run;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) run.output.append(buf.data(), n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

const fs::path kGolden = fs::path(ATTEST_SOURCE_DIR) / "golden" / "cases";
constexpr const char* kCase = "softcap_alibi_causal";

// A scratch folder holding one committed case and a manifest with only that case.
class Scratch {
 public:
  Scratch() {
    dir_ = fs::temp_directory_path() / ("attest_golden_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const std::string& f :
         {GoldenCaseFile(kCase), GoldenInputsFile(kCase), GoldenOutputsFile(kCase)}) {
      fs::copy_file(kGolden / f, dir_ / f);
    }
    auto all = LoadManifest(kGolden / "manifest.json");
    EXPECT_TRUE(all.ok());
    GoldenManifest one;
    one.Upsert(*all->Find(kCase));
    EXPECT_TRUE(SaveManifest(dir_ / "manifest.json", one).ok());
  }
  ~Scratch() { fs::remove_all(dir_); }
  const fs::path& dir() const { return dir_; }

  void Rehash(const std::string& file, const std::string& digest) {
    auto m = LoadManifest(dir_ / "manifest.json");
    ASSERT_TRUE(m.ok());
    m->cases[0].sha256[file] = digest;
    ASSERT_TRUE(SaveManifest(dir_ / "manifest.json", *m).ok());
  }

 private:
  fs::path dir_;
};

TEST(GoldenCli, CommittedCasesVerify) {
  const CliRun run = Attest("golden verify --dir " + kGolden.string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("failed"), std::string::npos);
  EXPECT_NE(run.output.find(" 0 failed"), std::string::npos) << run.output;
}

TEST(GoldenCli, OneCorruptedOutputValueExits1NamingCaseAndTensor) {
  Scratch s;
  const std::string out = GoldenOutputsFile(kCase);
  auto st = ReadSafetensors((s.dir() / out).string());
  ASSERT_TRUE(st.ok());
  for (auto& [name, t] : st->tensors) {
    if (name == "dv") t.span<double>()[5] *= 1 + 1e-10;
  }
  ASSERT_TRUE(WriteSafetensors((s.dir() / out).string(), *st).ok());
  s.Rehash(out, *Sha256File(s.dir() / out));
  const CliRun run = Attest("golden verify --dir " + s.dir().string());
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find(std::string(kCase) + ": tensor dv"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("repro: attest golden verify"), std::string::npos) << run.output;
}

TEST(GoldenCli, CorruptedHashExits2) {
  Scratch s;
  s.Rehash(GoldenInputsFile(kCase), std::string(64, '0'));
  const CliRun run = Attest("golden verify --dir " + s.dir().string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(GoldenInputsFile(kCase) + ": corrupt"), std::string::npos)
      << run.output;
}

TEST(GoldenCli, MissingFolderOrUnknownCaseExits2) {
  EXPECT_EQ(Attest("golden verify --dir /nonexistent/golden").exit_code, 2);
  EXPECT_EQ(Attest("golden verify --dir " + kGolden.string() + " --only no_such_case").exit_code,
            2);
}

}  // namespace
}  // namespace attest
