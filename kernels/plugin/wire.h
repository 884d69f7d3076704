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

// Sends one frame (non-contiguous tensors are copied first). Never raises SIGPIPE. With a
// timeout (timeout_s >= 0) the frame must be on its way within it: a peer that stops reading
// cannot block the sender in send(2); the Error then starts with "timed out".
Status SendWire(int fd, nlohmann::json header, const std::vector<Tensor>& tensors,
                double timeout_s = -1);
// Receives one frame; timeout_s < 0 waits forever. The header is strict JSON
// (reference/io/json.h) and is never quoted whole in `detail`.
WireReceive ReceiveWire(int fd, double timeout_s);

}  // namespace attest
