// The host memory a process may count on, where a cgroup limits it: cgroup
// v1 (the limit in force, an ancestor's included) and v2 (every level up to
// the root), from fake /proc/self/cgroup files and cgroup trees; and the
// real machine's figure against MemAvailable.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "zero/core/error.h"
#include "zero/core/host_memory.h"

namespace zero {
namespace {

namespace fs = std::filesystem;

class CgroupTree : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("zero_cgroup_test_" + std::to_string(::getpid()));
    fs::create_directories(root_);
  }
  void TearDown() override {
    // Deepest first (not std::filesystem::remove_all: see source_rules_test.sh).
    std::vector<fs::path> all;
    for (const auto& e : fs::recursive_directory_iterator(root_)) all.push_back(e.path());
    std::sort(all.rbegin(), all.rend());
    std::error_code ec;
    for (const fs::path& p : all) fs::remove(p, ec);
    fs::remove(root_, ec);
  }
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string proc() const { return (root_ / "proc_cgroup").string(); }
  std::string mount() const { return (root_ / "sys").string(); }
  fs::path root_;
};

TEST_F(CgroupTree, V1LimitLeavesLimitMinusUsagePlusInactiveCache) {
  write("proc_cgroup", "9:name=systemd:/\n4:memory:/job/42\n0::/\n");
  write("sys/memory/job/42/memory.limit_in_bytes", "1073741824\n");
  write("sys/memory/job/42/memory.usage_in_bytes", "268435456\n");
  write("sys/memory/job/42/memory.stat", "cache 100\ntotal_inactive_file 1048576\n");
  const auto cg = detail::cgroup_memory_available(proc(), mount());
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->available, 1073741824 - 268435456 + 1048576);
  EXPECT_NE(cg->limit_file.find("job/42/memory.limit_in_bytes"), std::string::npos) << cg->limit_file;
}

// An ancestor's limit is shared with its other children: what it leaves is
// its limit less its own usage (which counts theirs), not the leaf's.
TEST_F(CgroupTree, V1AncestorsLimitWithItsOwnUsage) {
  write("proc_cgroup", "4:cpu,memory:/pod/container\n");
  write("sys/memory/pod/container/memory.limit_in_bytes", "9223372036854771712\n");
  write("sys/memory/pod/container/memory.usage_in_bytes", "1000\n");
  write("sys/memory/pod/memory.limit_in_bytes", "5000\n");
  write("sys/memory/pod/memory.usage_in_bytes", "4000\n");  // a sibling's 3000 too
  const auto cg = detail::cgroup_memory_available(proc(), mount());
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->available, 1000);
  EXPECT_NE(cg->limit_file.find("pod/memory.limit_in_bytes"), std::string::npos) << cg->limit_file;
}

// Docker on cgroup v1 without a cgroup namespace: /proc/self/cgroup names the
// host's path, while the mount's root is the container's own cgroup.
TEST_F(CgroupTree, V1ContainerSeesItsCgroupAtTheMountRoot) {
  write("proc_cgroup", "4:memory:/docker/0123abcd\n");
  write("sys/memory/memory.limit_in_bytes", "2000000\n");
  write("sys/memory/memory.usage_in_bytes", "500000\n");
  const auto cg = detail::cgroup_memory_available(proc(), mount());
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->available, 1500000);
}

TEST_F(CgroupTree, V1UnlimitedAndMissingAreNone) {
  write("proc_cgroup", "4:memory:/free\n5:memory:/gone\n");
  write("sys/memory/free/memory.limit_in_bytes", "9223372036854771712\n");
  write("sys/memory/free/memory.usage_in_bytes", "1000\n");
  EXPECT_FALSE(detail::cgroup_memory_available(proc(), mount()).has_value());
  EXPECT_FALSE(detail::cgroup_memory_available((root_ / "no_such_file").string(), mount()).has_value());
}

TEST_F(CgroupTree, V2TheTightestLevelUpToTheRoot) {
  write("proc_cgroup", "0::/user.slice/job.scope\n");
  write("sys/user.slice/job.scope/memory.max", "max\n");
  write("sys/user.slice/job.scope/memory.current", "500\n");
  write("sys/user.slice/memory.max", "3000\n");
  write("sys/user.slice/memory.current", "1000\n");
  write("sys/user.slice/memory.stat", "anon 900\ninactive_file 200\n");
  const auto cg = detail::cgroup_memory_available(proc(), mount());
  ASSERT_TRUE(cg.has_value());
  EXPECT_EQ(cg->available, 3000 - 1000 + 200);
  EXPECT_NE(cg->limit_file.find("user.slice/memory.max"), std::string::npos) << cg->limit_file;
  // Used past its limit (the OOM killer's territory): nothing left, not less.
  write("sys/user.slice/memory.current", "9000\n");
  EXPECT_EQ(detail::cgroup_memory_available(proc(), mount())->available, 0);
}

// The limit reaches the figure the engine checks against, and its source is
// named (the cgroup files pointed to a tree of the test's own).
TEST_F(CgroupTree, TheLimitIsWhatTheHostHas) {
  write("proc_cgroup", "4:memory:/job\n");
  write("sys/memory/job/memory.limit_in_bytes", "3145728\n");
  write("sys/memory/job/memory.usage_in_bytes", "1048576\n");
  ::setenv("ZERO_TEST_PROC_CGROUP", proc().c_str(), 1);
  ::setenv("ZERO_TEST_CGROUP_MOUNT", mount().c_str(), 1);
  ::unsetenv("ZERO_HOST_MEMORY_LIMIT");
  const auto available = host_memory_available();
  const std::string source = host_memory_source();
  ::unsetenv("ZERO_TEST_PROC_CGROUP");
  ::unsetenv("ZERO_TEST_CGROUP_MOUNT");
  ASSERT_TRUE(available.has_value());
  EXPECT_EQ(*available, 2097152);
  EXPECT_NE(source.find("the memory limit of this process's cgroup"), std::string::npos) << source;
  EXPECT_NE(source.find("job/memory.limit_in_bytes"), std::string::npos) << source;
}

TEST(HostMemory, NeverMoreThanMemAvailableOrTheVariable) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kib = 0, available = -1;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") available = kib * 1024;
  }
  ASSERT_GT(available, 0);
  ::unsetenv("ZERO_HOST_MEMORY_LIMIT");
  ASSERT_TRUE(host_memory_available().has_value());
  // (MemAvailable moves between the two reads: a margin.)
  EXPECT_LE(*host_memory_available(), available + (std::int64_t{256} << 20));
  ::setenv("ZERO_HOST_MEMORY_LIMIT", "1M", 1);
  EXPECT_EQ(*host_memory_available(), std::int64_t{1} << 20);
  EXPECT_EQ(host_memory_source(), "ZERO_HOST_MEMORY_LIMIT");
  // Past what 64 bits count (inf, 1e19, 1e10T): no limit of its own, the
  // host's holds (it wrapped to a negative count before).
  for (const char* huge : {"inf", "1e19", "1e10T", "9223372036854775808"}) {
    ::setenv("ZERO_HOST_MEMORY_LIMIT", huge, 1);
    ASSERT_TRUE(host_memory_available().has_value()) << huge;
    EXPECT_GT(*host_memory_available(), 0) << huge;
    EXPECT_LE(*host_memory_available(), available + (std::int64_t{256} << 20)) << huge;
    EXPECT_NE(host_memory_source(), "ZERO_HOST_MEMORY_LIMIT") << huge;
  }
  // Less than a byte is no budget at all: said (it was 0 bytes).
  ::setenv("ZERO_HOST_MEMORY_LIMIT", "0.5", 1);
  try {
    (void)host_memory_available();
    ADD_FAILURE() << "ZERO_HOST_MEMORY_LIMIT=0.5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ZERO_HOST_MEMORY_LIMIT='0.5' is less than one byte"), std::string::npos)
        << e.what();
  }
  ::unsetenv("ZERO_HOST_MEMORY_LIMIT");
}

}  // namespace
}  // namespace zero
