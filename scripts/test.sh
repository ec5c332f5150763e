#!/usr/bin/env bash
# Set up, build and run every test: the GGUF, CLI, hardening, fixture and server tests
# under AddressSanitizer + UndefinedBehaviorSanitizer, a short run of each fuzz target,
# then the whole suite (ctest, in parallel). Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# The main CI build treats warnings as errors (GCC 12, -Wall -Wextra clean); a user's
# own `bash scripts/setup.sh` does not (TESSERA_WERROR defaults to OFF). The sanitizer
# and clang fuzz builds report warnings without failing until a full build of each
# has been seen clean (decision 94).
CMAKE_ARGS="${CMAKE_ARGS:-} -DTESSERA_WERROR=ON" bash scripts/setup.sh

if [ ! -d ../shared/fixtures ]; then
  echo "test: note: ../shared/fixtures is missing; fixture tests will be reported as skipped" >&2
fi

# Sanitizer build (clang; ASan + UBSan, -fno-sanitize-recover: any undefined behaviour
# fails the test), which also carries libFuzzer's coverage so the fuzz targets build in
# it: one sanitized build instead of two (docs/hardening.md has the compile times).
# In it: the GGUF parser, the CLI and hardening tests (hostile files and flags), the
# fixture models on cpu_scalar, and the server with the CPU backends for its client
# tests (16 concurrent streaming clients among them), then each fuzz target briefly.
# Debug (assertions on) at -O1, the level ASan's authors recommend, with line tables
# only (-g1): stack traces keep their files and lines.
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DTESSERA_SANITIZE=ON -DTESSERA_FUZZ=ON -DTESSERA_BUILD_BENCH=OFF \
  -DTESSERA_NODE_MODULES_DIR="$PWD/build/node/node_modules" >/dev/null
cmake --build build-asan --target test_gguf test_cli test_hardening test_fixture_logits test_speculative test_server_units tessera \
  tessera-gen default_model backend_cpu_scalar backend_cpu_avx512 loader_gguf test_good test_grammar test_generator_grammar \
  fuzz_gguf fuzz_tokenizer fuzz_chat_template fuzz_safetensors fuzz_request -j"$(nproc)"
echo "== GGUF, CLI, hardening, fixture (cpu_scalar) and server tests under ASan+UBSan"
# The client tests of structured output, Anthropic's and the Responses API and
# embeddings (the slowest under the sanitizers, docs/hardening.md) run in the full
# suite only: their parsers, the grammar engine and the Generator under grammars run
# under the sanitizers below through their unit tests.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -L 'gguf|server|cli|hardening' \
  -E '^server\.test_(structured_output|anthropic_client|responses_client|embeddings_client)$' \
  -j"$(nproc)" --output-on-failure --timeout 600
# The fixtures' prompt logits (batched prefill) and greedy decode (one token per step)
# run under the sanitizers for every weight format (the llama files) and one file of
# every other architecture; the rest, and their comparison with each other
# (BatchedPrefillMatchesTokenByToken), run in the full suite only. Speculative
# decoding's rollback (KV truncation, recurrent state restored from a fork) runs under
# them with drafts right and wrong on plain, sliding-window-with-sinks and recurrent
# models. So do the grammar engine (parser, schema converter, automaton and masks) and
# the Generator under grammars. docs/hardening.md lists what runs where.
asan_fixtures='llama_[a-z0-9_]+|qwen2_q4_k_m|qwen3_q8_0|llama3_f16|qwen3moe_mxfp4_moe|qwen35moe_q4_0|glm4moe_q4_k_m|gemma3_q8_0|gpt_oss_mxfp4_moe|deepseek2_q4_k_m'
asan_units='AnswerStream|LogprobsJson|Requests|ToolCalls|ToolCallsJson|Exchange|Harmony|AnthropicRequests|AnthropicResponses|ResponsesRequests|ResponsesResponses|Gbnf|GrammarMatcher|JsonSchemaGrammar|GeneratorGrammar'
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan \
  -R "FixtureLogits\\.(PromptLogitsFromCli|GreedyDecode).*/($asan_fixtures)_cpu_scalar|RightAndWrong.*/(llama_q8_0|qwen35moe_q8_0|gpt_oss_f32)|^($asan_units)\\." \
  -j"$(nproc)" --output-on-failure --timeout 600

# Fuzzing (libFuzzer): each target briefly, seeded from ../shared/fixtures (fuzz/run.sh;
# the long run is in docs/hardening.md). TESSERA_FUZZ_SECONDS=0 skips.
fuzz_secs=${TESSERA_FUZZ_SECONDS:-30}
if ((fuzz_secs > 0)) && [ -d ../shared/fixtures ]; then
  echo "== fuzz targets, ${fuzz_secs} s each"
  fuzz/run.sh build-asan "$fuzz_secs"
fi

echo "== full suite"
# Let the vulkan backend use a CPU Vulkan device (Mesa's lavapipe) so its conformance
# and fixture tests run on machines without a GPU.
export TESSERA_VULKAN_ALLOW_CPU=1
ctest --test-dir build -j"$(nproc)" --output-on-failure --timeout 900
