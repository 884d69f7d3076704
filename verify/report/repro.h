// The command lines attest prints for a person to run again what failed (a verdict's `repro`,
// an audit's smallest leak). Every one is written here, with the shell quoting that keeps an
// exec: kernel's words together, so that each line pastes into a shell as it is.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace attest {

// `s` as one shell word: unchanged when it has no character a POSIX shell treats specially,
// else in single quotes (a quote inside as '\'').
std::string ShellQuote(std::string_view s);

// "attest repro --kernel K --case F [--check C]": one saved case, one check or all.
std::string ReproCommand(std::string_view kernel, const std::filesystem::path& case_file,
                         std::string_view check = {});

// "attest repro --kernel K --case LABEL --check C": the line a check carries while it runs,
// before its failing case has a file (run/run.cc replaces it with ReproCommand on the
// saved file; without a failure folder this one stays and names the case by its label).
std::string PendingReproCommand(std::string_view kernel, std::string_view case_label,
                                std::string_view check);

// The file name a failing case is saved under: "<kernel>-<check>-<tensor>-<hash>.case.json",
// names cut to 80 characters of [A-Za-z0-9._-] (others become '_'), the tensor "all" when the
// verdict names none, the hash the first 32 bits of the SHA-256 of the case's canonical text
// (case_file.h CaseToText): the same failure, the same file, under every compiler and
// standard library.
std::string FailureCaseFileName(std::string_view case_text, std::string_view kernel,
                                std::string_view check, std::string_view tensor);

// "attest check --kernel K --suite S --seed N": the whole suite run again.
std::string CheckCommand(std::string_view kernel, std::string_view suite, uint64_t seed);

// "attest audit --kernel K --seed N": the audit run again.
std::string AuditCommand(std::string_view kernel, uint64_t seed);

}  // namespace attest
