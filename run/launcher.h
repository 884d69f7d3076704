// What a job launcher tells a process about its place in a campaign (docs/fuzz.md "Campaigns
// across GPUs"): which shard of the cases it runs, and which GPU of the node it uses.
//
// Shards (`attest fuzz --shard auto`), from the first launcher whose variables are set:
//   - a Slurm job array, SLURM_ARRAY_TASK_ID of SLURM_ARRAY_TASK_COUNT tasks (ids from
//     SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP; sbatch(1) "OUTPUT ENVIRONMENT
//     VARIABLES"), times the tasks of the step inside each array task (SLURM_PROCID of
//     SLURM_NTASKS) when there are several;
//   - the tasks of one Slurm step alone: SLURM_PROCID of SLURM_NTASKS (srun(1));
//   - torchrun / torch.distributed: RANK of WORLD_SIZE (PyTorch "torchrun (Elastic Launch)");
//   - Open MPI: OMPI_COMM_WORLD_RANK of OMPI_COMM_WORLD_SIZE (mpirun(1) "Environment
//     Variables"); MPICH / Intel MPI (Hydra): PMI_RANK of PMI_SIZE;
//   - a Kubernetes Indexed Job: JOB_COMPLETION_INDEX (Kubernetes "Indexed Job for Parallel
//     Processing with Static Work Assignment"), whose shard count the pod cannot read from its
//     environment: ATTEST_SHARD_COUNT gives it (the Job's `completions`).
// GPUs: a process that a launcher started as one of several on a node (LOCAL_RANK from
// torchrun, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID) takes the visible GPU
// local_rank mod count, where the visible GPUs are CUDA_VISIBLE_DEVICES's list (else
// HIP_VISIBLE_DEVICES's on a ROCm node, else the node's NVIDIA GPUs, /proc/driver/nvidia/gpus),
// and narrows that variable (CUDA_VISIBLE_DEVICES in the last case) to it for itself and the
// kernel processes it starts (exec workers), before any GPU call: the CUDA oracle and every
// worker then see that one GPU as device 0. More local ranks than GPUs share GPUs
// round-robin.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "reference/status.h"

namespace attest {

// Reads one environment variable (std::getenv in the CLI; a map in tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup ProcessEnvironment();

struct LauncherShard {
  int64_t index = 0;
  int64_t count = 1;
  std::string source;  // the variables it came from, e.g. "RANK/WORLD_SIZE"
};

// The shard the launcher assigns. Error (a usage error, exit code 2) when no launcher's
// variables are set, or when one is malformed (the message names the variable).
Expected<LauncherShard> ShardFromLauncher(const EnvLookup& env);

struct GpuChoice {
  int64_t local_rank = 0;
  std::string rank_source;            // "LOCAL_RANK", "SLURM_LOCALID", ...
  std::vector<std::string> visible;   // the GPUs the node made visible, in order
  std::string chosen;                 // the entry of `visible` this process takes
  std::string visible_source;  // "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES" or
                               // "/proc/driver/nvidia/gpus"
  nlohmann::json ToJson() const;
};

// The GPU this process should take: nullopt when no launcher set a local rank, or when at most
// one GPU is visible (nothing to choose). `nvidia_gpus`: the node's NVIDIA GPU count, used
// where CUDA_VISIBLE_DEVICES is unset. Error when a variable is malformed.
Expected<std::optional<GpuChoice>> ChooseGpu(const EnvLookup& env, int64_t nvidia_gpus);

// The NVIDIA GPUs the driver lists (entries of /proc/driver/nvidia/gpus; 0 without the driver).
int64_t CountNvidiaGpus();

// `--gpu auto` of `attest check` and `attest fuzz`: ChooseGpu on the process environment and,
// when it chooses, narrows the visible-devices variable to the chosen GPU. Returns what it chose (nullopt: the environment was left as it was).
Expected<std::optional<GpuChoice>> ApplyLauncherGpu();

}  // namespace attest
