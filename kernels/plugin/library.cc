// C ABI plugin loading and in-process calls (see library.h and attest_kernel.h).
#include "kernels/plugin/library.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/device/device.h"
#include "reference/formats/format.h"

namespace attest {

// Descriptors name their device with the ABI's attest_device_type, which OpenDevice takes as
// the adapters' own constants (kernels/device/device.h).
static_assert(ATTEST_DEVICE_CUDA == kDeviceCuda && ATTEST_DEVICE_HIP == kDeviceHip);

namespace {

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Error LibError(const std::string& path, const std::string& what) {
  return Error{"plugin " + path + ": " + what};
}

// A tensor as the kernel sees it: encoded host codes, and their device copy when the
// descriptor names a device.
struct Staged {
  const char* name = "";
  Tensor host;
  DeviceBuffer device;
  attest_tensor view{};
};

attest_tensor ViewOf(const Tensor& t, void* data, int32_t device_type, int32_t device_id) {
  attest_tensor v{};
  v.data = data;
  v.dtype = AbiDType(t.dtype());
  v.ndim = static_cast<int32_t>(t.rank());
  for (int d = 0; d < 4; ++d) {
    // Unused dimensions have shape 1, stride 0 (attest_kernel.h).
    v.shape[d] = d < t.rank() ? t.dim(d) : 1;
    v.strides[d] = d < t.rank() ? t.strides()[static_cast<size_t>(d)] : 0;
  }
  v.device_type = device_type;
  v.device_id = device_id;
  return v;
}

// The problem's dtype codes of `t` (which holds values of that dtype, widened or not).
Expected<Tensor> EncodeAs(const Tensor& t, DType to, const char* name) {
  if (t.dtype() == to) return t.Clone();  // a private copy: the kernel gets its own buffer
  const Tensor wide = t.dtype() == DType::kF64 ? t : ToF64(t);
  auto coded = FromF64(wide, to);
  if (!coded.ok()) return Error{std::string("tensor ") + name + ": " + coded.error().message};
  return *coded;
}

// An output buffer with every element the format's NaN (an unwritten element stays NaN).
Tensor NanTensor(DType dtype, const Shape& shape) {
  Tensor t = Tensor::Zeros(dtype, shape);
  const uint64_t code = Encode(std::nan(""), *FormatOf(dtype)).code;
  const int size = SizeOf(dtype);
  std::byte* bytes = t.bytes();
  for (int64_t e = 0; e < t.numel(); ++e) std::memcpy(bytes + e * size, &code, size);
  return t;
}

struct CallPlan {
  std::vector<Staged> inputs;
  std::vector<Staged> outputs;
};

// Stages inputs and NaN-filled outputs, invokes `call` (which fills the args struct from the
// views and calls the kernel), checks the status, and brings the outputs back.
// Returns the outputs (codes, host) or an Unsupported / Error answer.
std::variant<std::vector<Tensor>, Unsupported, Error> Invoke(
    const PluginEntry& entry, const char* op, CallPlan& plan,
    const std::function<int32_t(void* stream, char* message, size_t size)>& call) {
  const std::string who = "plugin " + entry.library + ":" + entry.name + " " + op;
  std::shared_ptr<DeviceAdapter> device;
  if (entry.device_type != ATTEST_DEVICE_HOST) {
    auto opened = OpenDevice(entry.device_type);
    if (!opened.ok()) return Error{who + ": " + opened.error().message};
    device = *opened;
  }
  auto stage = [&](Staged& s) -> Status {
    if (!device) {
      s.view = ViewOf(s.host, s.host.bytes(), ATTEST_DEVICE_HOST, 0);
      return Status::Ok();
    }
    auto ptr = device->Allocate(static_cast<size_t>(s.host.nbytes()));
    if (!ptr.ok()) return Error{who + ": tensor " + s.name + ": " + ptr.error().message};
    s.device = DeviceBuffer(device, *ptr);
    if (Status st = device->CopyToDevice(*ptr, s.host.bytes(), s.host.nbytes()); !st.ok()) {
      return Error{who + ": tensor " + s.name + ": " + st.error().message};
    }
    s.view = ViewOf(s.host, *ptr, device->device_type(), device->device_id());
    return Status::Ok();
  };
  for (auto* list : {&plan.inputs, &plan.outputs}) {
    for (Staged& s : *list) {
      if (Status st = stage(s); !st.ok()) return st.error();
    }
  }
  // Originals of the inputs, to catch a kernel that writes into them.
  std::vector<Tensor> originals;
  for (const Staged& s : plan.inputs) originals.push_back(s.host.Clone());

  std::vector<char> message(4096, '\0');
  const int32_t status = call(device ? device->stream() : nullptr, message.data(), message.size());
  message.back() = '\0';
  const std::string text(message.data());

  if (device) {
    if (Status st = device->Synchronize(); !st.ok()) {
      return Error{who + ": " + st.error().message};
    }
  }
  if (status == ATTEST_UNSUPPORTED) {
    return Unsupported{text.empty() ? "plugin answered ATTEST_UNSUPPORTED without a reason"
                                    : text};
  }
  if (status == ATTEST_ERROR) {
    return Error{who + " returned ATTEST_ERROR: " + (text.empty() ? "(no message)" : text)};
  }
  if (status != ATTEST_OK) {
    return Error{who + ": protocol violation: returned " + std::to_string(status) +
                 " (expected ATTEST_OK, ATTEST_UNSUPPORTED or ATTEST_ERROR)"};
  }
  std::vector<Tensor> results;
  for (Staged& s : plan.outputs) {
    if (device) {
      if (Status st = device->CopyToHost(s.host.bytes(), s.device.get(), s.host.nbytes());
          !st.ok()) {
        return Error{who + ": output " + s.name + ": " + st.error().message};
      }
    }
    results.push_back(s.host);
  }
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    Staged& s = plan.inputs[i];
    Tensor after = s.host;
    if (device) {
      after = Tensor::Zeros(s.host.dtype(), s.host.shape());
      if (Status st = device->CopyToHost(after.bytes(), s.device.get(), after.nbytes());
          !st.ok()) {
        return Error{who + ": input " + s.name + ": " + st.error().message};
      }
    }
    if (!after.BitwiseEqual(originals[i])) {
      return Error{who + ": the kernel wrote into its input tensor " + s.name};
    }
  }
  for (auto* list : {&plan.inputs, &plan.outputs}) {
    for (Staged& s : *list) {
      if (Status st = s.device.Release(); !st.ok()) return Error{who + ": " + st.error().message};
    }
  }
  return results;
}

// attest_problem for `p`; the pointers refer into `p` and `json_text`.
attest_problem AbiProblem(const Problem& p, const std::string& json_text) {
  attest_problem a{};
  a.batch = p.batch;
  a.heads_q = p.heads_q;
  a.heads_kv = p.heads_kv;
  a.seqlen_q = p.seqlen_q;
  a.seqlen_k = p.seqlen_k;
  a.head_dim = p.head_dim;
  a.head_dim_v = p.head_dim_v;
  a.dtype = AbiDType(p.dtype);
  a.causal = p.causal ? 1 : 0;
  a.causal_top_left = p.causal_align == CausalAlign::kTopLeft ? 1 : 0;
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.scale = p.EffectiveScale();
  a.softcap = p.softcap;
  a.alibi_slopes = p.alibi_slopes ? p.alibi_slopes->data() : nullptr;
  a.cu_seqlens_q = p.cu_seqlens_q ? p.cu_seqlens_q->data() : nullptr;
  a.cu_seqlens_k = p.cu_seqlens_k ? p.cu_seqlens_k->data() : nullptr;
  a.problem_json = json_text.c_str();
  return a;
}

// Encodes each (tensor, dtype, name) input; an encoding failure is an Error.
Expected<std::vector<Staged>> EncodeInputs(
    const std::vector<std::tuple<const Tensor*, DType, const char*>>& list) {
  std::vector<Staged> staged;
  for (const auto& [t, dtype, name] : list) {
    auto coded = EncodeAs(*t, dtype, name);
    if (!coded.ok()) return coded.error();
    Staged s;
    s.name = name;
    s.host = *coded;
    staged.push_back(std::move(s));
  }
  return staged;
}

Staged Output(const char* name, DType dtype, const Shape& shape) {
  Staged s;
  s.name = name;
  s.host = NanTensor(dtype, shape);
  return s;
}

}  // namespace

PluginSpec ParsePluginSpec(std::string_view spec) {
  PluginSpec out;
  const std::string whole(spec);
  const size_t colon = whole.rfind(':');
  if (IsFile(whole) || colon == std::string::npos) {
    out.path = whole;
  } else {
    out.path = whole.substr(0, colon);
    out.name = whole.substr(colon + 1);
  }
  return out;
}

int32_t AbiDType(DType dtype) {
  switch (dtype) {
    case DType::kF64: return ATTEST_DTYPE_F64;
    case DType::kF32: return ATTEST_DTYPE_F32;
    case DType::kBF16: return ATTEST_DTYPE_BF16;
    case DType::kF16: return ATTEST_DTYPE_F16;
    case DType::kE4M3FN: return ATTEST_DTYPE_F8_E4M3;
    case DType::kE5M2: return ATTEST_DTYPE_F8_E5M2;
    case DType::kI32: return ATTEST_DTYPE_I32;
    default: return -1;
  }
}

PluginLibrary::~PluginLibrary() = default;
// The handle is never dlclose'd: a kernel library's static destructors (a CUDA runtime's
// among them) may not survive being run in the middle of a process, and unloading buys
// nothing for a process that checks kernels.

Expected<std::shared_ptr<PluginLibrary>> PluginLibrary::Open(const std::string& path) {
  if (path.empty()) return Error{"plugin: empty library path (plugin:<path.so>[:<name>])"};
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return LibError(path, std::string("cannot load: ") + (why ? why : "dlopen failed"));
  }
  auto lib = std::shared_ptr<PluginLibrary>(new PluginLibrary());  // private constructor
  lib->handle_ = handle;
  lib->path_ = path;

  using VersionFn = uint32_t (*)();
  using CountFn = int32_t (*)();
  using GetFn = const attest_kernel_desc* (*)(int32_t);
  auto sym = [&](const char* name) -> Expected<void*> {
    dlerror();
    void* p = dlsym(handle, name);
    if (p == nullptr) return LibError(path, std::string("missing symbol ") + name);
    return p;
  };
  auto version_sym = sym("attest_kernel_abi_version");
  if (!version_sym.ok()) return version_sym.error();
  auto count_sym = sym("attest_kernel_count");
  if (!count_sym.ok()) return count_sym.error();
  auto get_sym = sym("attest_kernel_get");
  if (!get_sym.ok()) return get_sym.error();

  const uint32_t version = reinterpret_cast<VersionFn>(*version_sym)();
  if (version != ATTEST_KERNEL_ABI_VERSION) {
    return LibError(path, fmt::format("attest_kernel_abi_version() returned {}, this attest "
                                      "speaks ABI version {} (rebuild the plugin against its "
                                      "attest_kernel.h)",
                                      version, ATTEST_KERNEL_ABI_VERSION));
  }
  const int32_t count = reinterpret_cast<CountFn>(*count_sym)();
  if (count < 1) {
    return LibError(path, fmt::format("attest_kernel_count() returned {} (must be >= 1)", count));
  }
  const GetFn get = reinterpret_cast<GetFn>(*get_sym);
  for (int32_t i = 0; i < count; ++i) {
    const attest_kernel_desc* d = get(i);
    const std::string where = fmt::format("attest_kernel_get({})", i);
    if (d == nullptr) return LibError(path, where + " returned NULL");
    if (d->abi_version != ATTEST_KERNEL_ABI_VERSION) {
      return LibError(path, fmt::format("{}->abi_version is {}, expected {}", where,
                                        d->abi_version, ATTEST_KERNEL_ABI_VERSION));
    }
    if (d->struct_size != sizeof(attest_kernel_desc)) {
      return LibError(path, fmt::format("{}->struct_size is {}, expected sizeof("
                                        "attest_kernel_desc) = {}",
                                        where, d->struct_size, sizeof(attest_kernel_desc)));
    }
    if (d->name == nullptr || *d->name == '\0') return LibError(path, where + "->name is empty");
    PluginEntry e;
    e.desc = d;
    e.library = path;
    e.name = d->name;
    const std::string kwhere = fmt::format("kernel '{}' ({})", e.name, where);
    for (const PluginEntry& other : lib->entries_) {
      if (other.name == e.name) return LibError(path, kwhere + ": duplicate name");
    }
    if (d->capabilities_json == nullptr) {
      return LibError(path, kwhere + ": capabilities_json is NULL");
    }
    e.capabilities_json = d->capabilities_json;
    nlohmann::json caps_json = nlohmann::json::parse(e.capabilities_json, nullptr, false);
    if (caps_json.is_discarded()) {
      return LibError(path, kwhere + ": capabilities_json is not valid JSON");
    }
    auto caps = CapabilitiesFromJson(caps_json);
    if (!caps.ok()) return LibError(path, kwhere + ": " + caps.error().message);
    e.capabilities = *caps;
    // The C ABI's forward always has an lse output and its backward an lse input
    // (attest_kernel.h): a kernel whose API returns no lse is adapted through exec: instead.
    if (!e.capabilities.lse) {
      return LibError(path, kwhere + ": capabilities.lse: false is not supported by the C ABI "
                                     "(a plugin's forward writes lse); use an exec: worker");
    }
    // The C ABI has no sink input and no dsink output (attest_kernel.h).
    if (e.capabilities.sink) {
      return LibError(path, kwhere + ": capabilities.sink: true is not supported by the C ABI "
                                     "(no sink input, no dsink output)");
    }
    if (e.capabilities.rel_bias) {
      return LibError(path, kwhere + ": capabilities.rel_bias: true is not supported by the C "
                                     "ABI (no rel_bias input, no drel_bias output)");
    }
    // Nor a page table or seqused (attest_kernel.h's problem struct has neither).
    if (e.capabilities.paged || e.capabilities.seqused) {
      return LibError(path, kwhere + ": capabilities." +
                                (e.capabilities.paged ? "paged" : "seqused") +
                                ": true is not supported by the C ABI (no page table, no "
                                "seqused); use an exec: worker, whose problem carries them");
    }
    // The C ABI passes packed buffers (attest_kernel.h: no strides), so no plugin can be
    // handed a view: a claim otherwise would make the layouts check pass unexercised.
    if (e.capabilities.strides != "contiguous") {
      return LibError(path, kwhere + ": capabilities.strides: \"" + e.capabilities.strides +
                                "\" is not supported by the C ABI (tensors are passed as "
                                "contiguous buffers); use an exec: worker");
    }
    for (DType dt : e.capabilities.dtypes) {
      if (AbiDType(dt) < 0 || dt == DType::kI32) {
        return LibError(path, kwhere + ": capabilities.dtypes: " + std::string(Name(dt)) +
                                  " has no attest_dtype");
      }
    }
    if (d->device_type != ATTEST_DEVICE_HOST && d->device_type != ATTEST_DEVICE_CUDA &&
        d->device_type != ATTEST_DEVICE_HIP) {
      return LibError(path, fmt::format("{}: device_type {} is not an attest_device_type",
                                        kwhere, d->device_type));
    }
    e.device_type = d->device_type;
    // Where the tensors live is the descriptor's device_type; a capabilities JSON that says
    // otherwise contradicts it.
    const char* device = d->device_type == ATTEST_DEVICE_CUDA  ? "cuda"
                         : d->device_type == ATTEST_DEVICE_HIP ? "hip"
                                                               : "host";
    if (caps_json.contains("device") && e.capabilities.device != device) {
      return LibError(path, fmt::format("{}: capabilities.device \"{}\" contradicts device_type "
                                        "{} ({})", kwhere, e.capabilities.device,
                                        d->device_type, device));
    }
    e.capabilities.device = device;
    if (d->forward == nullptr) return LibError(path, kwhere + ": forward is NULL");
    if (e.capabilities.backward && d->backward == nullptr) {
      return LibError(path, kwhere + ": capabilities say backward but backward is NULL");
    }
    lib->entries_.push_back(std::move(e));
  }
  return lib;
}

Expected<PluginEntry> PluginLibrary::Find(std::string_view name) const {
  std::string names;
  for (const PluginEntry& e : entries_) names += (names.empty() ? "" : ", ") + e.name;
  if (name.empty()) {
    if (entries_.size() == 1) return entries_.front();
    return LibError(path_, "provides " + std::to_string(entries_.size()) + " kernels (" +
                               names + "); name one: plugin:" + path_ + ":<name>");
  }
  for (const PluginEntry& e : entries_) {
    if (e.name == name) return e;
  }
  return LibError(path_, "no kernel named '" + std::string(name) + "' (it provides " + names +
                             ")");
}

KernelAnswer<ForwardResult> CallPluginForward(const PluginEntry& entry, const Problem& p,
                                              const Tensor& q, const Tensor& k,
                                              const Tensor& v) {
  if (AbiDType(p.dtype) < 0) {
    return Unsupported{"dtype " + std::string(Name(p.dtype)) + " has no C ABI code"};
  }
  if (Status s = ValidateInputShapes(p, q, k, v); !s.ok()) return s.error();
  auto inputs = EncodeInputs({{&q, p.dtype, "q"}, {&k, p.dtype, "k"}, {&v, p.dtype, "v"}});
  if (!inputs.ok()) return inputs.error();
  CallPlan plan;
  plan.inputs = std::move(*inputs);
  plan.outputs.push_back(Output("o", p.dtype, p.OShape()));
  plan.outputs.push_back(Output("lse", DType::kF32, p.LseShape()));
  const std::string json_text = ProblemToJson(p).dump();
  const attest_problem problem = AbiProblem(p, json_text);
  auto answer = Invoke(entry, "forward", plan, [&](void* stream, char* msg, size_t size) {
    attest_forward_args args{};
    args.struct_size = sizeof(attest_forward_args);
    args.problem = &problem;
    args.q = plan.inputs[0].view;
    args.k = plan.inputs[1].view;
    args.v = plan.inputs[2].view;
    args.o = plan.outputs[0].view;
    args.lse = plan.outputs[1].view;
    args.stream = stream;
    return entry.desc->forward(entry.desc->self, &args, msg, size);
  });
  if (auto* u = std::get_if<Unsupported>(&answer)) return *u;
  if (auto* e = std::get_if<Error>(&answer)) return *e;
  auto& out = std::get<std::vector<Tensor>>(answer);
  return ForwardResult{out[0], out[1]};
}

KernelAnswer<BackwardResult> CallPluginBackward(const PluginEntry& entry, const Problem& p,
                                                const Tensor& q, const Tensor& k,
                                                const Tensor& v, const Tensor& o,
                                                const Tensor& lse, const Tensor& dout) {
  if (entry.desc->backward == nullptr) return Unsupported{"forward-only kernel (backward NULL)"};
  if (AbiDType(p.dtype) < 0) {
    return Unsupported{"dtype " + std::string(Name(p.dtype)) + " has no C ABI code"};
  }
  if (Status s = ValidateInputShapes(p, q, k, v, &dout); !s.ok()) return s.error();
  if (o.shape() != p.OShape() || lse.shape() != p.LseShape()) {
    return Error{"plugin " + entry.library + ":" + entry.name + " backward: o is " +
                 o.Describe() + " and lse " + lse.Describe() + ", expected the problem's shapes"};
  }
  auto inputs = EncodeInputs({{&q, p.dtype, "q"},
                              {&k, p.dtype, "k"},
                              {&v, p.dtype, "v"},
                              {&o, p.dtype, "o"},
                              {&lse, DType::kF32, "lse"},
                              {&dout, p.dtype, "do"}});
  if (!inputs.ok()) return inputs.error();
  CallPlan plan;
  plan.inputs = std::move(*inputs);
  plan.outputs.push_back(Output("dq", p.dtype, p.QShape()));
  plan.outputs.push_back(Output("dk", p.dtype, p.KShape()));
  plan.outputs.push_back(Output("dv", p.dtype, p.VShape()));
  const std::string json_text = ProblemToJson(p).dump();
  const attest_problem problem = AbiProblem(p, json_text);
  auto answer = Invoke(entry, "backward", plan, [&](void* stream, char* msg, size_t size) {
    attest_backward_args args{};
    args.struct_size = sizeof(attest_backward_args);
    args.problem = &problem;
    args.q = plan.inputs[0].view;
    args.k = plan.inputs[1].view;
    args.v = plan.inputs[2].view;
    args.o = plan.inputs[3].view;
    args.lse = plan.inputs[4].view;
    args.dout = plan.inputs[5].view;
    args.dq = plan.outputs[0].view;
    args.dk = plan.outputs[1].view;
    args.dv = plan.outputs[2].view;
    args.stream = stream;
    return entry.desc->backward(entry.desc->self, &args, msg, size);
  });
  if (auto* u = std::get_if<Unsupported>(&answer)) return *u;
  if (auto* e = std::get_if<Error>(&answer)) return *e;
  auto& out = std::get<std::vector<Tensor>>(answer);
  return BackwardResult{out[0], out[1], out[2]};
}

}  // namespace attest
