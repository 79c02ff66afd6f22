// Inputs to token rows and logits to outputs (worker/serve/infer_codec.h), and the
// Prometheus text the metrics render, read back line by line.
#include "worker/serve/infer_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/metrics.h"
#include "data/wordpiece_tokenizer.h"
#include "tests/common/source_path.h"
#include "worker/serve/infer_request.h"
#include "worker/serve/kserve_json.h"

namespace trainyard {
namespace {

VersionMeta LangidMeta(int max_tokens) {
  VersionMeta meta;
  meta.model = "langid";
  meta.version = 1;
  meta.max_tokens = max_tokens;
  meta.labels = {"de", "en", "it"};
  meta.tokenizer = std::make_shared<WordPieceTokenizer>(SourcePath("scripts/vocab/langid.txt"), true);
  meta.vocab_size = meta.tokenizer->vocab_size();
  return meta;
}

TensorIn Text(std::vector<std::string> texts, const std::vector<int64_t>& shape = {}) {
  TensorIn t;
  t.name = "TEXT";
  t.datatype = "BYTES";
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

// A long text is counted and cut from its first words only, with the same ids as the
// whole text cut to the positions; a 12 MB text is not tokenized whole.
TEST(InferCodec, LongTextsAreCutFromTheirFirstWordsWithTheWholeTextsIds) {
  const VersionMeta meta = LangidMeta(16);
  std::string text;
  for (int i = 0; i < 300; ++i) text += (i % 7 ? "Hello,  world " : "\n\tdonnerstag! ") + std::to_string(i) + " ";
  EXPECT_EQ(TokenRows({Text({text})}, meta, true, 8)[0], meta.tokenizer->Encode(text, 16));
  std::string huge;
  for (int i = 0; i < 2'000'000; ++i) huge += "hello ";
  EXPECT_EQ(TokenRows({Text({huge})}, meta, true, 8)[0], meta.tokenizer->Encode(huge.substr(0, 600), 16));
  try {
    TokenRows({Text({huge})}, meta, false, 8);
    ADD_FAILURE() << "a text past the positions was accepted with truncate off";
  } catch (const InferInputError& e) {
    EXPECT_NE(std::string(e.what()).find("more tokens than the model's 16 positions"), std::string::npos) << e.what();
  }
  EXPECT_EQ(TokenRows({Text({"short text"})}, meta, false, 8)[0], meta.tokenizer->Encode("short text", 16));
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

// A request wrong in two ways at once is still an input error: an input whose name is not
// a string, with a binary_data_size that is not a count, names the size.
TEST(KserveJson, ABadBinarySizeBesideANameThatIsNotAStringIsAnInputError) {
  try {
    DecodeJsonInfer(R"({"inputs": [{"name": 1, "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": -1}}]})",
                    "");
    ADD_FAILURE() << "a negative binary_data_size was decoded";
  } catch (const InferInputError& e) {
    EXPECT_NE(std::string(e.what()).find("input '?': parameters.binary_data_size"), std::string::npos) << e.what();
  }
}

// An answer quoting bytes that are not UTF-8 serialises with U+FFFD in their place.
TEST(KserveJson, AnAnswerQuotingBytesThatAreNotUtf8Serialises) {
  InferCall call;
  const std::string not_utf8 = "\xff\xfe", replacement = "\xEF\xBF\xBD";
  call.id = "a" + not_utf8 + "b";
  VersionMeta meta;
  meta.model = "m";
  meta.version = 1;
  const JsonAnswer answer = EncodeJsonAnswer(call, meta, {});
  const std::string quoted = "\"id\":\"a" + replacement + replacement + "b\"";
  EXPECT_NE(answer.body.find(quoted), std::string::npos) << answer.body;
}

// A timeout of 1e30 us once overflowed into a deadline in the past: now it is an hour.
TEST(InferRequest, DeadlinesAreTheClientsTimeoutAtMostAnHour) {
  const auto now = ServeClock::now();
  const auto hours = [&](ServeClock::time_point t) { return std::chrono::duration<double>(t - now).count() / 3600; };
  EXPECT_NEAR(hours(DeadlineAfter(1e27, 1000)), 1.0, 0.01);
  EXPECT_NEAR(hours(DeadlineAfter(std::numeric_limits<double>::infinity(), 1000)), 1000.0 / 3.6e6, 0.01);
  EXPECT_NEAR(hours(DeadlineAfter(std::nan(""), 1000)), 1000.0 / 3.6e6, 0.01);
  EXPECT_NEAR(hours(DeadlineAfter(-1, 7.2e6)), 1.0, 0.01);
  EXPECT_NEAR(std::chrono::duration<double>(DeadlineAfter(250, 1000) - now).count(), 0.25, 0.05);
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
