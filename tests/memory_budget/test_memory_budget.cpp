// read_memory_budget() over fake /proc and /sys trees: cgroup v1 and v2 limits of the
// process's own cgroup and its ancestors, "no limit" values, RLIMIT_AS, MemAvailable,
// the lowest winning, and unreadable or malformed files skipped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "tessera/memory_budget.h"

namespace fs = std::filesystem;
using tessera::MemoryBudget;
using tessera::read_memory_budget;

namespace {

constexpr uint64_t GiB = uint64_t(1) << 30, MiB = uint64_t(1) << 20;

class FakeRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("tessera_memory_budget_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }
  // The files of a process in cgroup v1 memory cgroup `path`, v1 mounted at
  // /sys/fs/cgroup/memory (as on the build machine), nothing else limiting.
  void v1_process(const std::string& path, const std::string& mount_root = "/") {
    write("proc/self/cgroup", "9:name=systemd:/\n5:devices:/\n4:memory:" + path + "\n3:cpuset:/\n0::/\n");
    write("proc/self/mountinfo",
          "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
          "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
          "35 31 0:32 " + mount_root + " /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n");
  }
  void v2_process(const std::string& path) {
    write("proc/self/cgroup", "0::" + path + "\n");
    write("proc/self/mountinfo", "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
                                 "rw,nsdelegate,memory_recursiveprot\n");
  }
  void meminfo(uint64_t available) {
    write("proc/meminfo", "MemTotal:       24683656 kB\nMemFree:        23416672 kB\nMemAvailable:   " +
                              std::to_string(available / 1024) + " kB\nBuffers:            8224 kB\n");
  }
  MemoryBudget read() { return read_memory_budget(root_.string()); }

  fs::path root_;
};

TEST_F(FakeRoot, CgroupV1LimitMinusWorkingSet) {
  v1_process("/process_api/abc");
  const std::string dir = "sys/fs/cgroup/memory/process_api/abc/";
  write(dir + "memory.limit_in_bytes", std::to_string(12 * GiB) + "\n");
  write(dir + "memory.usage_in_bytes", std::to_string(300 * MiB) + "\n");
  write(dir + "memory.stat", "cache 1000\nrss 2000\ninactive_file 1\ntotal_inactive_file " + std::to_string(100 * MiB) + "\n");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");  // the root: no limit
  meminfo(20 * GiB);
  const MemoryBudget b = read();
  ASSERT_TRUE(b.limited());
  EXPECT_TRUE(b.hard());
  EXPECT_EQ(b.bytes, 12 * GiB - 200 * MiB);
  const auto& l = b.limits[size_t(b.binding)];
  EXPECT_EQ(l.source, "cgroup v1 memory.limit_in_bytes");
  EXPECT_EQ(l.where, "");
  EXPECT_EQ(b.describe(), "memory budget 11.8 GiB (cgroup v1 memory.limit_in_bytes 12.0 GiB minus 200 MiB in use)");
  ASSERT_EQ(b.limits.size(), 2u);  // the cgroup's and MemAvailable
  EXPECT_EQ(b.limits[1].source, "MemAvailable");
}

TEST_F(FakeRoot, CgroupV1HugeLimitIsNone) {
  v1_process("/process_api/abc");
  write("sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712\n");
  write("sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes", "123456789\n");
  write("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "9223372036854775807\n");
  meminfo(20 * GiB);
  const MemoryBudget b = read();
  ASSERT_EQ(b.limits.size(), 1u);
  EXPECT_EQ(b.limits[0].source, "MemAvailable");
  EXPECT_EQ(b.bytes, 20 * GiB);
  EXPECT_FALSE(b.hard());  // MemAvailable is an estimate
  EXPECT_EQ(b.describe(), "memory budget 20.0 GiB (MemAvailable 20.0 GiB)");
}

TEST_F(FakeRoot, CgroupV1AncestorLimitCounts) {
  // A child cgroup without a limit of its own, under a parent limited to 8 GiB.
  v1_process("/process_api/abc/child");
  const std::string base = "sys/fs/cgroup/memory/process_api/abc/";
  write(base + "child/memory.limit_in_bytes", "9223372036854771712\n");
  write(base + "child/memory.usage_in_bytes", "0\n");
  write(base + "memory.limit_in_bytes", std::to_string(8 * GiB));
  write(base + "memory.usage_in_bytes", std::to_string(1 * GiB));
  meminfo(20 * GiB);
  const MemoryBudget b = read();
  ASSERT_TRUE(b.hard());
  EXPECT_EQ(b.bytes, 7 * GiB);
  EXPECT_EQ(b.limits[size_t(b.binding)].where, "/process_api/abc");
  EXPECT_NE(b.describe().find("of cgroup /process_api/abc 8.0 GiB minus 1.0 GiB in use"), std::string::npos) << b.describe();
}

TEST_F(FakeRoot, CgroupV1ContainerMountShowsItsOwnCgroupAtTheTop) {
  // Without a cgroup namespace: /proc/self/cgroup names /docker/abc, and the
  // container's mount shows that cgroup at /sys/fs/cgroup/memory.
  v1_process("/docker/abc", "/docker/abc");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", std::to_string(6 * GiB));
  write("sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(1 * GiB));
  meminfo(20 * GiB);
  const MemoryBudget b = read();
  ASSERT_TRUE(b.hard());
  EXPECT_EQ(b.bytes, 5 * GiB);
}

TEST_F(FakeRoot, CgroupV2MaxMinusCurrent) {
  v2_process("/user.slice/app.scope");
  const std::string dir = "sys/fs/cgroup/user.slice/app.scope/";
  write(dir + "memory.max", std::to_string(6 * GiB) + "\n");
  write(dir + "memory.current", std::to_string(512 * MiB) + "\n");
  write(dir + "memory.stat", "anon 100\nfile 200\ninactive_file " + std::to_string(256 * MiB) + "\nactive_file 5\n");
  write("sys/fs/cgroup/user.slice/memory.max", "max\n");
  meminfo(20 * GiB);
  const MemoryBudget b = read();
  ASSERT_TRUE(b.hard());
  EXPECT_EQ(b.bytes, 6 * GiB - 256 * MiB);
  EXPECT_EQ(b.limits[size_t(b.binding)].source, "cgroup v2 memory.max");
  EXPECT_EQ(b.describe(), "memory budget 5.8 GiB (cgroup v2 memory.max 6.0 GiB minus 256 MiB in use)");
}

TEST_F(FakeRoot, CgroupV2MaxIsNone) {
  v2_process("/a");
  write("sys/fs/cgroup/a/memory.max", "max\n");
  write("sys/fs/cgroup/a/memory.current", "1000\n");
  meminfo(3 * GiB);
  const MemoryBudget b = read();
  ASSERT_EQ(b.limits.size(), 1u);
  EXPECT_EQ(b.limits[0].source, "MemAvailable");
  EXPECT_EQ(b.bytes, 3 * GiB);
}

TEST_F(FakeRoot, RlimitAsMinusAddressSpaceMapped) {
  write("proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max stack size            8388608              unlimited            bytes     \n"
        "Max address space         " + std::to_string(4 * GiB) + "           unlimited            bytes     \n"
        "Max file locks            unlimited            unlimited            locks     \n");
  write("proc/self/status", "Name:\ttessera\nVmPeak:\t 2000000 kB\nVmSize:\t 1048576 kB\nVmRSS:\t 1000 kB\n");
  meminfo(20 * GiB);
  const MemoryBudget b = read();
  ASSERT_TRUE(b.hard());
  EXPECT_EQ(b.bytes, 3 * GiB);
  EXPECT_EQ(b.describe(), "memory budget 3.0 GiB (RLIMIT_AS 4.0 GiB minus 1.0 GiB mapped)");
}

TEST_F(FakeRoot, RlimitAsUnlimitedIsNone) {
  write("proc/self/limits", "Max address space         unlimited            unlimited            bytes     \n");
  write("proc/self/status", "VmSize:\t 1048576 kB\n");
  meminfo(2 * GiB);
  const MemoryBudget b = read();
  ASSERT_EQ(b.limits.size(), 1u);
  EXPECT_EQ(b.limits[0].source, "MemAvailable");
}

TEST_F(FakeRoot, TheLowestWins) {
  // A hybrid system: v1's memory controller and a v2 hierarchy, RLIMIT_AS and
  // MemAvailable; the v2 cgroup leaves the least.
  write("proc/self/cgroup", "4:memory:/m\n0::/u\n");
  write("proc/self/mountinfo",
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "36 31 0:33 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  write("sys/fs/cgroup/memory/m/memory.limit_in_bytes", std::to_string(12 * GiB));
  write("sys/fs/cgroup/memory/m/memory.usage_in_bytes", std::to_string(1 * GiB));
  write("sys/fs/cgroup/unified/u/memory.max", std::to_string(10 * GiB));
  write("sys/fs/cgroup/unified/u/memory.current", std::to_string(2 * GiB));
  write("proc/self/limits", "Max address space         " + std::to_string(16 * GiB) + " unlimited bytes\n");
  write("proc/self/status", "VmSize:\t 0 kB\n");
  meminfo(9 * GiB);
  const MemoryBudget b = read();
  ASSERT_EQ(b.limits.size(), 4u);
  EXPECT_EQ(b.bytes, 8 * GiB);
  EXPECT_EQ(b.limits[size_t(b.binding)].source, "cgroup v2 memory.max");
  // MemAvailable below every hard limit binds, and the budget is then not hard.
  meminfo(7 * GiB);
  const MemoryBudget c = read();
  EXPECT_EQ(c.bytes, 7 * GiB);
  EXPECT_FALSE(c.hard());
}

TEST_F(FakeRoot, UsageAboveTheLimitLeavesNothing) {
  v1_process("/x");
  write("sys/fs/cgroup/memory/x/memory.limit_in_bytes", std::to_string(1 * GiB));
  write("sys/fs/cgroup/memory/x/memory.usage_in_bytes", std::to_string(2 * GiB));
  meminfo(9 * GiB);
  const MemoryBudget b = read();
  EXPECT_EQ(b.bytes, 0u);
  EXPECT_TRUE(b.hard());
}

TEST_F(FakeRoot, MalformedAndUnreadableFilesAreSkipped) {
  write("proc/self/cgroup", "garbage\n4:memory\n::\n4:memory:relative/path\n4:memory:/x\n");
  write("proc/self/mountinfo",
        "short line\n"
        "1 2 3 - cgroup\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  const std::string dir = "sys/fs/cgroup/memory/x/";
  write(dir + "memory.limit_in_bytes", "12G\n");                 // not a number
  write(dir + "memory.usage_in_bytes", "-5\n");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "99999999999999999999999\n");  // overflows
  write("proc/self/limits", "Max address space         lots                 unlimited            bytes\n");
  fs::create_directories(root_ / "proc/self/status");  // a folder where a file should be
  write("proc/meminfo", "MemAvailable:   notanumber kB\nMemTotal: 1 kB\n");
  const MemoryBudget b = read();
  EXPECT_FALSE(b.limited());
  EXPECT_TRUE(b.limits.empty());
  EXPECT_EQ(b.bytes, MemoryBudget::kUnlimited);
  EXPECT_NE(b.describe().find("no limit found"), std::string::npos);
}

TEST_F(FakeRoot, UnreadableUsageKeepsTheLimit) {
  v2_process("/a");
  write("sys/fs/cgroup/a/memory.max", std::to_string(4 * GiB));
  fs::create_directories(root_ / "sys/fs/cgroup/a/memory.current");  // unreadable as a file
  write("sys/fs/cgroup/a/memory.stat", "inactive_file x\n");
  const MemoryBudget b = read();
  ASSERT_TRUE(b.hard());
  EXPECT_EQ(b.bytes, 4 * GiB);
}

TEST_F(FakeRoot, EscapedMountPoint) {
  write("proc/self/cgroup", "0::/a\n");
  write("proc/self/mountinfo", "30 23 0:26 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n");
  write("sys/fs/my cgroup/a/memory.max", std::to_string(2 * GiB));
  const MemoryBudget b = read();
  ASSERT_TRUE(b.hard());
  EXPECT_EQ(b.bytes, 2 * GiB);
}

TEST_F(FakeRoot, EmptyTreeLimitsNothing) {
  const MemoryBudget b = read();
  EXPECT_FALSE(b.limited());
  EXPECT_FALSE(b.hard());
}

TEST(MemoryBudget, ThisProcessHasOne) {
  // /proc/meminfo exists on every Linux: the budget is at most MemAvailable.
  const MemoryBudget b = read_memory_budget();
  ASSERT_TRUE(b.limited()) << b.describe();
  EXPECT_GT(b.bytes, 0u);
}

TEST(MemoryBudget, FormatMemory) {
  EXPECT_EQ(tessera::format_memory(12 * GiB), "12.0 GiB");
  EXPECT_EQ(tessera::format_memory(GiB + GiB / 2), "1.5 GiB");
  EXPECT_EQ(tessera::format_memory(384 * MiB), "384 MiB");
  EXPECT_EQ(tessera::format_memory(4096), "4 KiB");
}

}  // namespace
