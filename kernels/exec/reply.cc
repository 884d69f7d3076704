// Parsing exec protocol replies (see reply.h).
#include "kernels/exec/reply.h"

#include <fmt/format.h>

#include "reference/io/json.h"

namespace attest {
namespace {

using Json = nlohmann::json;

// A reply line as a JSON object, or what is wrong with it.
Expected<Json> ReplyObject(std::string_view line) {
  auto j = ParseJsonText(line);
  if (auto* d = std::get_if<JsonDefect>(&j)) {
    return Error{fmt::format("reply is not a JSON object ({}): {}", d->Describe(),
                             QuotedExcerpt(line, 120))};
  }
  Json& reply = std::get<Json>(j);
  if (!reply.is_object()) {
    return Error{fmt::format("reply is not a JSON object: {}", JsonExcerpt(reply))};
  }
  return std::move(reply);
}

// A worker's free text (reason, message, route), cut so that a megabyte of it cannot flood a
// report: whole up to kMaxTextBytes, then cut on a UTF-8 boundary with "...".
constexpr size_t kMaxTextBytes = 2000;
std::string Cut(const std::string& text) {
  if (text.size() <= kMaxTextBytes) return text;
  size_t end = kMaxTextBytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "...";
}

// The string member `key`, or nullptr when it is absent or not a string.
const std::string* StringMember(const Json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return nullptr;
  return &it->get_ref<const std::string&>();
}

}  // namespace

Expected<DescribeReply> ParseDescribeReply(std::string_view line) {
  auto reply = ReplyObject(line);
  if (!reply) return reply.error();
  const std::string* status = StringMember(*reply, "status");
  if (status == nullptr || *status != "ok") {
    return Error{fmt::format("reply status is not \"ok\": {}", JsonExcerpt(*reply))};
  }
  const std::string* name = StringMember(*reply, "name");
  if (name == nullptr) return Error{"reply has no string \"name\""};
  const auto caps = reply->find("capabilities");
  if (caps == reply->end()) return Error{"reply has no \"capabilities\""};
  auto parsed = CapabilitiesFromJson(*caps);
  if (!parsed) return parsed.error();
  return DescribeReply{Cut(*name), *caps, *parsed};
}

Expected<CallReply> ParseCallReply(std::string_view line) {
  auto reply = ReplyObject(line);
  if (!reply) return reply.error();
  const std::string* status = StringMember(*reply, "status");
  if (status == nullptr) {
    return Error{fmt::format("reply has no string \"status\": {}", JsonExcerpt(*reply))};
  }
  CallReply out;
  if (*status == "unsupported") {
    const std::string* reason = StringMember(*reply, "reason");
    if (reason == nullptr) return Error{"\"unsupported\" reply without a string \"reason\""};
    out.status = CallReply::Status::kUnsupported;
    out.text = Cut(*reason);
    return out;
  }
  if (*status == "error") {
    const std::string* message = StringMember(*reply, "message");
    if (message == nullptr) return Error{"\"error\" reply without a string \"message\""};
    out.status = CallReply::Status::kError;
    out.text = Cut(*message);
    // Optional: the worker exits after this reply (its process is unusable, e.g. after a
    // sticky CUDA error), so the next request must go to a fresh worker.
    if (const auto it = reply->find("exiting"); it != reply->end()) {
      if (!it->is_boolean()) {
        return Error{fmt::format("\"exiting\" is not true or false: {}", JsonExcerpt(*it))};
      }
      out.exiting = it->get<bool>();
    }
    return out;
  }
  if (*status != "ok") return Error{fmt::format("unknown status {}", QuotedExcerpt(*status))};
  // Optional: which code path the worker took (shown as last_route()).
  if (const std::string* route = StringMember(*reply, "route")) out.route = Cut(*route);
  return out;
}

}  // namespace attest
