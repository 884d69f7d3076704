#include "run/launcher.h"

#include <gtest/gtest.h>

#include <map>

namespace attest {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Launcher, TorchrunRankAndWorldSize) {
  auto s = ShardFromLauncher(Env({{"RANK", "3"}, {"WORLD_SIZE", "8"}}));
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->index, 3);
  EXPECT_EQ(s->count, 8);
  EXPECT_EQ(s->source, "RANK/WORLD_SIZE");
}

TEST(Launcher, SlurmArrayWithMinStepAndTasksInside) {
  // --array=10-16:2 gives ids 10, 12, 14, 16; task 14 is the third.
  auto s = ShardFromLauncher(Env({{"SLURM_ARRAY_TASK_ID", "14"},
                                  {"SLURM_ARRAY_TASK_COUNT", "4"},
                                  {"SLURM_ARRAY_TASK_MIN", "10"},
                                  {"SLURM_ARRAY_TASK_STEP", "2"}}));
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->index, 2);
  EXPECT_EQ(s->count, 4);
  // Two srun tasks inside each array task: 8 shards, array task 2's second task is shard 5.
  auto t = ShardFromLauncher(Env({{"SLURM_ARRAY_TASK_ID", "2"},
                                  {"SLURM_ARRAY_TASK_COUNT", "4"},
                                  {"SLURM_PROCID", "1"},
                                  {"SLURM_NTASKS", "2"},
                                  {"RANK", "0"},
                                  {"WORLD_SIZE", "1"}}));
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->index, 5);
  EXPECT_EQ(t->count, 8);
  // An id outside the array is named, not wrapped.
  auto bad = ShardFromLauncher(
      Env({{"SLURM_ARRAY_TASK_ID", "5"}, {"SLURM_ARRAY_TASK_COUNT", "4"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("SLURM_ARRAY_TASK_ID=5"), std::string::npos);
}

TEST(Launcher, SlurmStepMpiAndKubernetes) {
  auto slurm = ShardFromLauncher(Env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}}));
  ASSERT_TRUE(slurm.ok());
  EXPECT_EQ(slurm->index, 1);
  auto ompi =
      ShardFromLauncher(Env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"}}));
  ASSERT_TRUE(ompi.ok());
  EXPECT_EQ(ompi->count, 3);
  auto k8s = ShardFromLauncher(Env({{"JOB_COMPLETION_INDEX", "6"}, {"ATTEST_SHARD_COUNT", "7"}}));
  ASSERT_TRUE(k8s.ok());
  EXPECT_EQ(k8s->index, 6);
  EXPECT_EQ(k8s->count, 7);
  auto k8s_no_count = ShardFromLauncher(Env({{"JOB_COMPLETION_INDEX", "6"}}));
  ASSERT_FALSE(k8s_no_count.ok());
  EXPECT_NE(k8s_no_count.error().message.find("ATTEST_SHARD_COUNT"), std::string::npos);
}

TEST(Launcher, MalformedOrMissingVariablesAreNamed) {
  auto none = ShardFromLauncher(Env({}));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("--shard I/N"), std::string::npos);
  for (const auto& [vars, name] :
       std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x'"},
           {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK='-1'"},
           {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is not below WORLD_SIZE=2"},
           {{{"RANK", "1"}}, "set RANK but not WORLD_SIZE"},
           {{{"WORLD_SIZE", "0"}}, "WORLD_SIZE='0'"}}) {
    auto s = ShardFromLauncher(Env(vars));
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_NE(s.error().message.find(name), std::string::npos) << s.error().message;
  }
}

TEST(Launcher, LocalRankTakesItsGpuRoundRobin) {
  auto c = ChooseGpu(Env({{"LOCAL_RANK", "5"}, {"CUDA_VISIBLE_DEVICES", "2,3,6,7"}}), 8);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->chosen, "3");  // 5 mod 4 = 1
  EXPECT_EQ((*c)->visible_source, "CUDA_VISIBLE_DEVICES");
  // CUDA_VISIBLE_DEVICES unset: the node's GPUs by count.
  auto d = ChooseGpu(Env({{"SLURM_LOCALID", "2"}}), 4);
  ASSERT_TRUE(d.ok() && d->has_value());
  EXPECT_EQ((*d)->chosen, "2");
  EXPECT_EQ((*d)->rank_source, "SLURM_LOCALID");
  // Nothing to choose: no local rank, one GPU, no GPU, an empty list.
  for (const auto& vars : std::vector<std::map<std::string, std::string>>{
           {{"CUDA_VISIBLE_DEVICES", "0,1"}},
           {{"LOCAL_RANK", "1"}, {"CUDA_VISIBLE_DEVICES", "4"}},
           {{"LOCAL_RANK", "1"}},
           {{"LOCAL_RANK", "1"}, {"CUDA_VISIBLE_DEVICES", ""}}}) {
    auto none = ChooseGpu(Env(vars), 0);
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value());
  }
  auto bad = ChooseGpu(Env({{"LOCAL_RANK", "one"}}), 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("LOCAL_RANK='one'"), std::string::npos);
}

}  // namespace
}  // namespace attest
