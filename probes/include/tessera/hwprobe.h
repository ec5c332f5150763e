// Hardware probe: what the CPU has (CPUID) and what the OS lets us use (XCR0 state
// bits via XGETBV; AMX tile data permission via arch_prctl). Compiled without ISA
// flags so it runs on any x86-64 CPU; on other architectures every flag is false.
#pragma once
#include <string>

namespace tessera {

struct CpuFeatures {
  std::string vendor, brand;
  int family = 0, model = 0;  // CPUID leaf 1, extended fields folded in (AMD Zen 4 = 0x19, Zen 5 = 0x1A)
  // CPUID bits
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avx512fp16 = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  // OS support
  bool os_avx = false;     // XCR0 has SSE+AVX state
  bool os_avx512 = false;  // XCR0 has opmask + ZMM state
  bool os_amx = false;     // XCR0 has XTILECFG + XTILEDATA
  bool amx_permitted = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded

  bool avx512_usable() const { return avx512f && avx512bw && avx512vl && os_avx512; }
  bool amx_usable() const { return amx_tile && os_amx && amx_permitted; }
  std::string summary() const;  // one line, e.g. "avx2 fma avx512f ... amx-int8 (permitted)"
};

// Probed once per process (AMX permission is requested on the first call).
const CpuFeatures& cpu_features();

}  // namespace tessera
