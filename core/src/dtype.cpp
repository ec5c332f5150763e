// dtype table: GGUF type ids, block geometry and names (see tessera/dtype.h).
#include "tessera/dtype.h"

#include <array>
#include <cctype>
#include <string>

#include "tessera/error.h"

namespace tessera {
namespace {

// Block geometry is GGUF's: bytes per block include the fp16/fp32 scales.
constexpr std::array<DTypeTraits, 19> kTraits = {{
    {DType::F32, "f32", 1, 4, false},
    {DType::F16, "f16", 1, 2, false},
    {DType::Q4_0, "q4_0", 32, 18, true},
    {DType::Q4_1, "q4_1", 32, 20, true},
    {DType::Q5_0, "q5_0", 32, 22, true},
    {DType::Q5_1, "q5_1", 32, 24, true},
    {DType::Q8_0, "q8_0", 32, 34, true},
    {DType::Q8_1, "q8_1", 32, 36, true},
    {DType::Q2_K, "q2_K", 256, 84, true},
    {DType::Q3_K, "q3_K", 256, 110, true},
    {DType::Q4_K, "q4_K", 256, 144, true},
    {DType::Q5_K, "q5_K", 256, 176, true},
    {DType::Q6_K, "q6_K", 256, 210, true},
    {DType::Q8_K, "q8_K", 256, 292, true},
    {DType::IQ4_NL, "iq4_nl", 32, 18, true},
    {DType::IQ4_XS, "iq4_xs", 256, 136, true},
    {DType::I32, "i32", 1, 4, false},
    {DType::BF16, "bf16", 1, 2, false},
    {DType::MXFP4, "mxfp4", 32, 17, true},
}};

// Names of every ggml_type id, as llama.cpp's ggml_type_name spells them. Ids that
// were removed from ggml keep the name of the type they used to be.
constexpr std::array<std::string_view, 43> kGgmlNames = {
    "f32",      "f16",      "q4_0",     "q4_1",       "q4_2",       "q4_3",     "q5_0",
    "q5_1",     "q8_0",     "q8_1",     "q2_K",       "q3_K",       "q4_K",     "q5_K",
    "q6_K",     "q8_K",     "iq2_xxs",  "iq2_xs",     "iq3_xxs",    "iq1_s",    "iq4_nl",
    "iq3_s",    "iq2_s",    "iq4_xs",   "i8",         "i16",        "i32",      "i64",
    "f64",      "iq1_m",    "bf16",     "q4_0_4_4",   "q4_0_4_8",   "q4_0_8_8", "tq1_0",
    "tq2_0",    "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4",  "nvfp4",    "q1_0",
    "q2_0",
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

const DTypeTraits* dtype_traits(uint32_t raw_id) {
  for (const auto& t : kTraits) {
    if (static_cast<uint32_t>(t.type) == raw_id) return &t;
  }
  return nullptr;
}

const DTypeTraits& dtype_traits(DType t) {
  const DTypeTraits* p = dtype_traits(static_cast<uint32_t>(t));
  if (!p) throw Error("unsupported tensor type " + std::string(ggml_type_name(static_cast<uint32_t>(t))));
  return *p;
}

std::string_view dtype_name(DType t) { return dtype_traits(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& t : kTraits) {
    if (iequals(t.name, name)) return t.type;
  }
  return std::nullopt;
}

std::string_view ggml_type_name(uint32_t raw_id) {
  if (raw_id < kGgmlNames.size()) return kGgmlNames[raw_id];
  // Out-of-range ids still get a stable, printable name.
  static thread_local std::string buf;
  buf = "type " + std::to_string(raw_id);
  return buf;
}

size_t row_bytes(DType t, int64_t n) {
  const DTypeTraits& tr = dtype_traits(t);
  if (n < 0 || n % tr.block_elems != 0) {
    throw Error("row of " + std::to_string(n) + " elements is not a multiple of the " +
                std::string(tr.name) + " block size " + std::to_string(tr.block_elems));
  }
  return static_cast<size_t>(n / tr.block_elems) * tr.block_bytes;
}

}  // namespace tessera
