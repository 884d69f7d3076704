// The worker side of the exec protocol for C++ kernels (docs/design.md "External kernels";
// docs/protocol.md): one JSON request per line in, one JSON reply per line out, tensors in
// the safetensors files the request names. Used by forked (isolated) kernels.
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/exec/exec_kernel.h"
#include "reference/io/json.h"
#include "reference/io/safetensors.h"

namespace attest {
namespace {

using nlohmann::json;

bool WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

json ErrorReply(const std::string& message) { return {{"status", "error"}, {"message", message}}; }

// Inputs sent as views (docs/protocol.md "Views"): each named tensor of the file is the flat
// storage a view spans, and request.views.NAME its shape, element strides and offset. The
// view replaces the entry; the storage stays in the set under "NAME.storage" (the view does
// not own it). Everything is checked before any element is addressed: non-negative integers,
// and the last element the view reaches inside the storage.
Status ApplyViews(const json& request, NamedTensors& file) {
  if (!request.contains("views")) return {};
  const json& views = request["views"];
  if (!views.is_object()) return Error{"request: \"views\" must be an object"};
  for (const auto& [name, spec] : views.items()) {
    const std::string where = "request.views." + QuotedExcerpt(name);
    auto it = std::find_if(file.tensors.begin(), file.tensors.end(),
                           [&](const auto& e) { return e.first == name; });
    if (it == file.tensors.end()) return Error{where + ": no such tensor in the inputs file"};
    const Tensor storage = it->second;
    if (storage.rank() != 1) return Error{where + ": the storage must be a flat (1-D) tensor"};
    if (!spec.is_object() || !spec.contains("shape") || !spec.contains("strides") ||
        !spec["shape"].is_array() || !spec["strides"].is_array() ||
        spec["shape"].size() != spec["strides"].size() || spec["shape"].size() > 8) {
      return Error{where + ": expected {\"shape\": [...], \"strides\": [...], \"offset\": n} "
                           "with as many strides as dimensions (at most 8)"};
    }
    auto int_in = [](const json& x, int64_t hi) {
      return x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= hi;
    };
    constexpr int64_t kMax = int64_t{1} << 40;
    const json offset = spec.contains("offset") ? spec["offset"] : json(0);
    if (!int_in(offset, kMax)) return Error{where + ".offset: must be an integer in [0, 2^40]"};
    Shape shape, strides;
    // The farthest element the view reaches: at most 2^40 + 8 · 2^80, exact in 128 bits.
    __int128 last = offset.get<int64_t>();
    bool empty = false;
    for (size_t d = 0; d < spec["shape"].size(); ++d) {
      if (!int_in(spec["shape"][d], kMax) || !int_in(spec["strides"][d], kMax)) {
        return Error{where + ": shape and strides must be integers in [0, 2^40]"};
      }
      shape.push_back(spec["shape"][d].get<int64_t>());
      strides.push_back(spec["strides"][d].get<int64_t>());
      empty = empty || shape.back() == 0;
      if (shape.back() > 0) last += static_cast<__int128>(shape.back() - 1) * strides.back();
    }
    if (!empty && last >= storage.numel()) {
      return Error{fmt::format("{}: the view reaches past the storage's {} elements", where,
                               storage.numel())};
    }
    Tensor view = empty ? Tensor::Zeros(storage.dtype(), shape)
                        : Tensor::View(storage.dtype(), shape, strides,
                                       storage.bytes() + offset.get<int64_t>() *
                                                             SizeOf(storage.dtype()));
    it->second = view;
    file.Add(name + ".storage", storage);
  }
  return {};
}

// The tensors a request's inputs file must hold, read and shape-checked.
Expected<NamedTensors> ReadInputs(const json& request, const Problem& p, bool backward,
                                  bool lse) {
  if (!request.contains("inputs") || !request["inputs"].is_string()) {
    return Error{"request: \"inputs\" must be a path string"};
  }
  auto file = ReadSafetensors(request["inputs"].get<std::string>());
  if (!file) return file.error();
  if (Status s = ApplyViews(request, *file); !s) return s.error();
  struct Want {
    const char* name;
    Shape shape;
  };
  std::vector<Want> want = {{"q", p.QShape()}, {"k", p.KShape()}, {"v", p.VShape()}};
  if (backward) {
    want.push_back({"o", p.OShape()});
    if (lse) want.push_back({"lse", p.LseShape()});
    want.push_back({"do", p.OShape()});
  }
  for (const Want& w : want) {
    const Tensor* t = file->Find(w.name);
    if (t == nullptr) return Error{fmt::format("inputs file: tensor '{}' missing", w.name)};
    if (t->shape() != w.shape) {
      return Error{fmt::format("inputs file: tensor '{}' is {}, the problem needs another shape",
                               w.name, t->Describe())};
    }
  }
  return file;
}

json Handle(Kernel& kernel, const json& request) {
  if (!request.is_object() || !request.contains("op") || !request["op"].is_string()) {
    return ErrorReply("request: expected an object with a string \"op\"");
  }
  const std::string op = request["op"].get<std::string>();
  if (op == "describe") {
    // The protocol carries no learnable sink (docs/protocol.md "Capabilities"): a forked
    // kernel is described without one, so it is never sent a sink problem.
    Capabilities caps = kernel.capabilities();
    caps.sink = false;
    caps.rel_bias = false;  // nor a relative bias
    return {{"status", "ok"}, {"name", kernel.name()}, {"capabilities", CapabilitiesToJson(caps)}};
  }
  if (op != "forward" && op != "backward") {
    return ErrorReply("request: unknown op \"" + op + "\" (describe, forward, backward)");
  }
  if (!request.contains("problem")) return ErrorReply("request: \"problem\" missing");
  auto problem = ProblemFromJson(request["problem"]);
  if (!problem) return ErrorReply(problem.error().message);
  if (!request.contains("outputs") || !request["outputs"].is_string()) {
    return ErrorReply("request: \"outputs\" must be a path string");
  }
  const std::string out_path = request["outputs"].get<std::string>();
  const bool backward = op == "backward";
  // A kernel that declares no lse (Capabilities::lse) neither returns nor receives one.
  const bool lse = kernel.capabilities().lse;
  auto in = ReadInputs(request, *problem, backward, lse);
  if (!in) return ErrorReply(in.error().message);
  auto get = [&](const char* n) { return *in->Find(n); };

  NamedTensors out;
  if (!backward) {
    auto r = kernel.Forward(*problem, get("q"), get("k"), get("v"));
    if (auto* u = std::get_if<Unsupported>(&r)) return {{"status", "unsupported"}, {"reason", u->reason}};
    if (auto* e = std::get_if<Error>(&r)) return ErrorReply(e->message);
    auto& f = std::get<ForwardResult>(r);
    out.Add("o", f.o);
    // (An lse the kernel claims but did not return stays missing: the client reports it.)
    if (lse && f.lse.defined()) out.Add("lse", f.lse);
  } else {
    auto r = kernel.Backward(*problem, get("q"), get("k"), get("v"), get("o"),
                             lse ? get("lse") : Tensor(), get("do"));
    if (auto* u = std::get_if<Unsupported>(&r)) return {{"status", "unsupported"}, {"reason", u->reason}};
    if (auto* e = std::get_if<Error>(&r)) return ErrorReply(e->message);
    auto& b = std::get<BackwardResult>(r);
    out.Add("dq", b.dq);
    out.Add("dk", b.dk);
    out.Add("dv", b.dv);
  }
  if (Status s = WriteSafetensors(out_path, out); !s) return ErrorReply(s.error().message);
  return {{"status", "ok"}};
}

}  // namespace

int ServeProtocol(Kernel& kernel, int in_fd, int out_fd) {
  std::string buffer;
  char chunk[4096];
  for (;;) {
    size_t nl;
    while ((nl = buffer.find('\n')) == std::string::npos) {
      const ssize_t n = read(in_fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return 0;  // EOF (or a broken pipe): the client is done with us
      buffer.append(chunk, static_cast<size_t>(n));
    }
    const std::string line = buffer.substr(0, nl);
    buffer.erase(0, nl + 1);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json reply;
    const json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (request.is_discarded()) {
      reply = ErrorReply("request is not JSON");
    } else {
      try {
        reply = Handle(kernel, request);
      } catch (const std::exception& e) {
        reply = ErrorReply(std::string("exception: ") + e.what());
      }
    }
    // Invalid UTF-8 in a message must not stop the reply: replace it.
    if (!WriteAll(out_fd, reply.dump(-1, ' ', false, json::error_handler_t::replace) + "\n")) {
      return 2;
    }
  }
}

}  // namespace attest
