// Framed messages between attest and a plugin's child process (kernels/plugin/plugin.cc):
// a JSON header and raw contiguous tensors over a stream socket. Frame: u64 little-endian
// header length, the header (its "tensors" array lists {dtype, shape} per tensor), then each
// tensor's bytes in order. Private to the plugin adapter; the exec protocol is separate.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference/status.h"
#include "reference/tensor.h"

namespace attest {

struct WireMessage {
  nlohmann::json header;
  std::vector<Tensor> tensors;
};

enum class WireFailure { kNone, kEof, kTimeout, kIo, kMalformed };

struct WireReceive {
  WireFailure failure = WireFailure::kNone;
  std::string detail;  // for kIo / kMalformed
  WireMessage message;
};

// Sends one frame (non-contiguous tensors are copied first). Never raises SIGPIPE.
Status SendWire(int fd, nlohmann::json header, const std::vector<Tensor>& tensors);
// Receives one frame; timeout_s < 0 waits forever.
WireReceive ReceiveWire(int fd, double timeout_s);

}  // namespace attest
