// The exec protocol's replies as the client reads them (docs/protocol.md "Replies"): one line
// of strict JSON (reference/io/json.h: no duplicate keys, bounded nesting) from a worker
// attest does not trust. A describe reply gives the kernel's identity; a call reply says
// ok, unsupported (with a reason) or error (with a message). Anything else is an Error that
// describes the violation with an excerpt of the line, never the whole of it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kernels/kernel.h"
#include "reference/status.h"

namespace attest {

struct DescribeReply {
  std::string name;
  nlohmann::json capabilities_json;  // as sent (compared across restarts)
  Capabilities capabilities;
};

// {"status": "ok", "name": "...", "capabilities": {...}}.
Expected<DescribeReply> ParseDescribeReply(std::string_view line);

struct CallReply {
  enum class Status { kOk, kUnsupported, kError };
  Status status = Status::kOk;
  std::string text;   // the reason (unsupported) or message (error)
  std::string route;  // optional "route" of an ok reply
  bool exiting = false;  // optional "exiting" of an error reply: the worker exits after it
};

// {"status": "ok"[, "route": "..."]}, {"status": "unsupported", "reason": "..."} or
// {"status": "error", "message": "..."[, "exiting": true]}.
Expected<CallReply> ParseCallReply(std::string_view line);

}  // namespace attest
