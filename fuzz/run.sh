#!/usr/bin/env bash
# Runs the libFuzzer targets for a while each, seeded from ../shared/fixtures (read at
# run time, never copied into the repository).
#
#   fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET] [TARGET ...]
#
# BUILD_DIR is a build configured with -DTESSERA_FUZZ=ON (see docs/hardening.md);
# TARGET is gguf, tokenizer, chat_template, safetensors or request (default: all five). Inputs that reach
# new code are kept in BUILD_DIR/fuzz-corpus/TARGET between runs; a crash, sanitizer
# report, leak, timeout (10 s) or out-of-memory (2 GiB) stops the target with its input
# saved as BUILD_DIR/fuzz-artifacts/TARGET/crash-* (reproduce: bin/fuzz_TARGET FILE),
# and the script exits non-zero.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: fuzz/run.sh BUILD_DIR [SECONDS] [TARGET ...]}" && pwd)
secs=${2:-60}
shift $(($# >= 2 ? 2 : $#))
targets=("$@")
((${#targets[@]})) || targets=(gguf tokenizer chat_template safetensors request)
fixtures=${TESSERA_FIXTURES_DIR:-$root/../shared/fixtures}
if [ ! -d "$fixtures" ]; then
  echo "fuzz: $fixtures is missing: no seed corpora" >&2
  exit 1
fi

seeds=$build/fuzz-seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{gguf,tokenizer,chat_template,safetensors,request}
# GGUF: the small model fixtures (real tensor tables, tokenizer metadata, every
# architecture) and the smallest vocabulary file.
find "$fixtures/models" -name '*.gguf' -size -1100k -exec ln -s {} "$seeds/gguf/" \;
ln -s "$fixtures/vocab/ggml-vocab-llama-spm.gguf" "$seeds/gguf/"
# And, where a tessera-gen is built ($TESSERA_GEN, else build/bin/), one tiny model per
# architecture (130-430 KB: mutations reach the metadata more often than in 1 MB files).
gen=${TESSERA_GEN:-$root/build/bin/tessera-gen}
if [ -x "$gen" ]; then
  "$gen" -q -o "$seeds/gguf/tiny-llama.gguf" --preset tiny --type q4_0 --layers 1 --embd 64 --heads 2 --ff 64
  "$gen" -q -o "$seeds/gguf/tiny-qwen3moe.gguf" --preset qwen3moe-tiny --type q8_0 --layers 1 --embd 64 --heads 2 \
    --kv-heads 1 --head-dim 32 --experts 4 --experts-used 2 --expert-ff 32
  "$gen" -q -o "$seeds/gguf/tiny-qwen35moe.gguf" --preset qwen35moe-tiny --type q4_k_m --layers 4 --embd 64 \
    --heads 2 --kv-heads 1 --experts 4 --experts-used 2 --expert-ff 32 --shared-ff 32
fi
# Tokenizer: the vocabularies' test texts, once per vocabulary and option byte.
n_vocab=$(find "$fixtures/vocab" -name '*.gguf' | wc -l)
for inp in "$fixtures"/vocab/*.inp; do
  for ((v = 0; v < n_vocab; ++v)); do
    for opt in 0 3; do
      sel=$((v * 4 + opt))
      { printf "\\x$(printf %02x "$sel")"; cat "$inp"; } >"$seeds/tokenizer/$(basename "$inp").$sel"
    done
  done
done
# Chat templates: the real ones.
cp "$fixtures"/chat_templates/templates/*.jinja "$seeds/chat_template/"
# safetensors: the Hugging Face fixture files (real headers; their data is cut at
# max_len below) and a few small complete files that open.
if [ -d "$fixtures/hf/models" ]; then
  find "$fixtures/hf/models" -name '*.safetensors' -exec sh -c 'ln -s "$1" "$2/$(basename "$(dirname "$1")")-$(basename "$1")"' \
    _ {} "$seeds/safetensors" \;
fi
st_seed() {  # st_seed FILE HEADER DATA_BYTES: the 8-byte little-endian header size, the header, zeros
  local n=${#2} i le=""
  for ((i = 0; i < 8; ++i)); do le+=$(printf '\\x%02x' $(((n >> (8 * i)) & 255))); done
  { printf "$le"; printf '%s' "$2"; head -c "$3" /dev/zero; } >"$1"
}
st_seed "$seeds/safetensors/two.safetensors" \
  '{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}    ' 32
st_seed "$seeds/safetensors/dtypes.safetensors" \
  '{"i":{"dtype":"I64","shape":[2],"data_offsets":[4,20]},"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"z":{"dtype":"F16","shape":[0,5],"data_offsets":[8,8]},"u":{"dtype":"U8","shape":[1,1,2],"data_offsets":[20,22]},"f8":{"dtype":"F8_E5M2","shape":[3],"data_offsets":[22,25]}}' 25

# Request bodies: a few valid ones of each endpoint (written here; not fixtures).
printf '%s' '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 42, "stop": ["\n", "The end"]}' \
  >"$seeds/request/completion.json"
printf '%s' '{"prompt": [1, 2, 3], "max_tokens": -1, "logprobs": 3, "logit_bias": {"5": -100}, "stream": true, "stream_options": {"include_usage": true}}' \
  >"$seeds/request/completion-tokens.json"
printf '%s' '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_completion_tokens": 8, "logprobs": true, "top_logprobs": 2, "presence_penalty": 0.5}' \
  >"$seeds/request/chat.json"
printf '%s' '{"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "21"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}], "tool_choice": "auto", "parallel_tool_calls": false}' \
  >"$seeds/request/chat-tools.json"
printf '%s' '{"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "Be brief."}], "messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21"}]}, {"type": "text", "text": "Thanks"}]}], "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}], "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}, "stop_sequences": ["END"], "temperature": 0.5, "top_k": 40, "stream": true}' \
  >"$seeds/request/messages-tools.json"
printf '%s' '{"model": "m", "instructions": "Be brief.", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}, {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}, {"type": "function_call_output", "call_id": "call_1", "output": "21"}], "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}], "tool_choice": "auto", "max_output_tokens": 16, "temperature": 0.5, "store": false, "stream": true}' \
  >"$seeds/request/responses-tools.json"
printf '%s' '{"messages": [{"role": "user", "content": "Who?"}], "response_format": {"type": "json_schema", "json_schema": {"name": "p", "strict": true, "schema": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": -3, "maximum": 120}, "tags": {"type": "array", "items": {"enum": ["a", 1, null]}, "maxItems": 2}, "when": {"type": "string", "format": "date"}, "code": {"type": "string", "pattern": "^[A-Z]{2}\\d+$"}}, "required": ["name"], "additionalProperties": false}}}}' \
  >"$seeds/request/chat-json-schema.json"
printf '%s' '{"prompt": "x", "grammar": "root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"(\" root \")\" | [^\\x00-\\x1f]{1,3}"}' \
  >"$seeds/request/completion-grammar.json"
printf '%s' '{"messages": [{"role": "user", "content": "Weather?"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}], "tool_choice": "required"}' \
  >"$seeds/request/chat-tool-required.json"

declare -A max_len=([gguf]=1200000 [tokenizer]=4096 [chat_template]=65536 [safetensors]=65536 [request]=65536)
status=0
for t in "${targets[@]}"; do
  exe=$build/bin/fuzz_$t
  [ -x "$exe" ] || { echo "fuzz: $exe is not built" >&2; exit 1; }
  corpus=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t/
  mkdir -p "$corpus" "$artifacts"
  echo "== fuzz_$t: ${secs} s"
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       TESSERA_FUZZ_VOCAB_DIR="$fixtures/vocab" \
       "$exe" "$corpus" "$seeds/$t" -max_total_time="$secs" -max_len="${max_len[$t]}" -timeout=10 \
              -rss_limit_mb=2048 -artifact_prefix="$artifacts" -print_final_stats=1 2>"$build/fuzz-$t.log"; then
    echo "fuzz_$t: FAILED (log: $build/fuzz-$t.log, input: $artifacts)" >&2
    tail -n 40 "$build/fuzz-$t.log" >&2
    status=1
  else
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$build/fuzz-$t.log" | tail -n 2 || true
  fi
done
exit $status
