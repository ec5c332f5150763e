// libFuzzer target: any text through the tokenizers of the fixture vocabularies
// (../shared/fixtures/vocab/*.gguf, or $TESSERA_FUZZ_VOCAB_DIR): encode with and
// without special-token parsing, every id in range, and every piece decodable. The
// first byte picks the vocabulary and the options; the rest is the text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string_view>
#include <vector>

#include <spdlog/spdlog.h>

#include "gguf_reader.h"
#include "tessera/error.h"
#include "tessera/tokenizer.h"

namespace {
std::vector<std::unique_ptr<tessera::gguf::GgufFile>> g_files;
std::vector<std::unique_ptr<tessera::Tokenizer>> g_tokenizers;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  namespace fs = std::filesystem;
  const char* env = std::getenv("TESSERA_FUZZ_VOCAB_DIR");
  const fs::path dir = env ? fs::path(env) : fs::path(TESSERA_FIXTURES_DIR) / "vocab";
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& p : files) {
    g_files.push_back(tessera::gguf::GgufFile::open(p.string()));
    g_tokenizers.push_back(tessera::Tokenizer::from_metadata(g_files.back()->metadata()));
  }
  if (g_tokenizers.empty()) {
    std::fprintf(stderr, "fuzz_tokenizer: no vocabularies in %s (set TESSERA_FUZZ_VOCAB_DIR)\n", dir.c_str());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  const tessera::Tokenizer& tok = *g_tokenizers[(sel >> 2) % g_tokenizers.size()];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool bos = sel & 1, special = sel & 2;
  std::vector<int32_t> ids = special ? tok.encode_with_special(text, bos) : tok.encode(text, bos);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.n_vocab()) std::abort();  // an id out of range is a finding
    (void)tok.token_to_piece(id, special);
  }
  (void)tok.decode(ids);
  return 0;
}
