// Hardware probe: internal consistency only (the tests must pass on any CPU).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "tessera/hwprobe.h"

using tessera::cpu_features;
using tessera::CpuFeatures;

TEST(HwProbe, FlagsAreConsistent) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_usable()) {
    EXPECT_TRUE(f.avx512f);
    EXPECT_TRUE(f.avx512bw);
    EXPECT_TRUE(f.avx512vl);
    EXPECT_TRUE(f.os_avx512);
  }
  if (f.os_avx512) {
    EXPECT_TRUE(f.os_avx);
  }
  if (f.amx_usable()) {
    EXPECT_TRUE(f.amx_tile);
    EXPECT_TRUE(f.os_amx);
    EXPECT_TRUE(f.amx_permitted);
  }
  // Permission is only requested when the CPU and the OS support AMX.
  if (f.amx_permitted) {
    EXPECT_TRUE(f.amx_tile);
    EXPECT_TRUE(f.os_amx);
  }
  // Sub-features of AVX-512 imply the foundation on every real CPU.
  if (f.avx512bw || f.avx512vl || f.avx512dq || f.avx512vnni || f.avx512bf16 || f.avx512fp16) {
    EXPECT_TRUE(f.avx512f);
  }
  if (f.amx_int8 || f.amx_bf16) {
    EXPECT_TRUE(f.amx_tile);
  }
#if defined(__x86_64__)
  EXPECT_FALSE(f.vendor.empty());
#else
  EXPECT_FALSE(f.avx2);
  EXPECT_FALSE(f.avx512_usable());
  EXPECT_FALSE(f.amx_usable());
#endif
}

TEST(HwProbe, SummaryIsOneLine) {
  const CpuFeatures& f = cpu_features();
  std::string s = f.summary();
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(s.find('\n'), std::string::npos);
  if (f.avx2) {
    EXPECT_NE(s.find("avx2"), std::string::npos) << s;
  }
  if (f.avx512f) {
    EXPECT_NE(s.find("avx512f"), std::string::npos) << s;
  }
  EXPECT_NE(s.find(f.avx512_usable() ? "avx512 usable" : "avx512 unusable"), std::string::npos) << s;
  EXPECT_NE(s.find(f.amx_usable() ? "amx usable" : "amx unusable"), std::string::npos) << s;
  // A default-constructed value (nothing supported) still gives a line.
  EXPECT_NE(CpuFeatures{}.summary().find("baseline"), std::string::npos);
}

TEST(HwProbe, ProbedOncePerProcess) {
  std::vector<const CpuFeatures*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) threads.emplace_back([&, i] { seen[i] = &cpu_features(); });
  for (auto& t : threads) t.join();
  for (const auto* p : seen) EXPECT_EQ(p, &cpu_features());
}
