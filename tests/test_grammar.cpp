// Grammar-constrained sampling: the matcher against hand-checked texts, the allowed-token mask
// against checking every token on its own, and JSON Schema grammars against a plain validator over
// random walks (every completed walk must parse and validate).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hyla/core/error.h"
#include "hyla/core/random.h"
#include "hyla/infer/grammar.h"
#include "hyla/infer/json_grammar.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using json = nlohmann::json;

bool accepts(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

TEST(Grammar, MatcherFollowsAlternativesAndBoundedRepetition) {
  Grammar g;
  const Grammar::Rule start = g.add_rule();
  g.add_alternative(start, g.literal("ab"));
  Grammar::Sequence a_cs_d = g.literal("a");
  a_cs_d.push_back(Grammar::ref(g.repeat(g.byte('c'), 1, 3)));
  a_cs_d.push_back(g.byte('d'));
  g.add_alternative(start, a_cs_d);
  EXPECT_TRUE(accepts(g, "ab"));
  EXPECT_TRUE(accepts(g, "acd"));
  EXPECT_TRUE(accepts(g, "acccd"));
  EXPECT_FALSE(accepts(g, "ad"));     // fewer than one c
  EXPECT_FALSE(accepts(g, "accccd"));  // more than three
  EXPECT_FALSE(accepts(g, "abc"));
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_bytes("ac"));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.can_continue());
  EXPECT_FALSE(m.accept_bytes("x"));  // refused: the state is unchanged
  EXPECT_TRUE(m.accept_bytes("cd"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.can_continue());
}

TEST(Grammar, LongRepetitionDoesNotDeepenTheStack) {
  Grammar g;
  const Grammar::Rule start = g.add_rule();
  g.add_alternative(start, {g.byte('['), Grammar::ref(g.repeat(g.byte('x'), 0, -1)), g.byte(']')});
  EXPECT_TRUE(accepts(g, "[" + std::string(5000, 'x') + "]"));
}

TEST(Grammar, SpecialTokensMatchOnlyTheirOwnSymbol) {
  Grammar g;
  const Grammar::Rule start = g.add_rule();
  Grammar::Sequence s = g.literal("x");
  s.push_back(Grammar::special(7));
  g.add_alternative(start, s);
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_bytes("x"));
  EXPECT_FALSE(m.accept_special(8));
  EXPECT_FALSE(m.accept_bytes("<"));
  EXPECT_TRUE(m.accept_special(7));
  EXPECT_TRUE(m.can_end());
}

TEST(JsonGrammar, AcceptsInstancesAndRefusesOthers) {
  const json schema = json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
      "ok": {"type": ["boolean", "null"]}}, "required": ["name", "age"]})");
  const auto g = json_schema_grammar(schema, "schema");
  // Properties in name order: age, name, ok, tags.
  EXPECT_TRUE(accepts(*g, R"({"age": 3, "name": "Bob"})"));
  EXPECT_TRUE(accepts(*g, R"({"age":-12,"name":"é\u00e9\"","ok":null,"tags":["a", "b"]})"));
  EXPECT_TRUE(accepts(*g, R"({"age": 0, "name": "", "tags": []})"));
  EXPECT_FALSE(accepts(*g, R"({"name": "Bob"})"));                     // age is required
  EXPECT_FALSE(accepts(*g, R"({"age": 3, "name": "Bobbie"})"));        // longer than 5
  EXPECT_FALSE(accepts(*g, R"({"age": 3.5, "name": "B"})"));           // not an integer
  EXPECT_FALSE(accepts(*g, R"({"age": 03, "name": "B"})"));            // no leading zeros
  EXPECT_FALSE(accepts(*g, R"({"age": 3, "name": "B", "x": 1})"));     // undeclared
  EXPECT_FALSE(accepts(*g, R"({"age": 3, "name": "B", "tags": ["c"]})"));
  EXPECT_FALSE(accepts(*g, R"({"age": 3, "name": "B", "tags": ["a","a","a"]})"));
  EXPECT_FALSE(accepts(*g, R"({"age": 3,  "name": "B"})"));            // two spaces
  const auto any = json_object_grammar();
  EXPECT_TRUE(accepts(*any, R"({"a": [1, 2.5e-3, {"b": null}], "c": "\n"})"));
  EXPECT_FALSE(accepts(*any, R"([1])"));
  EXPECT_FALSE(accepts(*any, R"({"a": tru})"));
}

TEST(JsonGrammar, RefsAndRecursion) {
  const json schema = json::parse(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
      "$ref": "#/$defs/node"})");
  const auto g = json_schema_grammar(schema, "schema");
  EXPECT_TRUE(accepts(*g, R"({"next": {"next": null, "v": 2}, "v": 1})"));
  EXPECT_FALSE(accepts(*g, R"({"next": {"next": 1, "v": 2}, "v": 1})"));
}

TEST(JsonGrammar, UnsupportedKeywordsAreRefusedByNameAndPlace) {
  const auto message = [](const std::string& schema) {
    try {
      json_schema_grammar(json::parse(schema), "response_format.json_schema.schema");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string pattern = message(R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^a+$"}}})");
  EXPECT_NE(pattern.find("'pattern'"), std::string::npos) << pattern;
  EXPECT_NE(pattern.find("response_format.json_schema.schema.properties.id"), std::string::npos) << pattern;
  EXPECT_NE(message(R"({"type": "strin"})").find("type must be"), std::string::npos);
  EXPECT_NE(message(R"({"$ref": "#/$defs/missing"})").find("missing"), std::string::npos);
  EXPECT_NE(message(R"({"type": "string", "maxLength": 2, "minLength": 3})").find("maxLength"), std::string::npos);
  EXPECT_NE(message("false").find("admits no value"), std::string::npos);
}

// Tool parameters commonly carry keywords outside the subset: the call's structure is still held.
TEST(JsonGrammar, ToolCallsKeepTheirStructureWhateverKeywordsTheParametersUse) {
  const json parameters = json::parse(R"({"type": "object", "properties": {"day": {"type": "string", "format": "date"},
      "n": {"type": "integer", "minimum": 1}}, "required": ["day"]})");
  const auto g = tool_call_grammar({{"plan", parameters}, {"other", json()}}, ToolCallFrom::Marker, 99);
  GrammarMatcher m(*g);
  EXPECT_TRUE(m.accept_bytes("\n{\"name\": \"plan\", \"arguments\": {\"day\": \"x\", \"n\": 0}}\n"));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_special(99));
  EXPECT_TRUE(m.can_end());
  GrammarMatcher wrong(*g);
  EXPECT_FALSE(wrong.accept_bytes("\n{\"name\": \"plan\", \"arguments\": {\"n\": 1}}"));  // day is required
  GrammarMatcher unknown(*g);
  EXPECT_FALSE(unknown.accept_bytes("\n{\"name\": \"plot\""));
}

// The mask is a trie walk over tokens sorted by bytes; the reference checks each token alone.
TEST(GrammarMatcher, MaskMatchesCheckingEveryTokenAlone) {
  const Tokenizer& tok = test::small_tokenizer();
  const GrammarVocabulary vocabulary(tok);
  const json schema = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
      "n": {"type": "number"}, "list": {"type": "array", "items": {"type": "boolean"}}}, "required": ["city"]})");
  const auto g = json_schema_grammar(schema, "schema");
  GrammarMatcher m(*g);
  Rng rng(5);
  std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
  for (int step = 0; step < 40 && m.can_continue(); ++step) {
    m.allowed(vocabulary, allowed.data());
    std::vector<int32_t> choices;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      GrammarMatcher alone = m;
      const bool takes = tok.is_special(id) ? alone.accept_special(id) : alone.accept_bytes(tok.decode_token(id));
      ASSERT_EQ(bool(allowed[size_t(id)]), takes) << "step " << step << " token " << id << " '" << tok.decode_token(id) << "'";
      if (takes) choices.push_back(id);
    }
    ASSERT_FALSE(choices.empty());
    const int32_t pick = choices[size_t(rng.below(choices.size()))];
    ASSERT_TRUE(m.accept_bytes(tok.decode_token(pick)));
  }
}

// A plain validator of the schema subset, for the random walks below.
bool valid(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return valid(v, ref == "#" ? root : root["$defs"][ref.substr(8)], root);
  }
  if (s.contains("const")) return v == s["const"];
  if (s.contains("enum")) return std::find(s["enum"].begin(), s["enum"].end(), v) != s["enum"].end();
  if (s.contains("anyOf")) {
    for (const json& alt : s["anyOf"])
      if (valid(v, alt, root)) return true;
    return false;
  }
  if (!s.contains("type")) return true;
  std::vector<std::string> types;
  if (s["type"].is_string()) types.push_back(s["type"]);
  else for (const json& t : s["type"]) types.push_back(t);
  for (const std::string& t : types) {
    if (t == "null" && v.is_null()) return true;
    if (t == "boolean" && v.is_boolean()) return true;
    if (t == "integer" && v.is_number_integer()) return true;
    if (t == "number" && v.is_number()) return true;
    if (t == "string" && v.is_string()) {
      const std::string text = v;
      int64_t chars = 0;
      for (const char c : text) chars += (uint8_t(c) & 0xc0) != 0x80;
      if (chars >= s.value("minLength", 0) && chars <= s.value("maxLength", INT64_MAX)) return true;
    }
    if (t == "array" && v.is_array() && int64_t(v.size()) >= s.value("minItems", 0) &&
        int64_t(v.size()) <= s.value("maxItems", INT64_MAX)) {
      bool all = true;
      for (const json& item : v) all = all && valid(item, s.value("items", json(true)), root);
      if (all) return true;
    }
    if (t == "object" && v.is_object()) {
      bool all = true;
      for (const json& name : s.value("required", json::array())) all = all && v.contains(name);
      for (const auto& [key, item] : v.items())
        all = all && s.contains("properties") && s["properties"].contains(key) && valid(item, s["properties"][key], root);
      if (all) return true;
    }
  }
  return false;
}

// Random walks (uniform over the allowed tokens, a model that knows nothing) end in valid instances.
TEST(JsonGrammar, RandomWalksOverATokenizerEndInValidInstances) {
  const Tokenizer& tok = test::small_tokenizer();
  const GrammarVocabulary vocabulary(tok);
  const std::vector<json> schemas = {
      json::parse(R"({"type": "object", "properties": {"mood": {"enum": ["happy", "sad", 3]}, "level": {"type": "integer"},
          "note": {"type": "string", "minLength": 2, "maxLength": 6}}, "required": ["mood", "level"]})"),
      json::parse(R"({"type": "array", "items": {"type": ["number", "boolean"]}, "minItems": 1, "maxItems": 4})"),
      json::parse(R"({"$defs": {"t": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"},
          "maxItems": 2}, "id": {"const": "x"}}, "required": ["id"]}}, "$ref": "#/$defs/t"})"),
  };
  std::vector<uint8_t> allowed(size_t(tok.vocab_size()));
  for (size_t k = 0; k < schemas.size(); ++k) {
    const auto g = json_schema_grammar(schemas[k], "schema");
    int completed = 0;
    for (uint64_t seed = 0; seed < 30; ++seed) {
      Rng rng(seed);
      GrammarMatcher m(*g);
      std::string text;
      // Stop where the grammar may end with probability 1/2, as an end token would.
      for (int step = 0; step < 300 && m.can_continue() && !(m.can_end() && rng.below(2) == 0); ++step) {
        m.allowed(vocabulary, allowed.data());
        std::vector<int32_t> choices;
        for (int32_t id = 0; id < tok.vocab_size(); ++id)
          if (allowed[size_t(id)]) choices.push_back(id);
        ASSERT_FALSE(choices.empty()) << text;
        const int32_t pick = choices[size_t(rng.below(choices.size()))];
        ASSERT_TRUE(m.accept_bytes(tok.decode_token(pick)));
        text += tok.decode_token(pick);
      }
      if (!m.can_end()) continue;  // ran out of steps in an unbounded part
      ++completed;
      json parsed;
      ASSERT_NO_THROW(parsed = json::parse(text)) << "schema " << k << ": " << text;
      EXPECT_TRUE(valid(parsed, schemas[k], schemas[k])) << "schema " << k << ": " << text;
    }
    EXPECT_GE(completed, 25) << "schema " << k;
  }
}

}  // namespace
}  // namespace hyla
