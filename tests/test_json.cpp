// parse_json: the one reader of outside JSON. Nesting is bounded (copying, comparing and printing
// a value recurse once per level), duplicate keys are refused, and messages name the source.
#include <gtest/gtest.h>

#include "hyla/io/json_fields.h"

namespace hyla {
namespace {

std::string parse_error(const std::string& text) {
  try {
    parse_json(text, "doc.json");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted " << text.substr(0, 80);
  return {};
}

std::string nested(const char* open, const char* close, int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(ParseJson, NestingIsBoundedWithoutRecursingThroughTheDocument) {
  EXPECT_NO_THROW(parse_json(nested("[", "]", kMaxJsonDepth), "doc.json"));
  EXPECT_NE(parse_error(nested("[", "]", kMaxJsonDepth + 1)).find("doc.json: JSON nested deeper than 64 levels"),
            std::string::npos);
  // A request-sized attack: 100k levels of arrays, and of objects, inside a valid document.
  EXPECT_NE(parse_error("{\"prompt\": [1, " + nested("[", "]", 100000) + "]}").find("nested deeper"), std::string::npos);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(100000, '}');
  EXPECT_NE(parse_error(objects).find("nested deeper"), std::string::npos);
}

TEST(ParseJson, DuplicateKeysAndBadTextAreErrorsNamingTheSource) {
  EXPECT_NE(parse_error(R"({"a": 1, "b": {"c": 1, "c": 2}})").find("doc.json: duplicate key 'c'"), std::string::npos);
  EXPECT_NO_THROW(parse_json(R"({"a": {"c": 1}, "b": {"c": 2}})", "doc.json"));  // same key, other objects
  EXPECT_NE(parse_error("{\"a\": ").find("doc.json: not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error("1e99999").find("not valid JSON"), std::string::npos);
  // The parser's words, not its exception's name: where, and what it met.
  EXPECT_EQ(parse_error("not json"), "doc.json: not valid JSON at line 1, column 2: syntax error while parsing value - "
                                     "invalid literal; last read: 'no'");
  EXPECT_EQ(parse_error("1e99999").find("json.exception"), std::string::npos) << parse_error("1e99999");
}

TEST(ParseJson, ExcerptsAreShort) {
  EXPECT_EQ(json_excerpt(nlohmann::json(5)), "5");
  const std::string long_text = json_excerpt(nlohmann::json(std::string(1000, 'x')));
  EXPECT_EQ(long_text.size(), 60u);
  EXPECT_EQ(long_text.substr(57), "...");
}

}  // namespace
}  // namespace hyla
