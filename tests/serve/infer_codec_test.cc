// Inputs to token rows and logits to outputs (worker/serve/infer_codec.h), and the
// Prometheus text the metrics render, read back line by line.
#include "worker/serve/infer_codec.h"

#include <gtest/gtest.h>

#include "common/metrics.h"
#include "data/wordpiece_tokenizer.h"

namespace trainyard {
namespace {

VersionMeta LangidMeta(int max_tokens) {
  VersionMeta meta;
  meta.model = "langid", meta.version = 1, meta.max_tokens = max_tokens;
  meta.labels = {"de", "en", "it"};
  meta.tokenizer = std::make_shared<WordPieceTokenizer>(TRAINYARD_SOURCE_DIR "/data/prepared/langid/vocab.txt", true);
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
