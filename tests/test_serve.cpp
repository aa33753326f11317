// The OpenAI-compatible server: request validation, tool-call parsing, and the server end to end
// over loopback (httplib client, curl, and the official `openai` npm package) on a small model that
// has memorised two conversations, one of which answers with a tool call.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "hyla/data/chat_template.h"
#include "hyla/data/image_file.h"
#include "hyla/data/utf8.h"
#include "hyla/io/base64.h"
#include "hyla/io/file.h"
#include "hyla/quant/quantize_model.h"
#include "hyla/agent/guardrails.h"
#include "hyla/serve/api_error.h"
#include "hyla/serve/api_request.h"
#include "hyla/serve/server.h"
#include "hyla/data/reply_stream.h"
#include "hyla/train/optimizer.h"
#include "model_test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using json = nlohmann::json;

// The two conversations the test model memorises.
struct Scenario {
  json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Current weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  json weather_messages = json::parse(R"([{"role": "user", "content": "What is the weather in Paris?"}])");
  json hello_messages = json::parse(R"([{"role": "user", "content": "Say hello"}])");
  std::string hello_reply = "Hello there, friend!";
  std::string call = R"({"name": "get_weather", "arguments": {"city": "Paris"}})";
  // Two 14x14 grey images (2x2 patches of the nano model's 7x7) asked about in the same words:
  // only the image tells which reply the model memorised.
  std::vector<std::string> image_replies = {"A bright cross.", "Dark stripes."};
  static Image picture(int which) {
    Image img{14, 14, 1, std::vector<uint8_t>(14 * 14, which == 0 ? 20 : 0)};
    for (int y = 0; y < 14; ++y)
      for (int x = 0; x < 14; ++x)
        if (which == 0 ? (x == 6 || x == 7 || y == 6 || y == 7) : (y % 4 < 2)) img.pixels[size_t(y * 14 + x)] = which == 0 ? 250 : 90;
    return img;
  }
  static std::string data_url(const Image& img) { return "data:image/png;base64," + base64_encode(encode_png(img)); }
  json image_messages(int which) const {
    return json::array({{{"role", "user"},
                         {"content", json::array({{{"type", "text"}, {"text", "What is in the picture?"}},
                                                  {{"type", "image_url"}, {"image_url", {{"url", data_url(picture(which))}}}}})}}});
  }
  json to_json() const {
    const int32_t biased = test::small_tokenizer().encode(" the")[0];
    return {{"tools", tools},
            {"weather_messages", weather_messages},
            {"hello_messages", hello_messages},
            {"hello_reply", hello_reply},
            {"biased_token", biased},
            {"biased_text", std::string(test::small_tokenizer().decode_token(biased))},
            {"image_cases", json::array({{{"messages", image_messages(0)}, {"reply", image_replies[0]}},
                                         {{"messages", image_messages(1)}, {"reply", image_replies[1]}}})}};
  }
};

// The memorised model's configuration: nano with images (7x7 grey patches, at most 8x8 of them).
ModelConfig memorised_config() {
  return test::nano_config([](json& j) {
    j["vocab_size"] = 512;
    j["vision"]["enabled"] = true;
  });
}

ServeLimits test_limits() {
  ServeLimits limits;
  limits.context = 1024;
  limits.vision = memorised_config().vision;
  return limits;
}

// Trains the nano model until it reproduces both replies; the directory is shared by the tests of
// this run (written atomically, deterministic contents).
std::filesystem::path memorised_model_dir() {
  const auto dir = std::filesystem::temp_directory_path() / ("hyla-test-memorised-v2-" + std::to_string(getuid()));
  // Test processes run in parallel: one trains while the others wait.
  const int lock = open((dir.string() + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  flock(lock, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() { close(fd); }
  } unlock{lock};
  if (std::filesystem::exists(dir / "tokenizer.json")) return dir;
  const Tokenizer& tokenizer = test::small_tokenizer();
  const Scenario s;
  const ServeLimits limits = test_limits();
  const auto prompt = [&](const json& messages, bool tools) {
    json body = {{"messages", messages}};
    if (tools) body["tools"] = s.tools;
    return parse_chat_request(body, tokenizer, "m", limits).prompts[0];
  };
  std::vector<int32_t> weather_reply = {tokenizer.special_id("<tool_call>")};
  tokenizer.encode_append("\n" + s.call + "\n", false, weather_reply);
  weather_reply.push_back(tokenizer.special_id("</tool_call>"));
  weather_reply.push_back(tokenizer.special_id("<|im_end|>"));
  std::vector<int32_t> hello_reply = tokenizer.encode(s.hello_reply);
  hello_reply.push_back(tokenizer.special_id("<|im_end|>"));

  ModelInput in;
  std::vector<int64_t> lengths;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> examples = {
      {prompt(s.weather_messages, true), weather_reply}, {prompt(s.hello_messages, false), hello_reply}};
  for (int which : {0, 1}) {
    const ApiRequest r = parse_chat_request({{"messages", s.image_messages(which)}}, tokenizer, "m", limits);
    std::vector<int32_t> reply = tokenizer.encode(s.image_replies[size_t(which)]);
    reply.push_back(tokenizer.special_id("<|im_end|>"));
    examples.push_back({r.prompts[0], reply});
    in.images.push_back(r.generation.images.at(0));
  }
  in.image_pad_id = tokenizer.special_id("<|image_pad|>");
  for (const auto& [p, reply] : examples) {
    std::vector<int32_t> seq = p;
    seq.insert(seq.end(), reply.begin(), reply.end());
    for (size_t i = 0; i < seq.size(); ++i) {
      in.ids.push_back(seq[i]);
      // Only the reply is learnt: each position before a reply token predicts it.
      in.targets.push_back(i + 1 < seq.size() && i + 1 >= p.size() ? seq[i + 1] : -1);
    }
    lengths.push_back(int64_t(seq.size()));
  }
  in.tokens = TokenBatch::packed(lengths);
  Model model(memorised_config());
  model.initialize(11);
  AdamW optimizer(model.params(), OptimizerConfig{.weight_decay = 0});
  double loss = 1e9;
  for (int step = 0; step < 600 && loss > 2e-3; ++step) {
    model.params().zero_grads();
    loss = model.forward(in, {.precision = Precision::F32, .outputs = Outputs::None, .backward = true}).loss.loss;
    optimizer.step(3e-3, 1.0f);
  }
  EXPECT_LT(loss, 2e-3) << "the test model did not memorise its conversations";
  test::TempDir staging;
  test::small_tokenizer().save(staging / "tokenizer.json");
  model.save(dir, DType::F32, staging / "tokenizer.json");
  return dir;
}

// A server on a free loopback port, serving the memorised model.
struct TestServer {
  ServeOptions options;
  std::unique_ptr<Server> server;
  std::thread thread;
  int port = 0;
  explicit TestServer(const std::function<void(ServeOptions&)>& edit = {}, bool load = true) {
    options.model_dir = memorised_model_dir();
    options.model_name = "hyla-test";
    options.port = 0;
    options.engine.max_sequences = 4;
    options.engine.context = 1024;
    options.engine.prefill_chunk = 64;
    options.limits.max_body_bytes = 64 << 10;
    options.limits.max_tokens = 256;
    if (edit) edit(options);
    server = std::make_unique<Server>(options);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    if (load) server->load();
  }
  ~TestServer() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    return c;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

json post(const TestServer& s, const std::string& path, const json& body, int expect_status = 200) {
  auto c = s.client();
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << path << ": " << httplib::to_string(res.error());
  if (!res) return {};
  EXPECT_EQ(res->status, expect_status) << body.dump() << " -> " << res->body;
  return json::parse(res->body);
}

// The data events of a server-sent event stream; the last must be [DONE].
std::vector<json> sse_events(const std::string& text) {
  std::vector<json> events;
  size_t at = 0;
  bool done = false;
  while (at < text.size()) {
    size_t end = text.find("\n\n", at);
    if (end == std::string::npos) end = text.size();
    const std::string event = text.substr(at, end - at);
    at = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    EXPECT_FALSE(done) << "data after [DONE]";
    if (event == "data: [DONE]") done = true;
    else events.push_back(json::parse(event.substr(6)));
  }
  EXPECT_TRUE(done) << "the stream did not end with data: [DONE]";
  return events;
}

std::string post_stream(const TestServer& s, const std::string& path, const json& body) {
  auto c = s.client();
  std::string text;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    text.append(data, n);
    return true;
  };
  auto res = c.send(req);
  EXPECT_TRUE(res);
  if (res) {
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// Request parsing and the chat format with tools.

// A MoonViT model (SPEC §7.2) takes any size the decoder accepts: its processor resizes, so a 1×1
// image is one merged window and a long strip fits; what cannot be decoded is still a 400.
TEST(ServeRequest, MoonVitImagesAreResizedAndBadOnesAreClearErrors) {
  const Tokenizer& tok = test::small_tokenizer();
  ServeLimits limits = test_limits();
  limits.vision.tower = VisionTower::MoonVit, limits.vision.patch_size = 14, limits.vision.channels = 3;
  auto pads = [&](const Image& img) {
    const json part = {{"type", "image_url"}, {"image_url", {{"url", Scenario::data_url(img)}}}};
    const ApiRequest r =
        parse_chat_request({{"messages", {{{"role", "user"}, {"content", json::array({part})}}}}}, tok, "m", limits);
    EXPECT_EQ(r.generation.images.size(), 1u);
    const std::vector<int32_t>& p = r.prompts[0];
    return std::count(p.begin(), p.end(), tok.special_id("<|image_pad|>"));
  };
  EXPECT_EQ(pads(Image{1, 1, 1, {200}}), 1);                                  // padded to one 28×28 window
  EXPECT_EQ(pads(Image{7, 70, 1, std::vector<uint8_t>(490, 9)}), 3);           // 70 wide: 3 windows
  EXPECT_EQ(pads(Image{60, 100, 3, std::vector<uint8_t>(18000, 50)}), 3 * 4);  // 84 × 112 after padding
  auto error = [&](const std::string& url) {
    const json part = {{"type", "image_url"}, {"image_url", {{"url", url}}}};
    try {
      parse_chat_request({{"messages", {{{"role", "user"}, {"content", json::array({part})}}}}}, tok, "m", limits);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted " << url.substr(0, 100);
    return std::string();
  };
  const std::string png = encode_png(Scenario::picture(1));
  EXPECT_NE(error("data:image/png;base64," + base64_encode(png.substr(0, png.size() / 2))).find("PNG"),
            std::string::npos);
  EXPECT_NE(error("data:image/png;base64," + base64_encode(std::string("GIF89a") + std::string(20, '\0'))).find(
                "not a PNG or JPEG"),
            std::string::npos);
  EXPECT_NE(error("data:image/png;base64,***").find("not a base64 character"), std::string::npos);
  limits.max_image_pixels = 100;  // as a 20,000 × 20,000 header meets the default limit
  EXPECT_NE(error(Scenario::data_url(Image{20, 20, 1, std::vector<uint8_t>(400, 1)})).find("100"), std::string::npos);
}

// Image parts: a data URL becomes the model image at its place in the prompt; anything else is a
// 400 naming the part and what is accepted, before the engine ever sees the request.
TEST(ServeRequest, ImagePartsBecomeModelImagesOrClearErrors) {
  const Tokenizer& tok = test::small_tokenizer();
  const Scenario sc;
  const ApiRequest r = parse_chat_request({{"messages", sc.image_messages(0)}}, tok, "m", test_limits());
  ASSERT_EQ(r.generation.images.size(), 1u);
  EXPECT_EQ(r.generation.images[0].pixels, Scenario::picture(0).pixels);
  const std::vector<int32_t>& p = r.prompts[0];
  const auto start = std::find(p.begin(), p.end(), tok.special_id("<|image_start|>"));
  ASSERT_NE(start, p.end());
  EXPECT_EQ(std::count(p.begin(), p.end(), tok.special_id("<|image_pad|>")), 4);  // 2x2 patches of 7x7
  EXPECT_EQ(*(start + 5), tok.special_id("<|image_end|>"));
  // The text part comes first, as it was sent.
  const std::string before = tok.decode(std::vector<int32_t>(p.begin(), start));
  EXPECT_NE(before.find("What is in the picture?"), std::string::npos) << before;

  auto error = [&](const json& part, const ServeLimits& limits) {
    json body = {{"messages", {{{"role", "user"}, {"content", json::array({part})}}}}};
    try {
      parse_chat_request(body, tok, "m", limits);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted " << part.dump().substr(0, 200);
    return std::string();
  };
  auto image = [](const std::string& url) { return json{{"type", "image_url"}, {"image_url", {{"url", url}}}}; };
  const ServeLimits limits = test_limits();
  EXPECT_NE(error(image("https://example.com/cat.png"), limits).find("only data URLs are accepted"), std::string::npos);
  EXPECT_NE(error(image("data:image/gif;base64,R0lGOD"), limits).find("data:image/png;base64"), std::string::npos);
  EXPECT_NE(error(image("data:image/png;base64,***"), limits).find("not a base64 character"), std::string::npos);
  EXPECT_NE(error(image("data:image/png;base64," + base64_encode("plain text, not an image")), limits).find("not a PNG or JPEG"),
            std::string::npos);
  EXPECT_NE(error(image(Scenario::data_url(Image{7, 70, 1, std::vector<uint8_t>(490, 9)})), limits).find("vision.max_grid"),
            std::string::npos);
  ServeLimits small = limits;
  small.max_image_bytes = 64;
  EXPECT_NE(error(image(Scenario::data_url(Scenario::picture(1))), small).find("64"), std::string::npos);
  small = limits;
  small.max_image_pixels = 100;
  EXPECT_NE(error(image(Scenario::data_url(Scenario::picture(1))), small).find("100"), std::string::npos);
  ServeLimits text_only = limits;
  text_only.vision.enabled = false;
  EXPECT_NE(error(image(Scenario::data_url(Scenario::picture(1))), text_only).find("does not read images"), std::string::npos);
  EXPECT_NE(error(json{{"type", "image_url"}}, limits).find("image_url"), std::string::npos);
  // More image parts than the limit, and images outside user messages.
  ServeLimits one = limits;
  one.max_images = 1;
  json two = {{"messages", {{{"role", "user"}, {"content", json::array({image(Scenario::data_url(Scenario::picture(0))),
                                                                        image(Scenario::data_url(Scenario::picture(1)))})}}}}};
  EXPECT_THROW(parse_chat_request(two, tok, "m", one), ApiError);
  EXPECT_NO_THROW(parse_chat_request(two, tok, "m", limits));
  json system = {{"messages", {{{"role", "system"}, {"content", json::array({image(Scenario::data_url(Scenario::picture(0)))})}}}}};
  EXPECT_THROW(parse_chat_request(system, tok, "m", limits), ApiError);
}


ApiError completion_error(const json& body) {
  try {
    parse_completion_request(body, test::small_tokenizer(), "m", test_limits());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted " << body.dump();
  return ApiError(0, "");
}

ApiError chat_error(const json& body) {
  try {
    parse_chat_request(body, test::small_tokenizer(), "m", test_limits());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted " << body.dump();
  return ApiError(0, "");
}

TEST(ServeRequest, ReadsEveryPromptFormAndSamplingField) {
  const Tokenizer& tok = test::small_tokenizer();
  const json body = json::parse(R"({"model": "m", "prompt": ["one", [5, 6, 7]], "max_tokens": 3, "temperature": 0.5,
      "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 9, "n": 2, "stop": "END", "echo": true, "logprobs": 2})");
  const ApiRequest r = parse_completion_request(body, tok, "m", test_limits());
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], tok.encode("one"));
  EXPECT_EQ(r.prompts[1], (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.generation.max_tokens, 3);
  EXPECT_EQ(r.generation.sampling.temperature, 0.5);
  EXPECT_EQ(r.generation.sampling.top_k, 40);
  EXPECT_EQ(r.generation.sampling.seed, 9u);
  EXPECT_EQ(r.generation.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.echo && r.generation.prompt_logprobs && r.generation.logprobs);
  EXPECT_EQ(r.generation.top_logprobs, 2);
  EXPECT_FALSE(r.generation.grammar);
  const ApiRequest tuned = parse_completion_request(json::parse(R"({"prompt": "x", "frequency_penalty": 0.5,
      "presence_penalty": -1, "logit_bias": {"17": -100, "3": 2.5}, "response_format": {"type": "json_object"}})"), tok, "m",
                                                    test_limits());
  EXPECT_EQ(tuned.generation.sampling.frequency_penalty, 0.5);
  EXPECT_EQ(tuned.generation.sampling.presence_penalty, -1);
  EXPECT_EQ(tuned.generation.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{17, -100.0f}, {3, 2.5f}}));
  EXPECT_TRUE(tuned.generation.grammar);
  // A prompt of token ids alone, and the default of 16 tokens.
  const ApiRequest ids = parse_completion_request(json::parse(R"({"prompt": [1, 2, 3]})"), tok, "m", test_limits());
  EXPECT_EQ(ids.prompts[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids.generation.max_tokens, 16);
}

TEST(ServeRequest, RejectsBadFieldsNamingThem) {
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"model", "other"}}).status, 404);
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"model", "other"}}).code, "model_not_found");
  EXPECT_EQ(completion_error(json::array()).status, 400);
  EXPECT_EQ(completion_error(json::object()).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", 5}}).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", json::array()}}).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", {1, 100000}}}).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"max_tokens", "ten"}}).param, "max_tokens");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"max_tokens", 1.5}}).param, "max_tokens");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"max_tokens", -1}}).param, "max_tokens");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"max_tokens", 5000}}).param, "max_tokens");  // above the cap
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"temperature", 3}}).param, "temperature");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"top_p", "high"}}).param, "top_p");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"stream", "yes"}}).param, "stream");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"stop", {"a", "b", "c", "d", "e"}}}).param, "stop");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"stop", ""}}).param, "stop");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"n", 0}}).param, "n");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"logprobs", 9}}).param, "logprobs");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"frequency_penalty", 2.5}}).param, "frequency_penalty");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"presence_penalty", "a lot"}}).param, "presence_penalty");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"logit_bias", {{"12", 101}}}}).param, "logit_bias");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"logit_bias", {{"99999", 1}}}}).param, "logit_bias");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"logit_bias", {{"the", 1}}}}).param, "logit_bias");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"response_format", {{"type", "yaml"}}}}).param, "response_format");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"response_format", {{"type", "json_schema"}}}}).param, "response_format");
  const ApiError pattern = completion_error(json::parse(R"({"prompt": "x", "response_format": {"type": "json_schema",
      "json_schema": {"name": "n", "schema": {"type": "string", "format": "email"}}}})"));
  EXPECT_EQ(pattern.param, "response_format");
  EXPECT_NE(std::string(pattern.what()).find("'format'"), std::string::npos) << pattern.what();
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"max_tokens", 0}}).param, "max_tokens");  // without echo
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"stream", true}, {"logprobs", 1}}).param, "logprobs");
  const std::string long_prompt(20000, 'a');
  const ApiError context = completion_error({{"prompt", long_prompt}});
  EXPECT_EQ(context.code, "context_length_exceeded");
  EXPECT_NE(std::string(context.what()).find("maximum context length is 1024"), std::string::npos) << context.what();

  EXPECT_EQ(chat_error(json::object()).param, "messages");
  EXPECT_EQ(chat_error({{"messages", json::array()}}).param, "messages");
  EXPECT_EQ(chat_error({{"messages", {{{"content", "hi"}}}}}).param, "messages[0].role");
  EXPECT_EQ(chat_error({{"messages", {{{"role", "wizard"}, {"content", "hi"}}}}}).param, "messages[0].role");
  EXPECT_EQ(chat_error({{"messages", {{{"role", "user"}, {"content", 7}}}}}).param, "messages[0].content");
  EXPECT_EQ(chat_error(json::parse(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})")).param,
            "messages[0].content[0]");
  EXPECT_EQ(chat_error(json::parse(R"({"messages": [{"role": "user", "content": [{"type": "audio"}]}]})")).param,
            "messages[0].content[0]");
  EXPECT_EQ(chat_error(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web"}]})")).param,
            "tools");
  EXPECT_EQ(chat_error(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})")).param,
            "tool_choice");
  EXPECT_EQ(chat_error(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})")).param,
            "top_logprobs");
  const json ok = parse_completion_request({{"prompt", "x"}}, test::small_tokenizer(), "m", test_limits()).generation.max_tokens;
  EXPECT_EQ(ok, 16);
}

TEST(ServeRequest, ChatPromptFollowsTheTemplateWithToolsOffered) {
  const Tokenizer& tok = test::small_tokenizer();
  const Scenario s;
  json body = {{"messages", s.weather_messages}, {"tools", s.tools}};
  const ApiRequest r = parse_chat_request(body, tok, "m", test_limits());
  EXPECT_TRUE(r.chat_options.offers_tools());
  std::vector<ChatMessage> messages = {{"user", "What is the weather in Paris?", {}, {}, {}}};
  ChatOptions options;
  options.tools = {s.tools[0]["function"].dump()};
  EXPECT_EQ(r.prompts[0], ChatTemplate(tok).encode(messages, true, options));
  EXPECT_NE(tok.decode(r.prompts[0]).find("<tools>\n{\"description\":\"Current weather in a city\""), std::string::npos);
  // Default max_tokens: the room left in the context, capped.
  EXPECT_EQ(r.generation.max_tokens, std::min<int64_t>(4096, 1024 - int64_t(r.prompts[0].size())));
  // A named tool_choice starts the reply with the call's name.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const ApiRequest named = parse_chat_request(body, tok, "m", test_limits());
  EXPECT_EQ(named.prefill, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_TRUE(named.generation.grammar);  // the arguments follow the tool's parameters
  EXPECT_TRUE(r.generation.grammar && r.generation.grammar_after);  // "auto": free until a call starts
  EXPECT_EQ(tok.decode(named.prompts[0]), tok.decode(r.prompts[0]) + named.prefill);
  body["tool_choice"] = "none";
  EXPECT_FALSE(parse_chat_request(body, tok, "m", test_limits()).chat_options.offers_tools());
}

TEST(ServeRequest, KimiChatsRenderTheirTemplatesAndForceCallsTheirWay) {
  const Scenario s;
  const Tokenizer k3 = test::kimi_tokenizer(true), k2 = test::kimi_tokenizer(false);
  auto error = [](const json& body, const Tokenizer& tok) {
    try {
      parse_chat_request(body, tok, "m", test_limits());
    } catch (const ApiError& e) {
      return e.param + ": " + e.what();
    }
    return std::string("accepted");
  };
  json body = {{"messages", s.weather_messages}, {"tools", s.tools}};
  const ApiRequest r = parse_chat_request(body, k3, "m", test_limits());
  const std::vector<ChatMessage> messages = {{"user", "What is the weather in Paris?", {}, {}, {}}};
  ChatOptions options;
  options.tools = {s.tools[0]["function"].dump()};
  EXPECT_EQ(r.prompts[0], ChatTemplate(k3).encode(messages, true, options));
  EXPECT_TRUE(k3.decode(r.prompts[0]).ends_with("<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"));
  EXPECT_FALSE(r.generation.grammar);  // Kimi calls are read as written
  body["chat_template_kwargs"] = {{"thinking", false}};
  EXPECT_TRUE(k3.decode(parse_chat_request(body, k3, "m", test_limits()).prompts[0]).ends_with("<|open|>response<|sep|>"));
  body["chat_template_kwargs"] = {{"thinking_effort", "medium"}};
  EXPECT_TRUE(error(body, k3).starts_with("chat_template_kwargs: chat_template_kwargs.thinking_effort is not")) << error(body, k3);
  body.erase("chat_template_kwargs");
  body["tool_choice"] = "required";  // said in the prompt, as K3's template says it
  const ApiRequest required = parse_chat_request(body, k3, "m", test_limits());
  EXPECT_EQ(required.prefill, "");
  EXPECT_NE(k3.decode(required.prompts[0]).find("You MUST call tools in the next message."), std::string::npos);
  EXPECT_TRUE(required.generation.grammar && !required.generation.grammar_after);  // held from the first token
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const ApiRequest k3_named = parse_chat_request(body, k3, "m", test_limits());
  EXPECT_EQ(k3_named.prefill, "");
  EXPECT_TRUE(k3_named.generation.grammar && !k3_named.generation.grammar_after);
  const ApiRequest named = parse_chat_request(body, k2, "m", test_limits());
  EXPECT_EQ(named.prefill, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>");
  EXPECT_TRUE(k2.decode(named.prompts[0]).ends_with("<|im_assistant|>assistant<|im_middle|>" + named.prefill));
  EXPECT_TRUE(named.generation.grammar);  // K2's arguments follow the tool's parameters
  body["tool_choice"] = "auto";
  const ApiRequest k2_auto = parse_chat_request(body, k2, "m", test_limits());
  EXPECT_TRUE(k2_auto.generation.grammar && k2_auto.generation.grammar_after == k2.token_id("<|tool_call_begin|>"));
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  body.erase("tool_choice");
  body["response_format"] = {{"type", "json_object"}};
  EXPECT_TRUE(error(body, k3).starts_with("response_format: ")) << error(body, k3);

  // Names, call ids and the results that answer them reach K3's template (its order: the calls').
  const json turns = json::parse(R"([
    {"role": "user", "name": "ann", "content": "Paris and Rome?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
      {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{\"city\": \"Rome\"}"}}]},
    {"role": "tool", "tool_call_id": "b", "content": "noon"},
    {"role": "tool", "tool_call_id": "a", "content": "rain"}])");
  const std::string prompt = k3.decode(parse_chat_request({{"messages", turns}}, k3, "m", test_limits()).prompts[0]);
  EXPECT_NE(prompt.find("<|open|>message role=\"user\" name=\"ann\"<|sep|>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"),
            std::string::npos) << prompt;
  const size_t rain = prompt.find("role=\"tool\" tool=\"get_weather\" index=\"1\"<|sep|>rain");
  const size_t noon = prompt.find("role=\"tool\" tool=\"get_time\" index=\"2\"<|sep|>noon");
  EXPECT_TRUE(rain != std::string::npos && noon != std::string::npos && rain < noon) << prompt;
  json misplaced = turns;
  misplaced[0]["tool_call_id"] = "a";
  EXPECT_TRUE(error({{"messages", misplaced}}, k3).starts_with("messages[0].tool_call_id: ")) << error({{"messages", misplaced}}, k3);
}

// ---------------------------------------------------------------------------------------------
// End to end.

TEST(Serve, HealthIs503WhileLoadingThen200) {
  TestServer s({}, /*load=*/false);
  auto c = s.client();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  auto early = c.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(early);
  EXPECT_EQ(early->status, 503);
  EXPECT_EQ(json::parse(early->body)["error"]["code"], "model_loading");
  s.server->load();
  health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  EXPECT_EQ(list["data"][0]["id"], "hyla-test");
  EXPECT_EQ(c.Get("/v1/models/hyla-test")->status, 200);
  EXPECT_EQ(c.Get("/v1/models/gpt-4")->status, 404);
}

TEST(Serve, ChatRepliesAndToolCallsStreamingAndNot) {
  TestServer s;
  const Scenario sc;
  json hello = post(s, "/v1/chat/completions", {{"messages", sc.hello_messages}, {"temperature", 0}});
  EXPECT_EQ(hello["object"], "chat.completion");
  EXPECT_EQ(hello["choices"][0]["message"]["content"], sc.hello_reply);
  EXPECT_EQ(hello["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(hello["usage"]["completion_tokens"].get<int>() + hello["usage"]["prompt_tokens"].get<int>(),
            hello["usage"]["total_tokens"].get<int>());

  const json weather_body = {{"messages", sc.weather_messages}, {"tools", sc.tools}, {"temperature", 0}};
  json weather = post(s, "/v1/chat/completions", weather_body);
  const json& choice = weather["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << weather.dump();
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);

  // Streaming: role first, then content deltas, then the tool call (opened with its id and name,
  // its arguments in several deltas as they are generated), finish_reason, usage, [DONE].
  json stream_body = weather_body;
  stream_body["stream"] = true;
  const std::vector<json> events = sse_events(post_stream(s, "/v1/chat/completions", stream_body));
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  json streamed_call;
  std::string content, arguments;
  int argument_deltas = 0;
  for (const json& e : events) {
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    const json& delta = e["choices"][0]["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (!delta.contains("tool_calls")) continue;
    const json& d = delta["tool_calls"][0];
    EXPECT_EQ(d["index"], 0);
    if (d.contains("id")) {
      EXPECT_TRUE(streamed_call.is_null()) << "the call opens once";
      streamed_call = d;
    }
    arguments += d["function"]["arguments"].get<std::string>();
    argument_deltas += !d["function"]["arguments"].get<std::string>().empty();
  }
  EXPECT_EQ(content, "");
  EXPECT_EQ(streamed_call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(streamed_call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(arguments), json::parse(R"({"city": "Paris"})"));
  EXPECT_GT(argument_deltas, 2);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], weather["usage"]["completion_tokens"]);
  EXPECT_EQ(events.back()["usage"]["prompt_tokens"], weather["usage"]["prompt_tokens"]);

  json hello_stream = {{"messages", sc.hello_messages}, {"temperature", 0}, {"stream", true},
                       {"stream_options", {{"include_usage", true}}}};
  const std::vector<json> hello_events = sse_events(post_stream(s, "/v1/chat/completions", hello_stream));
  std::string hello_text;
  for (const json& e : hello_events)
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content"))
      hello_text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(hello_text, sc.hello_reply);
  EXPECT_TRUE(hello_events.back()["choices"].empty());  // the include_usage chunk
  EXPECT_EQ(hello_events.back()["usage"]["completion_tokens"], hello["usage"]["completion_tokens"]);
}

// The agent runtime's rules on a conversation the client drives: failed tool results in a row and
// assistant turns since the user spoke are counted from the messages; a reply's calls are checked
// against the offered tools; a reply's mean log-probability against the threshold.
TEST(ServeGuardrails, JudgeTheConversationAndTheReplyByTheRuntimesRules) {
  ServeGuardrails g;
  g.max_consecutive_failures = 2;
  g.max_steps = 4;
  const ChatMessage user{"user", "task", {}, {}}, call{"assistant", "", {{"f", "{}"}}, {}};
  const ChatMessage failed{"tool", R"({"error": "timed out"})", {}, {}}, result{"tool", R"({"value": 3})", {}, {}};
  const ChatMessage text_result{"tool", "an error, said in words", {}, {}};  // not an error observation
  auto stop = [&](std::vector<ChatMessage> m) {
    const auto s = conversation_guardrail(m, g);
    return s ? s->status : std::string("none");
  };
  EXPECT_EQ(stop({user, call, failed}), "none");
  EXPECT_EQ(stop({user, call, failed, call, failed}), "gave_up");
  EXPECT_EQ(stop({user, call, failed, call, result, call, failed}), "none");  // a success resets the streak
  EXPECT_EQ(stop({user, call, failed, call, text_result}), "none");
  EXPECT_EQ(stop({user, call, failed, call, failed, user}), "none");  // the user spoke: a new task
  EXPECT_EQ(stop({user, call, result, call, result, call, result}), "none");
  EXPECT_EQ(stop({user, call, result, call, result, call, result, call, result}), "step_budget");
  EXPECT_EQ(stop({user, call, result, call, result, user, call, result}), "none");
  g.max_consecutive_failures = 0;
  g.max_steps = 0;  // no limits
  EXPECT_EQ(stop({user, call, failed, call, failed, call, failed, call, failed}), "none");

  const std::vector<Tool> tools = {{"get_weather", "", json::parse(R"({"type": "object",
      "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false})")}};
  auto judge = [&](const std::string& text, std::vector<double> logprobs, const std::vector<Tool>* offered) {
    ChatOptions options;
    if (offered) options.tools = {"{}"};
    const auto s = reply_guardrail(ChatTemplate(test::small_tokenizer()).parse_reply(text, options), logprobs, offered, g);
    return s ? s->status + ": " + s->detail : std::string("none");
  };
  EXPECT_EQ(judge(R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>)", {}, &tools), "none");
  EXPECT_EQ(judge(R"(<tool_call>{"name": "get_weather", "arguments": {"city": 7}}</tool_call>)", {}, &tools),
            "invalid_tool_call: arguments.city: expected a string, got an integer");
  EXPECT_EQ(judge(R"(<tool_call>{"name": "get_time", "arguments": {}}</tool_call>)", {}, &tools),
            "invalid_tool_call: no tool named \"get_time\" (the tools are get_weather)");
  EXPECT_EQ(judge(R"(Let me look. <tool_call>{"name": "get_wea)", {}, &tools),
            std::string("invalid_tool_call: ") + kMalformedCallError);
  EXPECT_EQ(judge(R"(<tool_call>{"name": "get_wea)", {}, nullptr), "none");  // no tools offered: plain text
  g.min_confidence = -1.0;
  EXPECT_EQ(judge("Paris is sunny.", {-0.5, -1.2, -0.1}, &tools), "none");  // mean -0.6
  EXPECT_EQ(judge("Paris is sunny.", {-0.5, -2.5, -0.3}, &tools),
            "abstained: mean token log-probability -1.1000 is below -1 (serve --min-confidence)");
  EXPECT_EQ(judge(R"(<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>)", {-3, -3}, &tools),
            "none");  // confidence judges final replies, not calls
}

// The guardrails end to end: a conversation whose last two tool results failed is answered with the
// fallback and nothing is generated; a call cut short by max_tokens never reaches the client as a
// tool call; a reply below the confidence threshold is replaced, streamed or not; /metrics counts
// each. A reply the guardrails pass is returned unchanged.
TEST(Serve, GuardrailsStopWhatTheRuntimeWouldAndSayWhy) {
  const Scenario sc;
  // The confidence of the memorised greedy reply, measured by an unguarded server.
  double mean = 0;
  {
    TestServer plain;
    const json r = post(plain, "/v1/chat/completions", {{"messages", sc.hello_messages}, {"temperature", 0}, {"logprobs", true}});
    const json& lps = r["choices"][0]["logprobs"]["content"];
    ASSERT_FALSE(lps.empty());
    for (const json& t : lps) mean += t["logprob"].get<double>();
    mean /= double(lps.size());
    // A truncated call: the tool grammar holds whole calls to their schema, but max_tokens cuts this one.
    const json cut = post(plain, "/v1/chat/completions",
                          {{"messages", sc.weather_messages}, {"tools", sc.tools}, {"temperature", 0}, {"max_tokens", 4}});
    const json& choice = cut["choices"][0];
    EXPECT_FALSE(choice["message"].contains("tool_calls")) << cut.dump();
    EXPECT_EQ(choice["guardrail"]["status"], "invalid_tool_call") << cut.dump();
    EXPECT_EQ(choice["message"]["content"], ServeGuardrails{}.fallback);
    EXPECT_EQ(choice["finish_reason"], "stop");
  }
  TestServer s([&](ServeOptions& o) {
    o.limits.guardrails.max_consecutive_failures = 2;
    o.limits.guardrails.min_confidence = mean + 1e-9;  // just above the memorised reply's: it abstains
    o.limits.guardrails.fallback = "Please ask a person.";
  });
  json failing = sc.weather_messages;
  for (int i = 0; i < 2; ++i) {
    failing.push_back({{"role", "assistant"}, {"content", nullptr},
                       {"tool_calls", json::array({{{"id", "call_" + std::to_string(i)}, {"type", "function"},
                                                    {"function", {{"name", "get_weather"}, {"arguments", sc.call}}}}})}});
    failing.push_back({{"role", "tool"}, {"tool_call_id", "call_" + std::to_string(i)}, {"content", R"({"error": "timed out"})"}});
  }
  const json gave_up = post(s, "/v1/chat/completions", {{"messages", failing}, {"tools", sc.tools}, {"n", 2}});
  ASSERT_EQ(gave_up["choices"].size(), 2u);
  for (const json& choice : gave_up["choices"]) {
    EXPECT_EQ(choice["message"]["content"], "Please ask a person.");
    EXPECT_EQ(choice["guardrail"]["status"], "gave_up");
    EXPECT_EQ(choice["finish_reason"], "stop");
  }
  EXPECT_EQ(gave_up["usage"]["completion_tokens"], 0);  // nothing was generated
  json one_failure = failing;
  one_failure.erase(one_failure.end() - 2, one_failure.end());
  const json goes_on = post(s, "/v1/chat/completions", {{"messages", one_failure}, {"tools", sc.tools}, {"max_tokens", 4}});
  // Sampled (not greedy), so its four tokens may be a cut call, or a reply the threshold replaces.
  const std::string goes_on_status = goes_on["choices"][0].value("guardrail", json::object()).value("status", "");
  EXPECT_NE(goes_on_status, "gave_up");

  const json hello = {{"messages", sc.hello_messages}, {"temperature", 0}};
  const json abstained = post(s, "/v1/chat/completions", hello);
  EXPECT_EQ(abstained["choices"][0]["message"]["content"], "Please ask a person.");
  EXPECT_EQ(abstained["choices"][0]["guardrail"]["status"], "abstained");
  EXPECT_FALSE(abstained["choices"][0].contains("logprobs") && !abstained["choices"][0]["logprobs"].is_null())
      << "logprobs were computed for the guardrail, not asked for";
  json hello_stream = hello;
  hello_stream["stream"] = true;
  const std::vector<json> events = sse_events(post_stream(s, "/v1/chat/completions", hello_stream));
  std::string streamed;
  for (const json& e : events)
    if (e["choices"][0]["delta"].contains("content")) streamed += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(streamed, "Please ask a person.");  // nothing of the replaced reply went out first
  EXPECT_EQ(events.back()["choices"][0]["guardrail"]["status"], "abstained");

  TestServer lenient([&](ServeOptions& o) { o.limits.guardrails.min_confidence = mean - 0.5; });
  EXPECT_EQ(post(lenient, "/v1/chat/completions", hello)["choices"][0]["message"]["content"], sc.hello_reply);
  const std::vector<json> whole = sse_events(post_stream(lenient, "/v1/chat/completions", hello_stream));
  std::string held;
  for (const json& e : whole)
    if (e["choices"][0]["delta"].contains("content")) held += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(held, sc.hello_reply);
  EXPECT_FALSE(whole.back()["choices"][0].contains("guardrail"));

  auto metrics = s.client().Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("hyla_guardrail_stops_total{status=\"gave_up\"} 2"), std::string::npos) << metrics->body;
  const int abstentions = 2 + (goes_on_status == "abstained");
  EXPECT_NE(metrics->body.find(fmt::format("hyla_guardrail_stops_total{{status=\"abstained\"}} {}", abstentions)),
            std::string::npos)
      << metrics->body;
}

TEST(Serve, CompletionsEchoLogprobsScoreThePromptLikeTheModel) {
  // Scoring runs through the chunked prefill, so an f32 latent cache makes it f32 throughout.
  TestServer s([](ServeOptions& o) {
    o.engine.precision = Precision::F32;
    o.engine.latent_dtype = DType::F32;
    o.engine.prefill_chunk = 4;  // several chunks
  });
  const Tokenizer& tok = test::small_tokenizer();
  const std::string prompt = "The quick brown fox jumps over";
  const json scored = post(s, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}});
  const json& lp = scored["choices"][0]["logprobs"];
  const std::vector<int32_t> ids = tok.encode(prompt);
  ASSERT_EQ(lp["tokens"].size(), ids.size());
  EXPECT_EQ(scored["choices"][0]["text"], prompt);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  // The reference: log-softmax of one full f32 forward of the served weights.
  auto model = Model::load(s.options.model_dir);
  ModelInput in;
  in.ids = ids;
  in.tokens = TokenBatch::uniform(1, int64_t(ids.size()));
  const Tensor logits = model->forward(in, {.precision = Precision::F32, .outputs = Outputs::All}).logits;
  const int64_t V = model->config().vocab_size;
  for (size_t i = 1; i < ids.size(); ++i) {
    const float* row = logits.data<float>() + int64_t(i - 1) * V;
    double max = row[0], sum = 0;
    for (int64_t j = 0; j < V; ++j) max = std::max(max, double(row[j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - max);
    // f32 both ways, summed in another order (chunks, the cached kernels, and on AVX2 machines
    // oneDNN's thread-count-dependent sums): ~1e-6 apart, 1.2e-5 seen on an AMD Zen 3 box.
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), row[ids[i]] - max - std::log(sum), 5e-5);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 1u);
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), tok.decode(std::span(ids).first(i)).size());
  }
  // Token-id prompts equal text prompts; greedy is reproducible; usage counts the prompt.
  const json by_text = post(s, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
  const json by_ids = post(s, "/v1/completions", {{"prompt", ids}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(by_text["choices"][0]["text"], by_ids["choices"][0]["text"]);
  EXPECT_EQ(by_text["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(by_text["usage"]["completion_tokens"], 6);
  // Several prompts and n: one choice each, in order.
  const json many = post(s, "/v1/completions", {{"prompt", {prompt, "Another"}}, {"max_tokens", 3}, {"n", 2}, {"seed", 4}});
  ASSERT_EQ(many["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(many["choices"][i]["index"], i);
  // Streaming text equals the same request unstreamed.
  const std::vector<json> events =
      sse_events(post_stream(s, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}}));
  std::string text;
  for (const json& e : events) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, by_text["choices"][0]["text"]);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 6);
}

TEST(Serve, BadRequestsGetOpenAiShaped4xxAndTheServerLivesOn) {
  TestServer s;
  auto c = s.client();
  const auto check = [&](const httplib::Result& res, int status, const std::string& what) {
    ASSERT_TRUE(res) << what;
    EXPECT_EQ(res->status, status) << what << ": " << res->body;
    const json body = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << what << ": " << res->body;
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty()) << what;
    EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("param") && body["error"].contains("code"));
  };
  check(c.Post("/v1/completions", "{not json", "application/json"), 400, "malformed JSON");
  check(c.Post("/v1/completions", "", "application/json"), 400, "empty body");
  check(c.Post("/v1/completions", "[1, 2]", "application/json"), 400, "array body");
  check(c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": "many"})", "application/json"), 400, "wrong type");
  check(c.Post("/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", "application/json"), 404, "unknown model");
  check(c.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 100000})", "application/json"), 400, "max_tokens cap");
  check(c.Post("/v1/completions", json({{"prompt", std::string(8000, 'z')}, {"max_tokens", 200}}).dump(), "application/json"),
        400, "context");
  check(c.Post("/v1/completions", json({{"prompt", std::string(70 << 10, 'z')}}).dump(), "application/json"), 400,
        "body over the limit");
  check(c.Post("/v1/chat/completions", R"({"messages": "hello"})", "application/json"), 400, "messages type");
  check(c.Post("/v1/chat/completions", R"({"messages": [{"role": "user"}]})", "application/json"), 400, "no content");
  check(c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})",
               "application/json"), 400, "reasoning_effort");
  check(c.Post("/v1/responses", R"({"input": [{"type": "nothing"}]})", "application/json"), 400, "responses item");
  check(c.Get("/v1/nothing"), 404, "unknown route");
  check(c.Get("/v1/completions"), 404, "wrong method");
  const json ok = post(s, "/v1/completions", {{"prompt", "still alive"}, {"max_tokens", 2}});
  EXPECT_EQ(ok["choices"].size(), 1u);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("hyla_http_responses_total{path=\"/v1/completions\",status=\"400\"}"), std::string::npos);
}

TEST(Serve, ApiKeyIsRequiredWhenSet) {
  TestServer s([](ServeOptions& o) { o.api_key = "sekret"; });
  auto c = s.client();
  auto denied = c.Get("/v1/models");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  EXPECT_EQ(json::parse(denied->body)["error"]["code"], "invalid_api_key");
  c.set_bearer_token_auth("sekret");
  EXPECT_EQ(c.Get("/v1/models")->status, 200);
  EXPECT_EQ(s.client().Get("/health")->status, 200);  // health needs no key
  EXPECT_EQ(s.client().Get("/slots")->status, 401);    // slots, like /props, do
  EXPECT_EQ(s.client().Post("/slots/0?action=erase", "{}", "application/json")->status, 401);
  EXPECT_EQ(c.Get("/slots")->status, 200);
  EXPECT_EQ(s.client().Get("/metrics")->status, 200);  // nor, by default, metrics
  // The scheme is case-insensitive (RFC 7235); the key is not.
  for (const auto& [header, status] : {std::pair{"bearer sekret", 200}, {"BEARER  sekret", 200}, {"Bearer sekreT", 401},
                                       {"Bearer sekret2", 401}, {"Bearer", 401}, {"Basic sekret", 401}}) {
    auto res = s.client().Get("/v1/models", {{"Authorization", header}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << header;
  }
  TestServer locked([](ServeOptions& o) {
    o.api_key = "sekret";
    o.metrics_need_key = true;
  });
  EXPECT_EQ(locked.client().Get("/metrics")->status, 401);
  EXPECT_EQ(locked.client().Get("/metrics", {{"Authorization", "Bearer sekret"}})->status, 200);
}

// llama.cpp's and vLLM's tokenizer endpoints: the served model's tokenizer, round trip, bad input
// named, behind the API key like /v1.
TEST(Serve, TokenizeAndDetokenize) {
  TestServer s([](ServeOptions& o) { o.api_key = "sk-test"; });
  auto c = s.client();
  EXPECT_EQ(c.Post("/tokenize", R"({"content": "x"})", "application/json")->status, 401);
  c.set_bearer_token_auth("sk-test");
  const std::string text = "In the beginning God created the heaven";
  auto res = c.Post("/tokenize", json({{"content", text}}).dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json tokens = json::parse(res->body);
  const std::vector<int32_t> want = test::small_tokenizer().encode(text, true);
  EXPECT_EQ(tokens["tokens"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(tokens["count"], want.size());
  EXPECT_GT(tokens["max_model_len"].get<int64_t>(), 0);
  const json vllm = json::parse(c.Post("/tokenize", json({{"prompt", text}, {"with_pieces", true}}).dump(),
                                       "application/json")->body);
  ASSERT_EQ(vllm["tokens"].size(), want.size());
  EXPECT_EQ(vllm["tokens"][0]["id"], want[0]);
  EXPECT_FALSE(vllm["tokens"][0]["piece"].get<std::string>().empty());
  res = c.Post("/detokenize", json({{"tokens", want}}).dump(), "application/json");
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["content"], text);
  for (const auto& [path, body] : {std::pair{"/tokenize", R"({"content": 5})"}, {"/tokenize", R"({})"},
                                   {"/tokenize", R"({"content": "x", "with_pieces": 1})"},
                                   {"/detokenize", R"({"tokens": [1, -2]})"}, {"/detokenize", R"({"tokens": [1e9]})"},
                                   {"/detokenize", R"({"tokens": "1 2"})"}, {"/detokenize", "[]"}, {"/tokenize", "{"}}) {
    res = c.Post(path, body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << path << " " << body << ": " << res->body;
    EXPECT_TRUE(json::parse(res->body).contains("error")) << res->body;
  }
}

// CORS for browser UIs: listed origins are echoed and their preflights answered (before the key
// check: browsers send preflights without credentials); other origins get no CORS headers.
TEST(Serve, CorsAllowListAndPreflight) {
  TestServer s([](ServeOptions& o) {
    o.api_key = "k";
    o.cors_origins = {"http://ui.example"};
  });
  const httplib::Headers preflight = {{"Origin", "http://ui.example"}, {"Access-Control-Request-Method", "POST"},
                                      {"Access-Control-Request-Headers", "authorization, content-type"}};
  auto res = s.client().Options("/v1/chat/completions", preflight);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 204);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
  EXPECT_NE(res->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  EXPECT_NE(res->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  res = s.client().Get("/v1/models", {{"Origin", "http://ui.example"}, {"Authorization", "Bearer k"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");
  res = s.client().Get("/v1/models", {{"Origin", "http://ui.example"}});  // the key is still required
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "http://ui.example");  // so the page can read why
  res = s.client().Get("/v1/models", {{"Origin", "http://evil.example"}, {"Authorization", "Bearer k"}});
  EXPECT_FALSE(res->has_header("Access-Control-Allow-Origin"));
  res = s.client().Options("/v1/models", {{"Origin", "http://evil.example"}, {"Access-Control-Request-Method", "GET"}});
  EXPECT_EQ(res->status, 403);
  EXPECT_FALSE(res->has_header("Access-Control-Allow-Origin"));
  TestServer closed;
  EXPECT_FALSE(closed.client().Get("/health", {{"Origin", "http://ui.example"}})->has_header("Access-Control-Allow-Origin"));
}

TEST(Serve, SixteenConcurrentClientsAllCompleteAndMatchOneAtATime) {
  TestServer s([](ServeOptions& o) {
    o.engine.precision = Precision::F32;
    o.engine.latent_dtype = DType::F32;
  });
  const int clients = 16;
  auto body = [](int i) {
    const std::string words = test::sample_text(1, uint64_t(i)).substr(0, 40);
    return json{{"prompt", "Client " + std::to_string(i) + " asks about " + words.substr(0, utf8_complete_prefix(words))},
                {"max_tokens", 8}, {"temperature", 0}};
  };
  std::vector<std::string> expected;
  int64_t generated = 0;  // by the one-at-a-time requests; the concurrent ones generate the same
  for (int i = 0; i < clients; ++i) {
    const json r = post(s, "/v1/completions", body(i));
    expected.push_back(r["choices"][0]["text"]);
    generated += r["usage"]["completion_tokens"].get<int64_t>();
  }
  std::vector<std::string> got(clients);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      json b = body(i);
      if (i % 2) {  // half of them stream
        b["stream"] = true;
        for (const json& e : sse_events(post_stream(s, "/v1/completions", b))) got[size_t(i)] += e["choices"][0]["text"];
      } else {
        got[size_t(i)] = post(s, "/v1/completions", b)["choices"][0]["text"];
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < clients; ++i) EXPECT_EQ(got[size_t(i)], expected[size_t(i)]) << "client " << i;
  const std::string metrics = s.client().Get("/metrics")->body;
  EXPECT_NE(metrics.find("hyla_requests_total 32\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find(fmt::format("hyla_generation_tokens_total {}\n", 2 * generated)), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("hyla_time_to_first_token_seconds_count 32\n"), std::string::npos);
  EXPECT_NE(metrics.find("hyla_requests_running 0\n"), std::string::npos);
}

int64_t cancelled_count(const TestServer& s) {
  const std::string metrics = s.client().Get("/metrics")->body;
  const std::string key = "hyla_requests_finished_total{reason=\"cancelled\"} ";
  const size_t at = metrics.find(key);
  return at == std::string::npos ? -1 : std::stoll(metrics.substr(at + key.size()));
}

bool wait_for(const std::function<bool()>& condition) {
  for (int i = 0; i < 500; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A TCP connection to the server, nothing sent yet.
int connect_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST(Serve, DisconnectedClientsAreCancelled) {
  // Requests long enough (~seconds), and blind to end tokens, so that they cannot finish before the
  // server notices the hang-up, even when the HTTP threads are starved on a loaded machine.
  constexpr int kLong = 30000;
  TestServer s([](ServeOptions& o) {
    o.engine.context = 32768;
    o.limits.max_tokens = kLong;
  });
  // A streaming client that hangs up after its first chunk.
  {
    auto c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json({{"prompt", "Go on forever"}, {"max_tokens", kLong}, {"stream", true}, {"ignore_eos", true}}).dump();
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };
    c.send(req);
  }
  EXPECT_TRUE(wait_for([&] { return cancelled_count(s) == 1; })) << cancelled_count(s);
  // A non-streaming client that sends its request and closes the socket at once.
  const int fd = connect_loopback(s.port);
  const std::string body = json({{"prompt", "Also forever"}, {"max_tokens", kLong}, {"ignore_eos", true}}).dump();
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  close(fd);  // the server still reads the request, then finds the connection gone
  EXPECT_TRUE(wait_for([&] { return cancelled_count(s) == 2; })) << cancelled_count(s);
  EXPECT_TRUE(wait_for([&] { return s.client().Get("/metrics")->body.find("hyla_requests_running 0\n") != std::string::npos; }));
}

// ---------------------------------------------------------------------------------------------
// Hostile and careless clients.

// Sends `request` as is on a new connection, optionally half-closes it (shutdown(SHUT_WR), as
// `nc -N` does), and returns what the server sent until it closed the connection or went quiet
// for `timeout_s`; `first_byte_seconds` gets the time the reply took to start.
std::string raw_exchange(int port, const std::string& request, bool half_close, double* first_byte_seconds = nullptr,
                         int timeout_s = 30) {
  const auto start = std::chrono::steady_clock::now();
  const int fd = connect_loopback(port);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(write(fd, request.data(), request.size()), ssize_t(request.size()));
  if (half_close) shutdown(fd, SHUT_WR);
  std::string reply;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) {
    if (reply.empty() && first_byte_seconds)
      *first_byte_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    reply.append(buffer, size_t(n));
  }
  close(fd);
  return reply;
}

std::string post_request(const std::string& body, const std::string& version = "HTTP/1.1") {
  return "POST /v1/completions " + version + "\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST(Serve, DeeplyNestedJsonIsA400AndTheServerLivesOn) {
  TestServer s([](ServeOptions& o) { o.limits.max_body_bytes = 1 << 20; });
  const int depth = 100000;  // ~200 KB: nlohmann's recursive dump() of it used to overflow the stack
  const std::string body = "{\"prompt\": [1, " + std::string(depth, '[') + std::string(depth, ']') + "], \"max_tokens\": 2}";
  auto res = s.client().Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("the request body: JSON nested deeper than 64 levels"), std::string::npos) << res->body;
  EXPECT_EQ(s.client().Get("/health")->status, 200);
}

TEST(Serve, IdleConnectionsDoNotStarveTheServer) {
  TestServer s;
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(connect_loopback(s.port));  // connected, never a byte
  const auto start = std::chrono::steady_clock::now();
  auto health = s.client().Get("/health");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_LT(seconds, 2.0) << "/health took " << seconds << " s beside 300 idle connections";
  const json ok = post(s, "/v1/completions", {{"prompt", "still served"}, {"max_tokens", 2}});
  EXPECT_EQ(ok["choices"].size(), 1u);
  for (int fd : idle) close(fd);
}

TEST(Serve, APortInUseIsAnError) {
  TestServer s;
  ServeOptions second = s.options;
  second.port = s.port;
  Server other(second);
  try {
    other.bind();
    ADD_FAILURE() << "a second server listens on port " << s.port;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(s.port)), std::string::npos);
  }
}

TEST(Serve, HalfClosedClientsStillGetTheirReply) {
  TestServer s;
  const std::string body = json({{"prompt", "Say hello"}, {"max_tokens", 4}}).dump();
  std::string reply = raw_exchange(s.port, post_request(body), /*half_close=*/true);
  EXPECT_NE(reply.find("HTTP/1.1 200 OK"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\"choices\""), std::string::npos) << reply;
  // HTTP/1.0 clients get no interim response (RFC 9110 §15.2), only the reply.
  reply = raw_exchange(s.port, post_request(body, "HTTP/1.0"), /*half_close=*/true);
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK", 0), 0u) << reply;
  EXPECT_NE(reply.find("\"choices\""), std::string::npos) << reply;
  EXPECT_EQ(cancelled_count(s), 0);
}

TEST(Serve, BadContentLengthsAreAnsweredAtOnceNamingTheProblem) {
  TestServer s;
  double seconds = 1e9;
  std::string reply = raw_exchange(
      s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: -5\r\n\r\n{}", false, &seconds);
  EXPECT_LT(seconds, 2.0);
  EXPECT_NE(reply.find("400 Bad Request"), std::string::npos) << reply;
  EXPECT_NE(reply.find("Content-Length '-5' is not a non-negative integer"), std::string::npos) << reply;
  seconds = 1e9;
  reply = raw_exchange(s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 999999999\r\n\r\n{}", false,
                       &seconds);
  EXPECT_LT(seconds, 2.0);
  EXPECT_NE(reply.find("400 Bad Request"), std::string::npos) << reply;
  EXPECT_NE(reply.find("exceeds this server's limit"), std::string::npos) << reply;
  // A body shorter than announced: after the read timeout (5 s), a 400 that says so.
  reply = raw_exchange(s.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\n{\"prompt\": 1}",
                       false);
  EXPECT_NE(reply.find("400 Bad Request"), std::string::npos) << reply;
  EXPECT_NE(reply.find("ended after 13 of the 100 bytes"), std::string::npos) << reply;
  EXPECT_EQ(s.client().Get("/health")->status, 200);
}

TEST(Serve, ShutdownGivesRequestsAGracePeriodThenCancelsThem) {
  TestServer s([](ServeOptions& o) {
    o.engine.context = 32768;
    o.limits.max_tokens = 30000;
    o.shutdown_grace_seconds = 0.3;
  });
  int status = 0;
  std::string body;
  std::thread client([&] {
    auto res = s.client().Post("/v1/completions", json({{"prompt", "Go on"}, {"max_tokens", 30000}, {"ignore_eos", true}}).dump(),
                               "application/json");
    if (res) status = res->status, body = res->body;
  });
  EXPECT_TRUE(wait_for([&] { return s.client().Get("/metrics")->body.find("hyla_requests_running 1\n") != std::string::npos; }));
  const auto start = std::chrono::steady_clock::now();
  s.server->shutdown();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  client.join();
  EXPECT_LT(seconds, 5.0);
  ASSERT_EQ(status, 503) << body;
  EXPECT_EQ(json::parse(body)["error"]["code"], "shutting_down");
  EXPECT_FALSE(s.client().Get("/health"));  // stopped after the drain
}

// `hyla serve` as started from a shell: the API key from the environment or a file (never only the
// command line, which `ps` shows), and SIGTERM draining the requests in flight for the grace period.
struct ServeProcess {
  pid_t pid = 0;
  int port = 0;
  test::TempDir dir;
  ServeProcess(const std::string& env, const std::string& flags) {
    const std::string log = (dir / "log").string();
    const std::string command = env + " exec " + HYLA_BINARY + " serve --model " + memorised_model_dir().string() +
                                " --port 0 --context 32768 --max-tokens 30000 " + flags + " > " + log + " 2>&1";
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    const auto ready = [&] { return std::filesystem::exists(log) && read_file(log).find("ready (") != std::string::npos; };
    EXPECT_TRUE(wait_for(ready)) << (std::filesystem::exists(log) ? read_file(log) : "no log");
    const std::string text = read_file(log), marker = "listening on http://127.0.0.1:";
    port = std::stoi(text.substr(text.find(marker) + marker.size()));
  }
  // Sends SIGTERM; the exit status, or -1 if the server is still running after `seconds`.
  int terminate(double seconds) {
    kill(pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  ~ServeProcess() {
    if (pid) terminate(10);
  }
  int status_with_key(const std::string& key) const {
    httplib::Client c("127.0.0.1", port);
    auto res = c.Get("/v1/models", {{"Authorization", "Bearer " + key}});
    return res ? res->status : 0;
  }
};

TEST(ServeCommand, TakesTheKeyFromTheEnvironmentOrAFileAndDrainsOnSigterm) {
  {
    ServeProcess s("HYLA_API_KEY=from-env", "--shutdown-grace 0.5");
    EXPECT_EQ(s.status_with_key("from-env"), 200);
    EXPECT_EQ(s.status_with_key("wrong"), 401);
    int status = 0;
    std::string body;
    std::thread client([&] {
      httplib::Client c("127.0.0.1", s.port);
      c.set_read_timeout(60, 0);
      auto res = c.Post("/v1/completions", {{"Authorization", "Bearer from-env"}},
                        json({{"prompt", "Go on"}, {"max_tokens", 30000}, {"ignore_eos", true}}).dump(), "application/json");
      if (res) status = res->status, body = res->body;
    });
    EXPECT_TRUE(wait_for([&] {
      httplib::Client c("127.0.0.1", s.port);
      auto m = c.Get("/metrics");
      return m && m->body.find("hyla_requests_running 1\n") != std::string::npos;
    }));
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(s.terminate(20), 0);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 8.0);
    client.join();
    EXPECT_EQ(status, 503) << body;
    EXPECT_NE(body.find("shutting_down"), std::string::npos) << body;
  }
  test::TempDir dir;
  test::write_bytes(dir / "key", "from-file\n");
  ServeProcess s("", "--api-key-file " + (dir / "key").string() + " --metrics-need-key");
  EXPECT_EQ(s.status_with_key("from-file"), 200);
  EXPECT_EQ(s.status_with_key("from-file\n"), 401);
  httplib::Client c("127.0.0.1", s.port);
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  EXPECT_EQ(s.terminate(20), 0);
}

TEST(Serve, CurlEndToEnd) {
  TestServer s;
  const Scenario sc;
  const std::string curl = "curl -sS --max-time 60 ";
  // A fixed seed: sampled with a random one, end-of-text within the 5 tokens happened once in CI.
  auto r = test::run_command(curl + s.url() + "/v1/completions -H 'Content-Type: application/json' -d '" +
                             json({{"prompt", "In the beginning"}, {"max_tokens", 5}, {"seed", 1}}).dump() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json completion = json::parse(r.output);
  EXPECT_EQ(completion["object"], "text_completion");
  EXPECT_EQ(completion["usage"]["completion_tokens"], 5);

  r = test::run_command(curl + "-N " + s.url() + "/v1/chat/completions -H 'Content-Type: application/json' -d '" +
                        json({{"messages", sc.hello_messages}, {"temperature", 0}, {"stream", true}}).dump() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string text;
  for (const json& e : sse_events(r.output))
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(text, sc.hello_reply);

  r = test::run_command(curl + "-o /dev/null -w '%{http_code}' " + s.url() +
                        "/v1/chat/completions -H 'Content-Type: application/json' -d '{\"messages\": 3}'");
  EXPECT_EQ(r.output, "400");
  r = test::run_command(curl + s.url() + "/metrics");
  EXPECT_NE(r.output.find("# TYPE hyla_time_to_first_token_seconds histogram"), std::string::npos) << r.output;
}

// Over HTTP, the same words with different images get each image's memorised reply: the image,
// not the text, decides. A remote URL is refused with a 400 that says only data URLs are read.
TEST(Serve, ChatWithImagesAnswersFromTheImage) {
  TestServer s;
  httplib::Client c("127.0.0.1", s.port);
  const Scenario sc;
  for (int which : {0, 1}) {
    const json body = {{"messages", sc.image_messages(which)}, {"temperature", 0}, {"max_tokens", 16}};
    auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["choices"][0]["message"]["content"], sc.image_replies[size_t(which)]);
  }
  json remote = sc.image_messages(0);
  remote[0]["content"][1]["image_url"]["url"] = "http://127.0.0.1:1/x.png";
  auto res = c.Post("/v1/chat/completions", json{{"messages", remote}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_NE(res->body.find("only data URLs"), std::string::npos) << res->body;
}

// The official client libraries: installed into the build tree on first use.
std::filesystem::path client_node_modules() {
  const auto dir = test::build_dir() / "npm";
  std::filesystem::create_directories(dir);
  if (!std::filesystem::exists(dir / "node_modules/openai/package.json") ||
      !std::filesystem::exists(dir / "node_modules/@anthropic-ai/sdk/package.json") ||
      !std::filesystem::exists(dir / "node_modules/puppeteer-core/package.json")) {
    const auto r = test::run_command("flock " + (dir / ".lock").string() + " npm install --no-audit --no-fund --loglevel=error --prefix " +
                                     dir.string() + " openai@6 @anthropic-ai/sdk@1 puppeteer-core@24");
    EXPECT_EQ(r.exit_code, 0) << "npm install of the client libraries failed (is the npm registry reachable?):\n" << r.output;
  }
  return dir / "node_modules";
}

TEST(Serve, OpenAiNpmClientEndToEnd) {
  const auto modules = client_node_modules();
  ASSERT_TRUE(std::filesystem::exists(modules / "openai/package.json"));
  TestServer s;
  test::TempDir dir;
  test::write_bytes(dir / "scenario.json", Scenario().to_json().dump());
  const auto r = test::run_command("NODE_PATH=" + modules.string() + " node " +
                                   (test::source_dir() / "tests/serve/openai_client.cjs").string() + " " + s.url() +
                                   "/v1 hyla-test " + (dir / "scenario.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("openai client: all checks passed"), std::string::npos) << r.output;
}

// Issue 67: /metrics counts the prompt tokens restored and read, and the prompts that restored a
// prefix: a conversation's second turn restores its first.
TEST(Serve, MetricsCountPromptTokensRestoredAndRead) {
  TestServer s;
  const Scenario sc;
  const json first = post(s, "/v1/chat/completions", {{"messages", sc.hello_messages}, {"temperature", 0}});
  json messages = sc.hello_messages;
  messages.push_back(first["choices"][0]["message"]);
  messages.push_back({{"role", "user"}, {"content", "And again?"}});
  const json second = post(s, "/v1/chat/completions", {{"messages", messages}, {"temperature", 0}, {"max_tokens", 4}});
  const int64_t cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, 0);
  const int64_t prompts = first["usage"]["prompt_tokens"].get<int64_t>() + second["usage"]["prompt_tokens"].get<int64_t>();
  const std::string metrics = s.client().Get("/metrics")->body;
  EXPECT_NE(metrics.find(fmt::format("hyla_prompt_tokens_cached_total {}\n", cached)), std::string::npos) << metrics;
  EXPECT_NE(metrics.find(fmt::format("hyla_prompt_tokens_read_total {}\n", prompts - cached)), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("hyla_prompt_state_restores_total{result=\"hit\"} 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("hyla_prompt_state_restores_total{result=\"miss\"} 1\n"), std::string::npos) << metrics;
}

// Issue 67: the chat page at / and its files at /web/NAME, compiled in, under a policy that lets
// it run only this server's scripts and reach only this server; nothing in it names another host,
// and its scripts parse.
TEST(Serve, ChatPageIsServedWholeUnderItsPolicy) {
  TestServer s;
  auto c = s.client();
  const auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  const std::string policy = page->get_header_value("Content-Security-Policy");
  EXPECT_NE(policy.find("default-src 'none'"), std::string::npos) << policy;
  EXPECT_NE(policy.find("connect-src 'self'"), std::string::npos) << policy;
  EXPECT_NE(page->body.find("<script src=\"/web/chat.js\""), std::string::npos);
  for (const auto& entry : std::filesystem::directory_iterator(test::source_dir() / "web")) {
    const std::string name = entry.path().filename().string();
    const auto file = c.Get("/web/" + name);
    ASSERT_TRUE(file) << name;
    EXPECT_EQ(file->status, 200) << name;
    EXPECT_EQ(file->body, read_file(entry.path().string())) << name << ": the binary serves the repository's file";
    for (const char* outside : {"http://", "https://", "//cdn", "@import"})
      EXPECT_EQ(file->body.find(outside), std::string::npos) << name << " names " << outside;
    if (name.ends_with(".js")) {
      const auto r = test::run_command("node --check " + entry.path().string());
      EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
    }
  }
  EXPECT_EQ(c.Get("/web/missing.js")->status, 404);
  EXPECT_EQ(c.Get("/web/../CMakeLists.txt")->status, 404);
  // A reply's Markdown can only make the page's own markup: its text is escaped first.
  const auto r = test::run_command(
      "node -e 'eval(require(\"fs\").readFileSync(process.argv[1], \"utf8\") + \";globalThis.md = renderMarkdown;\"); "
      "process.stdout.write(md(process.argv[2]))' " + (test::source_dir() / "web/markdown.js").string() +
      " '<img src=x onerror=alert(1)> **bold** [a](javascript:alert(1)) [b](https://e.org)\n\n```\n<b>\n```'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("<img"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("href=\"javascript"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<strong>bold</strong>"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<pre><code>&lt;b&gt;"), std::string::npos) << r.output;
}

// Issue 67: the chat page in a real browser (headless Chromium, tests/serve/chat_page.cjs): a
// message and its streamed reply, an attached image, Stop, folded reasoning; the screenshot it
// saves (build/chat-page.png) shows a reader the page.
TEST(Serve, ChatPageWorksInHeadlessChromium) {
  const auto modules = client_node_modules();
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/chromium")) << "needs Debian's chromium (scripts/setup.sh installs it)";
  TestServer s;
  test::TempDir dir;
  test::write_bytes(dir / "scenario.json", Scenario().to_json().dump());
  test::write_bytes(dir / "picture.png", encode_png(Scenario::picture(0)));
  const auto screenshot = test::build_dir() / "chat-page.png";
  std::filesystem::remove(screenshot);
  const auto r = test::run_command("NODE_PATH=" + modules.string() + " timeout 120 node " +
                                   (test::source_dir() / "tests/serve/chat_page.cjs").string() + " " + s.url() + "/ " +
                                   (dir / "scenario.json").string() + " " + (dir / "picture.png").string() + " " +
                                   screenshot.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("chat page: all checks passed"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(screenshot));
}

// Issue 67: llama-server's /props, which chat UIs read first.
TEST(Serve, PropsDescribeTheModelForChatUis) {
  TestServer s;
  const auto res = s.client().Get("/props");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json props = json::parse(res->body);
  EXPECT_EQ(props["model_alias"], "hyla-test");
  EXPECT_EQ(props["total_slots"], 4);
  EXPECT_EQ(props["default_generation_settings"]["n_ctx"], 1024);
  EXPECT_EQ(props["chat_template"], "hyla");
  EXPECT_EQ(props["modalities"]["vision"], true);
  EXPECT_EQ(props["build_info"].get<std::string>().rfind("hyla ", 0), 0u);
}

// Issue 67: llama-server's slots. A request's slot keeps its state; saved, erased, restored on a
// restarted server, it is continued without reading its tokens again, as a fresh server continues
// the whole prompt. Bad ids, actions, filenames and files are 400s in OpenAI's shape; a server
// without --slot-save-path answers 501.
TEST(Serve, SlotsAreListedSavedErasedAndRestoredAcrossARestart) {
  test::TempDir dir;
  const auto with_slots = [&](ServeOptions& o) {
    o.engine.max_sequences = 2;
    o.slot_save_path = dir / "slots";
  };
  const auto ids = [](const TestServer& s, const std::string& text) {
    return post(s, "/tokenize", {{"content", text}})["tokens"].get<std::vector<int32_t>>();
  };
  const auto slots = [](const TestServer& s) {
    const auto res = s.client().Get("/slots");
    EXPECT_TRUE(res && res->status == 200);
    return res ? json::parse(res->body) : json();
  };
  const auto act = [](const TestServer& s, const std::string& path, const json& body, int status) {
    return post(s, path, body, status);
  };
  std::vector<int32_t> head, tail;
  int64_t held = 0;
  {
    TestServer s(with_slots);
    const json empty = slots(s);
    ASSERT_EQ(empty.size(), 2u);
    EXPECT_EQ(empty[0]["id"], 0);
    EXPECT_EQ(empty[0]["n_ctx"], 1024);
    EXPECT_EQ(empty[0]["is_processing"], false);
    EXPECT_EQ(empty[0]["n_tokens"], 0);
    EXPECT_FALSE(empty[0].contains("id_task"));
    head = ids(s, "In the beginning God created the heaven and the earth. And the earth was without form");
    tail = ids(s, ", and void; and darkness was upon the face of the deep.");
    // One generated token: the state holds the prompt exactly (the sampled token is never fed).
    post(s, "/v1/completions", {{"prompt", head}, {"max_tokens", 1}, {"temperature", 0}});
    const json used = slots(s);
    const int slot = used[0]["n_tokens"] > 0 ? 0 : 1;
    EXPECT_EQ(used[size_t(slot)]["n_tokens"], head.size());
    EXPECT_EQ(used[size_t(slot)]["n_prompt_tokens"], head.size());
    EXPECT_EQ(used[size_t(slot)]["next_token"][0]["n_decoded"], 1);
    EXPECT_EQ(used[size_t(slot)]["next_token"][0]["has_next_token"], false);
    const std::string at = fmt::format("/slots/{}", slot);
    const json saved = act(s, at + "?action=save", {{"filename", "genesis.slot"}}, 200);
    held = saved["n_saved"].get<int64_t>();
    EXPECT_EQ(held, int64_t(head.size()));
    EXPECT_EQ(saved["id_slot"], slot);
    EXPECT_EQ(saved["filename"], "genesis.slot");
    EXPECT_EQ(saved["n_written"], std::filesystem::file_size(dir / "slots" / "genesis.slot"));
    EXPECT_TRUE(saved["timings"].contains("save_ms"));
    EXPECT_EQ(act(s, at + "?action=erase", json::object(), 200)["n_erased"], held);
    EXPECT_EQ(slots(s)[size_t(slot)]["n_tokens"], 0);

    EXPECT_EQ(act(s, "/slots/2?action=save", {{"filename", "x"}}, 400)["error"]["param"], "id_slot");
    EXPECT_EQ(act(s, "/slots/-1?action=save", {{"filename", "x"}}, 400)["error"]["param"], "id_slot");
    EXPECT_EQ(act(s, "/slots/0?action=fly", {{"filename", "x"}}, 400)["error"]["param"], "action");
    for (const char* name : {"../escape", "", ".hidden", "a/b", "sp ace", "new\nline"})
      EXPECT_EQ(act(s, "/slots/0?action=save", {{"filename", name}}, 400)["error"]["param"], "filename") << name;
    EXPECT_FALSE(std::filesystem::exists(dir / "escape"));
    EXPECT_EQ(act(s, "/slots/0?action=save", {{"filename", 3}}, 400)["error"]["param"], "filename");
    auto c = s.client();
    const auto not_json = c.Post("/slots/0?action=restore", "{", "application/json");
    ASSERT_TRUE(not_json);
    EXPECT_EQ(not_json->status, 400);
    const json missing = act(s, "/slots/0?action=restore", {{"filename", "absent.slot"}}, 400);
    EXPECT_NE(missing["error"]["message"].get<std::string>().find("slot file absent.slot: no such file"), std::string::npos);
    const std::string whole = read_file(dir / "slots" / "genesis.slot");
    test::write_bytes(dir / "slots" / "cut.slot", whole.substr(0, whole.size() / 2));
    const json cut = act(s, "/slots/0?action=restore", {{"filename", "cut.slot"}}, 400);
    EXPECT_NE(cut["error"]["message"].get<std::string>().find("unable to restore slot 0: slot file cut.slot: truncated"),
              std::string::npos) << cut.dump();
    EXPECT_EQ(cut["error"]["type"], "invalid_request_error");
  }
  std::vector<int32_t> prompt = head;
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  const json request = {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 1}};
  json fresh;
  {
    TestServer cold([](ServeOptions& o) { o.engine.prefix_cache_bytes = 0; });
    fresh = post(cold, "/v1/completions", request);
    EXPECT_EQ(fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(post(cold, "/slots/0?action=erase", json::object(), 501)["error"]["type"], "not_supported_error");
  }
  TestServer restarted(with_slots);
  const json restored = act(restarted, "/slots/1?action=restore", {{"filename", "genesis.slot"}}, 200);
  EXPECT_EQ(restored["n_restored"], held);
  EXPECT_EQ(restored["n_read"], std::filesystem::file_size(dir / "slots" / "genesis.slot"));
  EXPECT_EQ(slots(restarted)[1]["n_tokens"], held);
  const json continued = post(restarted, "/v1/completions", request);
  EXPECT_EQ(continued["usage"]["prompt_tokens_details"]["cached_tokens"], held);
  EXPECT_EQ(continued["choices"][0]["text"], fresh["choices"][0]["text"]);
  const json& a = continued["choices"][0]["logprobs"]["token_logprobs"];
  const json& b = fresh["choices"][0]["logprobs"]["token_logprobs"];
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i].get<double>(), b[i].get<double>(), 2e-2) << i;
}

// Issue 67: a stream kept silent by a long prompt's prefill gets keep-alives (an SSE comment; on
// /v1/messages Anthropic's ping event), and the stream that follows is whole.
TEST(Serve, SilentStreamsGetKeepAlives) {
  TestServer s([](ServeOptions& o) {
    o.engine.context = 8192;
    o.engine.prefill_chunk = 16;
    o.keepalive_seconds = 0.001;
    o.limits.max_body_bytes = 1 << 20;
  });
  std::string prompt;
  for (int i = 0; i < 200; ++i) prompt += "In the beginning God created the heaven. ";
  // Greedy: a sampled reply may end within its 4 tokens, and the test is about the stream, not the reply.
  const std::string chat = post_stream(s, "/v1/chat/completions",
                                       {{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 4},
                                        {"temperature", 0}, {"stream", true}});
  EXPECT_NE(chat.find(": keep-alive\n\n"), std::string::npos) << chat.substr(0, 300);
  EXPECT_LT(chat.find(": keep-alive"), chat.find("\"finish_reason\":\"")) << "keep-alives come while the prompt is read";
  EXPECT_EQ(sse_events(chat).back()["choices"][0]["finish_reason"], "length");
  const std::string messages = post_stream(s, "/v1/messages",  // another prompt: none of it cached
      {{"messages", {{{"role", "user"}, {"content", "And " + prompt}}}}, {"max_tokens", 4}, {"temperature", 0},
       {"stream", true}});
  EXPECT_NE(messages.find("event: ping\ndata: {\"type\": \"ping\"}"), std::string::npos) << messages.substr(0, 300);
  EXPECT_NE(messages.find("event: message_stop"), std::string::npos);
}

// Issue 67: the Anthropic Messages API driven by Anthropic's own SDK (tests/serve/anthropic_client.cjs):
// text, blocks, images, count_tokens, stop sequences, a tool loop, a forced call, streams and errors.
TEST(Serve, AnthropicSdkEndToEnd) {
  const auto modules = client_node_modules();
  ASSERT_TRUE(std::filesystem::exists(modules / "@anthropic-ai/sdk/package.json"));
  TestServer s;
  test::TempDir dir;
  test::write_bytes(dir / "scenario.json", Scenario().to_json().dump());
  const auto r = test::run_command("NODE_PATH=" + modules.string() + " node " +
                                   (test::source_dir() / "tests/serve/anthropic_client.cjs").string() + " " + s.url() +
                                   " hyla-test " + (dir / "scenario.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("anthropic client: all checks passed"), std::string::npos) << r.output;
}

// Issue 67: the OpenAI Responses API driven by the `openai` package's Responses client
// (tests/serve/responses_client.cjs): text, items, images, incomplete replies, a tool loop continued
// by previous_response_id and by the whole history, a forced call, streams and errors.
TEST(Serve, OpenAiResponsesClientEndToEnd) {
  const auto modules = client_node_modules();
  TestServer s;
  test::TempDir dir;
  test::write_bytes(dir / "scenario.json", Scenario().to_json().dump());
  const auto r = test::run_command("NODE_PATH=" + modules.string() + " node " +
                                   (test::source_dir() / "tests/serve/responses_client.cjs").string() + " " + s.url() +
                                   "/v1 hyla-test " + (dir / "scenario.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("responses client: all checks passed"), std::string::npos) << r.output;
}

// A server whose routed experts stay in the int8 files answers as the resident one does, and
// /metrics reports the expert cache per MoE layer.
TEST(Serve, OffloadedExpertsAnswerAsResidentOnesAndShowInMetrics) {
  test::TempDir dir;
  quantize_model(memorised_model_dir(), dir / "int8", {});
  const json request = {{"prompt", "The weather in Paris"}, {"max_tokens", 8}, {"temperature", 0}};
  json replies[2];
  for (const bool offload : {false, true}) {
    TestServer s([&](ServeOptions& o) {
      o.model_dir = dir / "int8";
      if (offload) o.load.offload_experts = ExpertOffloadOptions{parse_expert_memory("50%")};
    });
    replies[offload] = post(s, "/v1/completions", request);
    const std::string metrics = s.client().Get("/metrics")->body;
    EXPECT_EQ(metrics.find("hyla_expert_hit_rate{moe_layer=\"0\"}") != std::string::npos, offload) << metrics;
    if (offload) {
      EXPECT_NE(metrics.find("hyla_expert_offload_tokens_total"), std::string::npos);
    }
  }
  EXPECT_EQ(replies[1]["choices"][0]["text"], replies[0]["choices"][0]["text"]);
}

}  // namespace
}  // namespace hyla
