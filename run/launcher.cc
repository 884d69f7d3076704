#include "run/launcher.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace attest {
namespace {

// A variable that must hold an integer in [min, max] when it is set.
Expected<std::optional<int64_t>> IntVar(const EnvLookup& env, const std::string& name,
                                        int64_t min, int64_t max = int64_t{1} << 40) {
  auto text = env(name);
  if (!text) return std::optional<int64_t>{};
  int64_t value = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, value);
  if (text->empty() || ec != std::errc() || ptr != end || value < min || value > max) {
    return Error{fmt::format("the launcher's variable {}='{}' is not an integer in [{}, {}]",
                             name, *text, min, max)};
  }
  return std::optional<int64_t>(value);
}

// RANK-of-SIZE pairs: both set, or neither (one alone is an error naming the other).
Expected<std::optional<LauncherShard>> Pair(const EnvLookup& env, const std::string& rank,
                                            const std::string& size) {
  auto r = IntVar(env, rank, 0);
  if (!r) return r.error();
  auto n = IntVar(env, size, 1);
  if (!n) return n.error();
  if (!r->has_value() && !n->has_value()) return std::optional<LauncherShard>{};
  if (!r->has_value() || !n->has_value()) {
    return Error{fmt::format("the launcher set {} but not {}", r->has_value() ? rank : size,
                             r->has_value() ? size : rank)};
  }
  if (**r >= **n) {
    return Error{fmt::format("the launcher's {}={} is not below {}={}", rank, **r, size, **n)};
  }
  return std::optional<LauncherShard>(LauncherShard{**r, **n, rank + "/" + size});
}

Expected<std::optional<LauncherShard>> SlurmArray(const EnvLookup& env) {
  auto id = IntVar(env, "SLURM_ARRAY_TASK_ID", 0);
  if (!id) return id.error();
  if (!id->has_value()) return std::optional<LauncherShard>{};
  auto count = IntVar(env, "SLURM_ARRAY_TASK_COUNT", 1);
  if (!count) return count.error();
  if (!count->has_value()) {
    return Error{"the launcher set SLURM_ARRAY_TASK_ID but not SLURM_ARRAY_TASK_COUNT"};
  }
  auto min = IntVar(env, "SLURM_ARRAY_TASK_MIN", 0);
  if (!min) return min.error();
  auto step = IntVar(env, "SLURM_ARRAY_TASK_STEP", 1);
  if (!step) return step.error();
  const int64_t lo = min->value_or(0), st = step->value_or(1);
  if (**id < lo || (**id - lo) % st != 0 || (**id - lo) / st >= **count) {
    return Error{fmt::format(
        "SLURM_ARRAY_TASK_ID={} is not one of {} ids from SLURM_ARRAY_TASK_MIN={} in steps of "
        "{}: give the array as --array=0-{} (or pass --shard I/N yourself)",
        **id, **count, lo, st, **count - 1)};
  }
  LauncherShard s{(**id - lo) / st, **count, "SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT"};
  // Several tasks inside each array task (srun --ntasks N in the batch script): each takes
  // its own slice of the array task's shard.
  auto inner = Pair(env, "SLURM_PROCID", "SLURM_NTASKS");
  if (!inner) return inner.error();
  if (inner->has_value() && (*inner)->count > 1) {
    s.index = s.index * (*inner)->count + (*inner)->index;
    s.count *= (*inner)->count;
    s.source += " x SLURM_PROCID/SLURM_NTASKS";
  }
  return std::optional<LauncherShard>(s);
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Expected<LauncherShard> ShardFromLauncher(const EnvLookup& env) {
  auto array = SlurmArray(env);
  if (!array) return array.error();
  if (array->has_value()) return **array;
  for (const auto& [rank, size] :
       {std::pair<std::string, std::string>{"SLURM_PROCID", "SLURM_NTASKS"},
        {"RANK", "WORLD_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"}}) {
    auto p = Pair(env, rank, size);
    if (!p) return p.error();
    if (p->has_value()) return **p;
  }
  auto k8s = IntVar(env, "JOB_COMPLETION_INDEX", 0);
  if (!k8s) return k8s.error();
  if (k8s->has_value()) {
    auto count = IntVar(env, "ATTEST_SHARD_COUNT", 1);
    if (!count) return count.error();
    if (!count->has_value()) {
      return Error{"JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job) but not "
                   "ATTEST_SHARD_COUNT: set it to the Job's completions"};
    }
    if (**k8s >= **count) {
      return Error{fmt::format("JOB_COMPLETION_INDEX={} is not below ATTEST_SHARD_COUNT={}",
                               **k8s, **count)};
    }
    return LauncherShard{**k8s, **count, "JOB_COMPLETION_INDEX/ATTEST_SHARD_COUNT"};
  }
  return Error{
      "--shard auto: no launcher variables are set (SLURM_ARRAY_TASK_ID and "
      "SLURM_ARRAY_TASK_COUNT, SLURM_PROCID and SLURM_NTASKS, RANK and WORLD_SIZE, "
      "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE, PMI_RANK and PMI_SIZE, or "
      "JOB_COMPLETION_INDEX and ATTEST_SHARD_COUNT); give --shard I/N"};
}

nlohmann::json GpuChoice::ToJson() const {
  return {{"local_rank", local_rank},
          {"local_rank_from", rank_source},
          {"visible", visible},
          {"visible_from", visible_source},
          {"chosen", chosen}};
}

Expected<std::optional<GpuChoice>> ChooseGpu(const EnvLookup& env, int64_t nvidia_gpus) {
  GpuChoice c;
  bool found = false;
  for (const char* name :
       {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}) {
    auto r = IntVar(env, name, 0);
    if (!r) return r.error();
    if (r->has_value()) {
      c.local_rank = **r;
      c.rank_source = name;
      found = true;
      break;
    }
  }
  if (!found) return std::optional<GpuChoice>{};
  if (auto list = env("CUDA_VISIBLE_DEVICES")) {
    c.visible = SplitList(*list);
    c.visible_source = "CUDA_VISIBLE_DEVICES";
  } else if (auto hip = env("HIP_VISIBLE_DEVICES")) {
    c.visible = SplitList(*hip);
    c.visible_source = "HIP_VISIBLE_DEVICES";
  } else {
    for (int64_t i = 0; i < nvidia_gpus; ++i) c.visible.push_back(std::to_string(i));
    c.visible_source = "/proc/driver/nvidia/gpus";
  }
  if (c.visible.size() <= 1) return std::optional<GpuChoice>{};
  c.chosen = c.visible[static_cast<size_t>(c.local_rank) % c.visible.size()];
  return std::optional<GpuChoice>(c);
}

int64_t CountNvidiaGpus() {
  std::error_code ec;
  int64_t n = 0;
  for (std::filesystem::directory_iterator it("/proc/driver/nvidia/gpus", ec), end;
       !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

Expected<std::optional<GpuChoice>> ApplyLauncherGpu() {
  auto choice = ChooseGpu(ProcessEnvironment(), CountNvidiaGpus());
  if (!choice || !choice->has_value()) return choice;
  const std::string var = (*choice)->visible_source == "HIP_VISIBLE_DEVICES"
                              ? "HIP_VISIBLE_DEVICES"
                              : "CUDA_VISIBLE_DEVICES";
  ::setenv(var.c_str(), (*choice)->chosen.c_str(), 1);
  return choice;
}

}  // namespace attest
