// Errors as values at the edges (parsing, I/O, user input): Expected<T> holds a value or an
// Error whose message names the file, tensor or field at fault. Internal invariants are
// assertions, not Errors. (C++20 has no std::expected; this is the small subset we need.)
#pragma once

#include <cassert>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace attest {

// An error destined for a person: one line naming what is wrong and where.
struct Error {
  std::string message;
};

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

// Expected<void>: success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return Status(); }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    assert(!ok_);
    return error_;
  }

 private:
  Error error_;
  bool ok_ = true;
};

// A failure of attest's own environment (a full disk or TMPDIR, no process could be
// started), thrown out of code that otherwise turns everything a kernel does into a
// finding: runners stop and report it as an infrastructure error (exit code 2), so that a
// full disk is never blamed on the kernel under test.
struct InfrastructureError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace attest
