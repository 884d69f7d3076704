// Framed JSON + tensor messages over a socket (see wire.h).
#include "kernels/plugin/wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <algorithm>
#include <cstring>

#include "reference/io/json.h"
#include "reference/problem/budget.h"

namespace attest {
namespace {

using Clock = std::chrono::steady_clock;

// Larger headers or tensors than this are a corrupted frame, not a request.
constexpr uint64_t kMaxHeaderBytes = 64ull << 20;
constexpr uint64_t kMaxTensorBytes = 64ull << 30;

Clock::time_point DeadlineAfter(double timeout_s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// Milliseconds left before `deadline` for poll(2) (-1: no deadline), or 0 once it passed.
int PollMillis(const Clock::time_point* deadline) {
  if (deadline == nullptr) return -1;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Sends n bytes before `deadline` (nullptr: no deadline): non-blocking sends (MSG_DONTWAIT)
// with poll(2) for room, so that a peer that stops reading cannot block us in send(2).
Status SendAll(int fd, const void* data, size_t n, const Clock::time_point* deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        const int ms = PollMillis(deadline);
        if (ms == 0) return Error{"timed out: the peer stopped reading"};
        pollfd pfd{fd, POLLOUT, 0};
        if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) {
          return Error{std::string("poll: ") + std::strerror(errno)};
        }
        continue;
      }
      return Error{std::string("send: ") + std::strerror(errno)};
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Reads exactly n bytes before `deadline` (nullopt: no deadline).
WireFailure ReadAll(int fd, void* data, size_t n, const Clock::time_point* deadline,
                    std::string* detail) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    int wait_ms = -1;
    if (deadline != nullptr) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline -
                                                                              Clock::now());
      if (left.count() <= 0) return WireFailure::kTimeout;
      wait_ms = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
    }
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, wait_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      *detail = std::string("poll: ") + std::strerror(errno);
      return WireFailure::kIo;
    }
    if (ready == 0) return WireFailure::kTimeout;
    const ssize_t r = ::read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return WireFailure::kEof;
      *detail = std::string("read: ") + std::strerror(errno);
      return WireFailure::kIo;
    }
    if (r == 0) return WireFailure::kEof;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return WireFailure::kNone;
}

}  // namespace

Status SendWire(int fd, nlohmann::json header, const std::vector<Tensor>& tensors,
                double timeout_s) {
  Clock::time_point deadline{};
  const Clock::time_point* dl = nullptr;
  if (timeout_s >= 0) {
    deadline = DeadlineAfter(timeout_s);
    dl = &deadline;
  }
  nlohmann::json list = nlohmann::json::array();
  for (const Tensor& t : tensors) {
    list.push_back({{"dtype", std::string(Name(t.dtype()))}, {"shape", t.shape()}});
  }
  header["tensors"] = list;
  const std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const uint64_t size = text.size();
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(size >> (8 * i));
  if (Status s = SendAll(fd, prefix, sizeof prefix, dl); !s.ok()) return s;
  if (Status s = SendAll(fd, text.data(), text.size(), dl); !s.ok()) return s;
  for (const Tensor& t : tensors) {
    const Tensor c = t.contiguous() ? t : t.Clone();
    if (Status s = SendAll(fd, c.bytes(), static_cast<size_t>(c.nbytes()), dl); !s.ok()) return s;
  }
  return Status::Ok();
}

WireReceive ReceiveWire(int fd, double timeout_s) {
  WireReceive out;
  Clock::time_point deadline{};
  const Clock::time_point* dl = nullptr;
  if (timeout_s >= 0) {
    deadline = DeadlineAfter(timeout_s);
    dl = &deadline;
  }
  unsigned char prefix[8];
  if ((out.failure = ReadAll(fd, prefix, sizeof prefix, dl, &out.detail)) != WireFailure::kNone) {
    return out;
  }
  uint64_t size = 0;
  for (int i = 0; i < 8; ++i) size |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  if (size > kMaxHeaderBytes) {
    out.failure = WireFailure::kMalformed;
    out.detail = "header of " + std::to_string(size) + " bytes";
    return out;
  }
  std::string text(size, '\0');
  if ((out.failure = ReadAll(fd, text.data(), size, dl, &out.detail)) != WireFailure::kNone) {
    return out;
  }
  auto parsed = ParseJsonText(text);
  if (auto* defect = std::get_if<JsonDefect>(&parsed)) {
    out.failure = WireFailure::kMalformed;
    out.detail = "header: " + defect->Describe();
    return out;
  }
  out.message.header = std::get<nlohmann::json>(std::move(parsed));
  const nlohmann::json& h = out.message.header;
  if (!h.is_object() || !h.contains("tensors") || !h["tensors"].is_array()) {
    out.failure = WireFailure::kMalformed;
    out.detail = "header is not a JSON object with a tensors array";
    return out;
  }
  const auto budget_or = MemoryBudgetBytes();
  const uint64_t budget = budget_or.ok() ? *budget_or : kDefaultMemoryBudgetBytes;
  uint64_t total = 0;
  for (const auto& entry : h["tensors"]) {
    auto dtype = entry.contains("dtype") && entry["dtype"].is_string()
                     ? ParseDType(entry["dtype"].get<std::string>())
                     : std::nullopt;
    const bool shape_ok =
        entry.contains("shape") && entry["shape"].is_array() &&
        std::all_of(entry["shape"].begin(), entry["shape"].end(),
                    [](const nlohmann::json& d) { return d.is_number_unsigned(); });
    if (!dtype || !shape_ok) {
      out.failure = WireFailure::kMalformed;
      out.detail = "tensor entry " + JsonExcerpt(entry);
      return out;
    }
    // The byte count, checked for overflow before anything is allocated.
    Shape shape;
    uint64_t bytes = static_cast<uint64_t>(SizeOf(*dtype));
    bool overflow = false;
    for (const auto& d : entry["shape"]) {
      const auto v = d.get<uint64_t>();
      overflow = overflow || v > (uint64_t{1} << 62) || __builtin_mul_overflow(bytes, v, &bytes);
      shape.push_back(static_cast<int64_t>(std::min<uint64_t>(v, uint64_t{1} << 62)));
    }
    // Within the frame's share of the memory budget (reference/problem/budget.h), before
    // anything is allocated: a frame is a problem's inputs or outputs, never more.
    total += bytes;
    if (overflow || bytes > kMaxTensorBytes || total > budget) {
      out.failure = WireFailure::kMalformed;
      out.detail = "tensor of " + JsonExcerpt(entry);
      return out;
    }
    Tensor t = Tensor::Zeros(*dtype, shape);
    if ((out.failure = ReadAll(fd, t.bytes(), static_cast<size_t>(t.nbytes()), dl,
                               &out.detail)) != WireFailure::kNone) {
      return out;
    }
    out.message.tensors.push_back(std::move(t));
  }
  return out;
}

}  // namespace attest
