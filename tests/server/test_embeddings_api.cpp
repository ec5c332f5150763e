// The /v1/embeddings request parser and response builder without a model: inputs of
// every accepted form, each refusal with the field it names, base64 bytes, shaping.
#include <gtest/gtest.h>

#include "server/embeddings_api.h"

namespace tessera::server {
namespace {

ModelContext model() {
  ModelContext m;
  m.n_vocab = 100;
  m.n_ctx = 8;
  m.model_id = "m";
  return m;  // no tokenizer: token ids only
}

EmbeddingContext embeddings() {
  EmbeddingContext e;
  e.n_embd = 4;
  e.pooling = Pooling::Last;
  return e;
}

EmbeddingRequest parse(const char* body, const EmbeddingContext& e = embeddings()) {
  return parse_embedding_request(RequestJson::parse(body), model(), e);
}

// The ApiError a body gets: "status param code".
std::string refusal(const char* body, const EmbeddingContext& e = embeddings()) {
  try {
    parse(body, e);
  } catch (const ApiError& err) {
    return std::to_string(err.status) + " " + err.param + " " + err.code;
  }
  return "accepted";
}

TEST(EmbeddingRequests, InputForms) {
  EmbeddingRequest one = parse(R"({"input": [1, 2, 3], "model": "x", "user": "u"})");
  ASSERT_EQ(one.inputs.size(), 1u);
  EXPECT_EQ(one.inputs[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(one.tokens, 3);
  EXPECT_EQ(one.dimensions, 0);
  EXPECT_FALSE(one.base64);
  EXPECT_TRUE(one.normalize);
  EmbeddingRequest two = parse(R"({"input": [[5], [6, 7]], "dimensions": 2, "encoding_format": "base64",
                                   "normalize": false})");
  ASSERT_EQ(two.inputs.size(), 2u);
  EXPECT_EQ(two.inputs[1], (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(two.tokens, 3);
  EXPECT_EQ(two.dimensions, 2);
  EXPECT_TRUE(two.base64);
  EXPECT_FALSE(two.normalize);
  EXPECT_EQ(parse(R"({"input": [1,2,3,4,5,6,7,8]})").tokens, 8);  // exactly the context
}

TEST(EmbeddingRequests, RefusalsNameTheField) {
  EXPECT_EQ(refusal(R"({})"), "400 input missing_required_parameter");
  EXPECT_EQ(refusal(R"({"input": null})"), "400 input missing_required_parameter");
  EXPECT_EQ(refusal(R"({"input": []})"), "400 input invalid_value");
  EXPECT_EQ(refusal(R"({"input": [[]]})"), "400 input invalid_value");
  EXPECT_EQ(refusal(R"({"input": 3})"), "400 input invalid_type");
  EXPECT_EQ(refusal(R"({"input": [1, [2]]})"), "400 input invalid_type");
  EXPECT_EQ(refusal(R"({"input": [[1], 2]})"), "400 input invalid_type");
  EXPECT_EQ(refusal(R"({"input": [true]})"), "400 input invalid_type");
  EXPECT_EQ(refusal(R"({"input": [1, 100]})"), "400 input invalid_value");
  EXPECT_EQ(refusal(R"({"input": [-1]})"), "400 input invalid_value");
  EXPECT_EQ(refusal(R"({"input": [1,2,3,4,5,6,7,8,9]})"), "400 input context_length_exceeded");
  EXPECT_EQ(refusal(R"({"input": "text"})"), "400 input no_tokenizer");  // this model has none
  EXPECT_EQ(refusal(R"({"input": ""})"), "400 input invalid_value");
  EXPECT_EQ(refusal(R"({"input": [1], "dimensions": 0})"), "400 dimensions invalid_value");
  EXPECT_EQ(refusal(R"({"input": [1], "dimensions": 5})"), "400 dimensions invalid_value");
  EXPECT_EQ(refusal(R"({"input": [1], "dimensions": 1.5})"), "400 dimensions invalid_type");
  EXPECT_EQ(refusal(R"({"input": [1], "encoding_format": "int8"})"), "400 encoding_format invalid_value");
  EXPECT_EQ(refusal(R"({"input": [1], "encoding_format": 1})"), "400 encoding_format invalid_value");
  EXPECT_EQ(refusal(R"({"input": [1], "model": 1})"), "400 model invalid_type");
  EXPECT_EQ(refusal(R"({"input": [1], "normalize": "no"})"), "400 normalize invalid_type");
  EXPECT_EQ(refusal(R"([1])"), "400  invalid_type");
  std::string many = R"({"input": [)";
  for (size_t i = 0; i <= kMaxEmbeddingInputs; ++i) many += i ? ",[1]" : "[1]";
  EXPECT_EQ(refusal((many + "]}").c_str()), "400 input invalid_value");
  EmbeddingContext none = embeddings();
  none.pooling.reset();
  none.unavailable = "pooling_type is 2 (cls)";
  EXPECT_EQ(refusal(R"({"input": [1]})", none), "400  unsupported_model");
}

TEST(EmbeddingResponses, Base64IsLittleEndianFloat32) {
  EXPECT_EQ(base64_f32(std::vector<float>{1.0f}), "AACAPw==");
  EXPECT_EQ(base64_f32(std::vector<float>{1.0f, -2.0f}), "AACAPwAAAMA=");
  EXPECT_EQ(base64_f32(std::vector<float>{0.6f, 0.8f, 0.0f}), "mpkZP83MTD8AAAAA");
  EXPECT_EQ(base64_f32(std::vector<float>{}), "");
}

TEST(EmbeddingResponses, ShapeAndShaping) {
  EmbeddingRequest r = parse(R"({"input": [[1], [2, 3]]})");
  std::vector<std::vector<float>> pooled = {{3, 4, 0, 0}, {0, 0, 0, 2}};
  const nlohmann::json j = embedding_response(r, pooled, "m");
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 3);
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][1]["object"], "embedding");
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][0]["embedding"], nlohmann::json({0.6f, 0.8f, 0.0f, 0.0f}));
  EXPECT_EQ(j["data"][1]["embedding"], nlohmann::json({0.0f, 0.0f, 0.0f, 1.0f}));
  // dimensions 3 then base64: the first values normalised again.
  EmbeddingRequest d = parse(R"({"input": [1], "dimensions": 3, "encoding_format": "base64"})");
  std::vector<std::vector<float>> p = {{3, 4, 0, 9}};
  EXPECT_EQ(embedding_response(d, p, "m")["data"][0]["embedding"], "mpkZP83MTD8AAAAA");
  // normalize false: as pooled.
  EmbeddingRequest raw = parse(R"({"input": [1], "normalize": false, "dimensions": 2})");
  std::vector<std::vector<float>> q = {{3, 4, 0, 9}};
  EXPECT_EQ(embedding_response(raw, q, "m")["data"][0]["embedding"], nlohmann::json({3.0f, 4.0f}));
}

}  // namespace
}  // namespace tessera::server
