// Hardware probe: CPUID feature bits plus OS support (XCR0 via XGETBV, AMX tile data
// permission via arch_prctl). This file must be compiled WITHOUT ISA flags (no
// -mavx512f etc.): it runs before anyone knows what the CPU can do.
#include "tessera/hwprobe.h"

#include <cstdint>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace tessera {

namespace {

#if defined(__x86_64__)

struct Regs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.eax, &r.ebx, &r.ecx, &r.edx)) r = Regs{};
  return r;
}

bool bit(unsigned v, int b) { return (v >> b) & 1u; }

// XGETBV(0): only valid when CPUID.1:ECX.OSXSAVE is set (otherwise it faults).
uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0u));
  return (uint64_t(hi) << 32) | lo;
}

// Ask Linux for permission to use AMX tile data (XFEATURE_XTILEDATA = 18), then read
// the permitted mask back to confirm. Needed once per process (Linux >= 5.16).
bool request_amx_permission() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr unsigned long kArchGetXcompPerm = 0x1022;
  constexpr unsigned long kArchReqXcompPerm = 0x1023;
  constexpr unsigned long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
  uint64_t mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
  return (mask >> kXfeatureXtiledata) & 1u;
#else
  return false;
#endif
}

CpuFeatures probe() {
  CpuFeatures f;
  Regs r0 = cpuid(0, 0);
  const unsigned max_leaf = r0.eax;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r0.ebx, 4);
  std::memcpy(vendor + 4, &r0.edx, 4);
  std::memcpy(vendor + 8, &r0.ecx, 4);
  f.vendor = vendor;

  // Brand string (leaves 0x80000002..4), trimmed.
  Regs ext = cpuid(0x80000000u, 0);
  if (ext.eax >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      Regs b = cpuid(0x80000002u + i, 0);
      std::memcpy(brand + 16 * i + 0, &b.eax, 4);
      std::memcpy(brand + 16 * i + 4, &b.ebx, 4);
      std::memcpy(brand + 16 * i + 8, &b.ecx, 4);
      std::memcpy(brand + 16 * i + 12, &b.edx, 4);
    }
    std::string s = brand;
    size_t a = s.find_first_not_of(' ');
    size_t e = s.find_last_not_of(' ');
    f.brand = a == std::string::npos ? std::string() : s.substr(a, e - a + 1);
  }

  bool osxsave = false;
  if (max_leaf >= 1) {
    Regs r1 = cpuid(1, 0);
    const int base_family = int(r1.eax >> 8) & 0xF, base_model = int(r1.eax >> 4) & 0xF;
    f.family = base_family == 0xF ? base_family + (int(r1.eax >> 20) & 0xFF) : base_family;
    f.model = base_family == 0xF || base_family == 0x6 ? base_model | (int(r1.eax >> 16) & 0xF) << 4 : base_model;
    f.fma = bit(r1.ecx, 12);
    osxsave = bit(r1.ecx, 27);
    f.f16c = bit(r1.ecx, 29);
  }
  if (max_leaf >= 7) {
    Regs r7 = cpuid(7, 0);
    const unsigned max_sub = r7.eax;
    f.avx2 = bit(r7.ebx, 5);
    f.avx512f = bit(r7.ebx, 16);
    f.avx512dq = bit(r7.ebx, 17);
    f.avx512bw = bit(r7.ebx, 30);
    f.avx512vl = bit(r7.ebx, 31);
    f.avx512vnni = bit(r7.ecx, 11);
    f.amx_bf16 = bit(r7.edx, 22);
    f.avx512fp16 = bit(r7.edx, 23);
    f.amx_tile = bit(r7.edx, 24);
    f.amx_int8 = bit(r7.edx, 25);
    if (max_sub >= 1) {
      Regs r71 = cpuid(7, 1);
      f.avx512bf16 = bit(r71.eax, 5);
    }
  }

  if (osxsave) {
    const uint64_t xcr0 = xgetbv0();
    auto has = [&](uint64_t mask) { return (xcr0 & mask) == mask; };
    f.os_avx = has((1ull << 1) | (1ull << 2));
    f.os_avx512 = f.os_avx && has((1ull << 5) | (1ull << 6) | (1ull << 7));
    f.os_amx = has((1ull << 17) | (1ull << 18));
  }
  if (f.amx_tile && f.os_amx) f.amx_permitted = request_amx_permission();
  return f;
}

#else  // not x86-64: nothing is available

CpuFeatures probe() {
  CpuFeatures f;
  f.vendor = "non-x86";
  return f;
}

#endif

}  // namespace

std::string CpuFeatures::summary() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avx512fp16, "avx512fp16");
  add(amx_tile, "amx-tile");
  add(amx_int8, "amx-int8");
  add(amx_bf16, "amx-bf16");
  if (s.empty()) s = "baseline x86-64";
  s += "; os:";
  s += os_avx ? " avx" : " no-avx";
  s += os_avx512 ? " avx512" : " no-avx512";
  s += os_amx ? " amx" : " no-amx";
  if (amx_tile) s += amx_permitted ? " (amx permitted)" : " (amx not permitted)";
  s += "; avx512 ";
  s += avx512_usable() ? "usable" : "unusable";
  s += ", amx ";
  s += amx_usable() ? "usable" : "unusable";
  if (!brand.empty()) s += " [" + brand + "]";
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = probe();  // thread-safe one-time init
  return features;
}

}  // namespace tessera
