// libFuzzer target: any byte string as a GGUF file. The reader must reject it with a
// tessera::Error or present it; a presented file then goes through what `tessera info`
// and `run` do before computing: the architecture's hyperparameter and tensor checks
// (Model::load), the tokenizer built from its metadata (and one encode), the NaN/Inf
// scan of --check-tensors, and the escaping of its strings for display. Anything else
// (a crash, a sanitizer report, an exception of another type, a leak) is a finding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <spdlog/spdlog.h>

#include "gguf_reader.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/model_file.h"
#include "tessera/tensor_scan.h"
#include "tessera/tokenizer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // unused-tensor warnings on every input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<tessera::gguf::GgufFile> f;
  try {
    f = tessera::gguf::GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
  } catch (const tessera::Error&) {
    return 0;
  }
  for (const auto& [k, v] : f->metadata().all()) {
    (void)tessera::printable(k, 80);
    if (const std::string* s = v.as_string()) (void)tessera::printable(*s, 80);
  }
  try {
    auto model = tessera::Model::load(*f);
    (void)model->kv_config(64, 16);
  } catch (const tessera::Error&) {
  }
  try {
    auto tok = tessera::Tokenizer::from_metadata(f->metadata());
    for (int32_t id : tok->encode("Hello world, <|im_start|> 123 ünïcödé", true)) (void)tok->token_to_piece(id, true);
  } catch (const tessera::Error&) {
  }
  try {
    (void)tessera::find_non_finite_tensors(*f);
  } catch (const tessera::Error&) {
  }
  return 0;
}
