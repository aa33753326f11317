#include "hyla/data/tokenizer_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "hyla/core/error.h"
#include "hyla/data/byte_level.h"
#include "hyla/io/json_fields.h"

namespace hyla {
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

namespace {

int32_t read_id(JsonFields& fields, const std::string& key, const std::string& source) {
  int64_t id = -1;
  fields.read(key, id);
  HYLA_CHECK(fields.has(key), "{}: {} is missing", source, fields.path(key));
  HYLA_CHECK(id >= 0 && id < INT32_MAX, "{}: {} must be a token id in [0, 2^31), got {}", source, fields.path(key), id);
  return int32_t(id);
}

// The type of an HF component object ("ByteLevel", "Split", ...), or "" for null.
std::string component_type(const json& value, const std::string& source, const std::string& path) {
  if (value.is_null()) return "";
  HYLA_CHECK(value.is_object() && value.contains("type") && value["type"].is_string(),
             "{}: {} must be null or an object with a string \"type\"", source, path);
  return value["type"].get<std::string>();
}

void read_byte_level(JsonFields& fields, PreTokenizerConfig& config) {
  fields.ignore("type");
  // HF's defaults for keys a file leaves out.
  config.add_prefix_space = config.trim_offsets = config.use_regex = true;
  fields.read("add_prefix_space", config.add_prefix_space);
  fields.read("trim_offsets", config.trim_offsets);
  fields.read("use_regex", config.use_regex);
  fields.finish();
}

SplitRule read_split(JsonFields& fields) {
  fields.ignore("type");
  SplitRule rule;
  JsonFields pattern = fields.object("pattern");
  if (pattern.has("Regex")) {
    pattern.read("Regex", rule.pattern);
  } else {
    if (!pattern.has("String")) fields.fail_rule(fields.path("pattern") + " needs \"Regex\" or \"String\"");
    pattern.read("String", rule.pattern);
    rule.literal = true;
  }
  pattern.finish();
  std::string behavior = "Isolated";
  bool invert = false;
  fields.read("behavior", behavior);
  fields.read("invert", invert);
  if (behavior != "Isolated") fields.fail_rule(fmt::format("{} '{}' is not supported (hyla implements Isolated)",
                                                         fields.path("behavior"), behavior));
  if (invert) fields.fail_rule(fields.path("invert") + " = true is not supported");
  fields.finish();
  return rule;
}

PreTokenizerConfig read_pre_tokenizer(const json& value, const std::string& source) {
  const std::string type = component_type(value, source, "pre_tokenizer");
  PreTokenizerConfig config;
  if (type == "ByteLevel") {
    JsonFields fields(value, source, "pre_tokenizer");
    read_byte_level(fields, config);
    return config;
  }
  HYLA_CHECK(type == "Sequence", "{}: pre_tokenizer type '{}' is not supported (hyla reads ByteLevel, or a "
             "Sequence of Split steps ending in ByteLevel)", source, type.empty() ? "null" : type);
  JsonFields sequence(value, source, "pre_tokenizer");
  sequence.ignore("type");
  const json& steps = sequence.raw("pretokenizers");
  sequence.finish();
  HYLA_CHECK(steps.is_array() && !steps.empty(), "{}: pre_tokenizer.pretokenizers must be a non-empty list", source);
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string path = fmt::format("pre_tokenizer.pretokenizers[{}]", i);
    const std::string step_type = component_type(steps[i], source, path);
    JsonFields fields(steps[i], source, path);
    const bool last = i + 1 == steps.size();
    if (step_type == "Split" && !last) {
      config.splits.push_back(read_split(fields));
    } else {
      HYLA_CHECK(step_type == "ByteLevel" && last, "{}: {} type '{}' is not supported here (hyla reads Split steps "
                 "followed by one ByteLevel)", source, path, step_type);
      read_byte_level(fields, config);
    }
  }
  return config;
}

void read_added_tokens(const json& list, const std::string& source, TokenizerSpec& spec) {
  if (list.is_null()) return;
  HYLA_CHECK(list.is_array(), "{}: added_tokens must be a list", source);
  for (size_t i = 0; i < list.size(); ++i) {
    JsonFields fields(list[i], source, fmt::format("added_tokens[{}]", i));
    AddedToken token;
    token.id = read_id(fields, "id", source);
    fields.read("content", token.content);
    fields.read("special", token.special);
    fields.read("single_word", token.single_word);
    fields.read("lstrip", token.lstrip);
    fields.read("rstrip", token.rstrip);
    fields.read("normalized", token.normalized);
    fields.finish();
    spec.added_tokens.push_back(std::move(token));
  }
}

// A null, absent or empty-string option; anything else changes encoding in a way hyla does not.
void require_unset(JsonFields& model, const std::string& key) {
  const json& v = model.raw(key);
  if (!(v.is_null() || (v.is_string() && v.get<std::string>().empty()) || (v.is_number() && v.get<double>() == 0)))
    model.fail_rule(fmt::format("{} = {} is not supported", model.path(key), json_excerpt(v)));
}

void read_model(JsonFields& model, const std::string& source, TokenizerSpec& spec) {
  std::string type;
  model.read("type", type);
  HYLA_CHECK(type == "BPE", "{}: model.type '{}' is not supported (hyla reads byte-level BPE)", source, type);
  require_unset(model, "dropout");
  require_unset(model, "continuing_subword_prefix");
  require_unset(model, "end_of_word_suffix");
  model.ignore("unk_token");  // never needed: every byte has a token
  model.ignore("fuse_unk");
  bool byte_fallback = false;
  model.read("byte_fallback", byte_fallback);
  HYLA_CHECK(!byte_fallback, "{}: model.byte_fallback = true is not supported (byte-level BPE needs no fallback)", source);
  model.read("ignore_merges", spec.ignore_merges);

  const json& vocab = model.raw("vocab");
  HYLA_CHECK(vocab.is_object() && !vocab.empty(), "{}: model.vocab must be a non-empty object of token -> id", source);
  std::unordered_map<std::string, int32_t> id_of;
  spec.vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    HYLA_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX,
               "{}: model.vocab['{}'] must be a token id, got {}", source, token, json_excerpt(id));
    std::optional<std::string> bytes = byte_level_decode(token);
    HYLA_CHECK(bytes.has_value(), "{}: model.vocab token '{}' has a character outside the byte-level alphabet",
               source, token);
    id_of.emplace(token, int32_t(id.get<int64_t>()));
    spec.vocab.emplace_back(int32_t(id.get<int64_t>()), std::move(*bytes));
  }

  const json& merges = model.raw("merges");
  HYLA_CHECK(merges.is_array() || merges.is_null(), "{}: model.merges must be a list", source);
  if (merges.is_null()) return;
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string left, right;
    if (m.is_string()) {
      const std::string text = m.get<std::string>();
      const size_t space = text.find(' ');
      HYLA_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos,
                 "{}: model.merges[{}] '{}' must be two tokens separated by one space", source, i, text);
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      HYLA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                 "{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", source, i, json_excerpt(m));
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    auto l = id_of.find(left), r = id_of.find(right);
    HYLA_CHECK(l != id_of.end() && r != id_of.end(), "{}: model.merges[{}] uses '{}', which is not in model.vocab",
               source, i, l == id_of.end() ? left : right);
    spec.merges.emplace_back(l->second, r->second);
  }
}

}  // namespace

TokenizerSpec parse_tokenizer_json(const json& root, const std::string& source) {
  JsonFields top(root, source);
  TokenizerSpec spec;
  top.ignore("version");
  top.ignore("truncation");      // batching options: hyla's callers choose their own lengths
  top.ignore("padding");
  top.ignore("post_processor");  // adds specials around encodings; hyla's callers add their own
  HYLA_CHECK(top.has("model"), "{}: model is missing", source);
  JsonFields model = top.object("model");
  read_model(model, source, spec);
  model.finish();
  read_added_tokens(top.raw("added_tokens"), source, spec);

  const json& normalizer = top.raw("normalizer");
  const std::string normalizer_type = component_type(normalizer, source, "normalizer");
  HYLA_CHECK(normalizer_type.empty() || normalizer_type == "NFC",
             "{}: normalizer type '{}' is not supported (hyla reads null or NFC)", source, normalizer_type);
  if (!normalizer_type.empty()) {
    JsonFields fields(normalizer, source, "normalizer");
    fields.ignore("type");
    fields.finish();
    spec.nfc_normalizer = true;
  }

  HYLA_CHECK(top.has("pre_tokenizer"), "{}: pre_tokenizer is missing", source);
  spec.pre_tokenizer = read_pre_tokenizer(top.raw("pre_tokenizer"), source);

  const std::string decoder = component_type(top.raw("decoder"), source, "decoder");
  HYLA_CHECK(decoder == "ByteLevel", "{}: decoder type '{}' is not supported (hyla reads ByteLevel)", source,
             decoder.empty() ? "null" : decoder);

  top.finish();
  return spec;
}

ordered_json tokenizer_json(const TokenizerSpec& spec) {
  ordered_json out;
  out["version"] = "1.0";
  out["truncation"] = nullptr;
  out["padding"] = nullptr;
  out["added_tokens"] = ordered_json::array();
  for (const AddedToken& t : spec.added_tokens)
    out["added_tokens"].push_back({{"id", t.id},
                                   {"content", t.content},
                                   {"single_word", t.single_word},
                                   {"lstrip", t.lstrip},
                                   {"rstrip", t.rstrip},
                                   {"normalized", t.normalized},
                                   {"special", t.special}});
  out["normalizer"] = spec.nfc_normalizer ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr);

  const PreTokenizerConfig& p = spec.pre_tokenizer;
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", p.add_prefix_space},
                                   {"trim_offsets", p.trim_offsets},
                                   {"use_regex", p.use_regex}};
  if (p.splits.empty()) {
    out["pre_tokenizer"] = byte_level;
  } else {
    ordered_json steps = ordered_json::array();
    for (const SplitRule& s : p.splits)
      steps.push_back({{"type", "Split"},
                       {"pattern", {{s.literal ? "String" : "Regex", s.pattern}}},
                       {"behavior", "Isolated"},
                       {"invert", false}});
    steps.push_back(byte_level);
    out["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", steps}};
  }
  out["post_processor"] = nullptr;
  out["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};

  std::vector<std::pair<int32_t, std::string>> vocab = spec.vocab;
  std::sort(vocab.begin(), vocab.end());
  std::unordered_map<int32_t, std::string> text_of;
  ordered_json vocab_json = ordered_json::object();
  // ordered_json's own insert searches linearly for the key (quadratic for a 150k vocab); the keys
  // are distinct, so append to the underlying vector directly.
  auto& entries = static_cast<std::vector<std::pair<const std::string, ordered_json>>&>(
      vocab_json.get_ref<ordered_json::object_t&>());
  entries.reserve(vocab.size());
  for (const auto& [id, bytes] : vocab) {
    std::string text = byte_level_encode(bytes);
    entries.emplace_back(text, id);
    text_of.emplace(id, std::move(text));
  }
  ordered_json merges = ordered_json::array();
  for (const auto& [left, right] : spec.merges) merges.push_back(text_of.at(left) + " " + text_of.at(right));
  out["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", spec.ignore_merges},
                  {"vocab", std::move(vocab_json)},
                  {"merges", std::move(merges)}};
  return out;
}

}  // namespace hyla
