// Inputs to token rows and logits to outputs (worker/serve/infer_codec.h), and the
// Prometheus text the metrics render, read back line by line.
#include "worker/serve/infer_codec.h"

#include <gtest/gtest.h>

#include "common/metrics.h"
#include "data/wordpiece_tokenizer.h"
#include "worker/serve/kserve_json.h"

namespace trainyard {
namespace {

VersionMeta LangidMeta(int max_tokens) {
  VersionMeta meta;
  meta.model = "langid", meta.version = 1, meta.max_tokens = max_tokens;
  meta.labels = {"de", "en", "it"};
  meta.tokenizer = std::make_shared<WordPieceTokenizer>(TRAINYARD_SOURCE_DIR "/data/prepared/langid/vocab.txt", true);
  meta.vocab_size = meta.tokenizer->vocab_size();
  return meta;
}

TensorIn Text(std::vector<std::string> texts, std::vector<int64_t> shape = {}) {
  TensorIn t;
  t.name = "TEXT", t.datatype = "BYTES";
  t.shape = shape.empty() ? std::vector<int64_t>{int64_t(texts.size())} : shape;
  t.bytes = std::move(texts);
  return t;
}

TEST(InferCodec, TextIsTokenizedWithTheTemplateAndCutWhenAllowed) {
  const VersionMeta meta = LangidMeta(8);
  auto rows = TokenRows({Text({"hello world", "one two three four five six seven eight nine"})}, meta, true, 8);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], meta.tokenizer->Encode("hello world", 8));
  EXPECT_EQ(rows[1].size(), 8u);
  EXPECT_THROW(TokenRows({Text({"one two three four five six seven eight nine"})}, meta, false, 8), InferInputError);
}

TEST(InferCodec, IdsKeepTheMaskedTokens) {
  const VersionMeta meta = LangidMeta(16);
  TensorIn ids{"input_ids", "INT64", {2, 3}, {}, {5, 6, 7, 8, 9, 0}};
  TensorIn mask{"attention_mask", "INT64", {2, 3}, {}, {1, 1, 1, 1, 1, 0}};
  auto rows = TokenRows({ids, mask}, meta, true, 8);
  EXPECT_EQ(rows, (std::vector<std::vector<int32_t>>{{5, 6, 7}, {8, 9}}));
}

TEST(InferCodec, BadInputsNameWhatIsWrong) {
  const VersionMeta meta = LangidMeta(16);
  auto message_of = [&](const std::vector<TensorIn>& inputs) {
    try {
      TokenRows(inputs, meta, true, 4);
    } catch (const InferInputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message_of({Text({"a", "b"}, {3})}).find("TEXT"), std::string::npos);
  EXPECT_NE(message_of({Text({"a", "b", "c", "d", "e"})}).find("max_batch_size"), std::string::npos);
  EXPECT_NE(message_of({TensorIn{"input_ids", "INT64", {1, 2}, {}, {1, 1 << 30}}}).find("vocabulary"),
            std::string::npos);
  EXPECT_NE(message_of({TensorIn{"input_ids", "FP32", {1, 1}, {}, {1}}}).find("INT64"), std::string::npos);
  EXPECT_NE(message_of({TensorIn{"pixels", "BYTES", {1}, {"x"}, {}}}).find("pixels"), std::string::npos);
  EXPECT_NE(message_of({}).find("TEXT"), std::string::npos);
  EXPECT_THROW(ElementCount({-1, 2}, "x"), InferInputError);
  EXPECT_THROW(ElementCount({1 << 20, 1 << 20}, "x"), InferInputError);
}

TEST(InferCodec, IdsAreCheckedAgainstTheModelsVocabularyBeforeBatching) {
  VersionMeta meta = LangidMeta(16);
  meta.vocab_size = 10;  // a model whose embedding table is smaller than its tokenizer
  EXPECT_EQ(TokenRows({TensorIn{"input_ids", "INT64", {1, 2}, {}, {3, 9}}}, meta, true, 4),
            (std::vector<std::vector<int32_t>>{{3, 9}}));
  try {
    TokenRows({TensorIn{"input_ids", "INT64", {1, 2}, {}, {3, 10}}}, meta, true, 4);
    ADD_FAILURE() << "an id past the model's vocabulary was accepted";
  } catch (const InferInputError& e) {
    EXPECT_NE(std::string(e.what()).find("outside the model's vocabulary of 10"), std::string::npos) << e.what();
  }
}

// `data` nested 1,000,000 deep (2 MB) once overflowed the front end's stack in a recursive
// flatten: now the parse stops at its depth limit, and nesting within it flattens in
// row-major order.
TEST(KserveJson, DeepNestingIsRefusedAndShallowNestingFlattens) {
  const std::string head = R"({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 2], "data": )";
  try {
    DecodeJsonInfer(head + std::string(1000000, '[') + std::string(1000000, ']') + "}]}", "");
    ADD_FAILURE() << "a body nested 1,000,000 deep was decoded";
  } catch (const InferInputError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than 64 levels"), std::string::npos) << e.what();
  }
  const InferCall call = DecodeJsonInfer(head + "[[[1], [2]], [[3, [4]]]]}]}", "");
  ASSERT_EQ(call.inputs.size(), 1u);
  EXPECT_EQ(call.inputs[0].ints, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_THROW(DecodeJsonInfer(head + "[[1, 2], [3]]}]}", ""), InferInputError);  // 3 elements for 4
}

TEST(InferCodec, OutputsAreLogitsAndTheArgMaxLabel) {
  const VersionMeta meta = LangidMeta(16);
  InferCall call;
  auto outputs = MakeOutputs(call, meta, {0.1f, 0.9f, 0.0f, 2.0f, -1.0f, 3.0f});
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(outputs[1].bytes, (std::vector<std::string>{"en", "it"}));
  call.outputs = {{"probabilities", false}};
  EXPECT_THROW(MakeOutputs(call, meta, {}), InferInputError);
}

TEST(Metrics, RendersCumulativeHistogramsAndEscapedLabels) {
  Metrics m;
  m.DeclareCounter("requests_total", "Requests.");
  m.DeclareHistogram("latency_seconds", "Latency.", {0.1, 1});
  m.Add("requests_total", {{"model", "a\"b"}}, 2);
  for (double v : {0.05, 0.1, 0.5, 5.0}) m.Observe("latency_seconds", {{"model", "x"}}, v);
  const std::string text = m.Render();
  EXPECT_NE(text.find("requests_total{model=\"a\\\"b\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("latency_seconds_bucket{model=\"x\",le=\"0.1\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("latency_seconds_bucket{model=\"x\",le=\"+Inf\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("latency_seconds_count{model=\"x\"} 4\n"), std::string::npos) << text;
  EXPECT_THROW(m.Add("undeclared", {}), std::logic_error);
}

}  // namespace
}  // namespace trainyard
