#include "hyla/infer/json_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"

namespace hyla {

using json = nlohmann::json;
using Rule = Grammar::Rule;
using Sequence = Grammar::Sequence;

namespace {

constexpr int64_t kMaxCount = 10000;  // largest minItems/maxItems/minLength/maxLength followed

std::bitset<256> byte_range(int lo, int hi) {
  std::bitset<256> set;
  for (int b = lo; b <= hi; ++b) set.set(size_t(b));
  return set;
}

class JsonGrammarBuilder {
 public:
  // `strict`: a keyword outside the subset is an Error; otherwise it is not enforced.
  JsonGrammarBuilder(Grammar& grammar, const json* root, bool strict) : g_(grammar), root_(root), strict_(strict) {}

  Rule value() {
    if (value_ >= 0) return value_;
    value_ = g_.add_rule();
    for (const Rule r : {object(), array(), string(0, -1), number(), boolean()}) g_.add_alternative(value_, {Grammar::ref(r)});
    g_.add_alternative(value_, g_.literal("null"));
    return value_;
  }

  // Any object (every value any JSON value). Each of value, object and array registers its rule
  // before referring to the others, so the mutual recursion ends.
  Rule object() {
    if (object_ >= 0) return object_;
    object_ = g_.add_rule();
    define_free_object(object_, value());
    return object_;
  }

  Rule array() {
    if (array_ >= 0) return array_;
    array_ = g_.add_rule();
    define_array(array_, value(), 0, -1);
    return array_;
  }

  Rule string(int64_t min, int64_t max) {
    const auto key = std::make_pair(min, max);
    if (const auto it = strings_.find(key); it != strings_.end()) return it->second;
    const Rule r = g_.add_rule();
    Sequence s = {g_.byte('"'), Grammar::ref(g_.repeat(Grammar::ref(character()), min, max)), g_.byte('"')};
    g_.add_alternative(r, s);
    strings_[key] = r;
    return r;
  }

  Rule integer() {
    if (integer_ >= 0) return integer_;
    integer_ = g_.add_rule();
    const Rule magnitude = g_.add_rule();
    g_.add_alternative(magnitude, g_.literal("0"));
    g_.add_alternative(magnitude, {g_.bytes(byte_range('1', '9')), Grammar::ref(g_.repeat(digit(), 0, 15))});
    g_.add_alternative(integer_, {Grammar::ref(g_.optional(g_.literal("-"))), Grammar::ref(magnitude)});
    return integer_;
  }

  Rule number() {
    if (number_ >= 0) return number_;
    number_ = g_.add_rule();
    const Rule fraction = g_.optional({g_.byte('.'), Grammar::ref(g_.repeat(digit(), 1, 16))});
    std::bitset<256> e, sign;
    e.set('e');
    e.set('E');
    sign.set('+');
    sign.set('-');
    const Rule exponent =
        g_.optional({g_.bytes(e), Grammar::ref(g_.optional({g_.bytes(sign)})), Grammar::ref(g_.repeat(digit(), 1, 2))});
    g_.add_alternative(number_, {Grammar::ref(integer()), Grammar::ref(fraction), Grammar::ref(exponent)});
    return number_;
  }

  Rule boolean() {
    if (boolean_ >= 0) return boolean_;
    boolean_ = g_.add_rule();
    g_.add_alternative(boolean_, g_.literal("true"));
    g_.add_alternative(boolean_, g_.literal("false"));
    return boolean_;
  }

  Rule schema(const json& s, const std::string& where) {
    if (s.is_boolean()) {
      HYLA_CHECK(s.get<bool>(), "{}: the schema false admits no value", where);
      return value();
    }
    HYLA_CHECK(s.is_object(), "{} must be a JSON Schema (an object or a boolean), got {}", where, json_excerpt(s));
    if (strict_) check_keywords(s, where);
    if (const auto it = s.find("$ref"); it != s.end()) return reference(*it, where);
    const Rule r = g_.add_rule();
    if (const auto it = s.find("const"); it != s.end()) {
      g_.add_alternative(r, g_.literal(it->dump()));
      return r;
    }
    if (const auto it = s.find("enum"); it != s.end()) {
      HYLA_CHECK(it->is_array() && !it->empty(), "{}.enum must be a non-empty array", where);
      for (const json& v : *it) g_.add_alternative(r, g_.literal(v.dump()));
      return r;
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      const auto it = s.find(key);
      if (it == s.end()) continue;
      HYLA_CHECK(it->is_array() && !it->empty(), "{}.{} must be a non-empty array of schemas", where, key);
      HYLA_CHECK(std::string(key) != "allOf" || it->size() == 1,
                 "{}.allOf with {} schemas is not supported by constrained sampling (only one)", where, it->size());
      for (size_t i = 0; i < it->size(); ++i)
        g_.add_alternative(r, {Grammar::ref(schema((*it)[i], fmt::format("{}.{}[{}]", where, key, i)))});
      return r;
    }
    for (const std::string& type : types(s, where)) g_.add_alternative(r, {Grammar::ref(typed(type, s, where))});
    return r;
  }

 private:
  Grammar::Symbol digit() { return g_.bytes(byte_range('0', '9')); }
  Grammar::Symbol space() {
    if (space_ < 0) space_ = g_.optional(g_.literal(" "));
    return Grammar::ref(space_);
  }

  // One character of a JSON string: unescaped (not '"', '\\' or a control byte), an escape, or a
  // whole UTF-8 sequence, so lengths count characters as JSON Schema does.
  Rule character() {
    if (character_ >= 0) return character_;
    character_ = g_.add_rule();
    std::bitset<256> plain = byte_range(0x20, 0x7f);
    plain.reset('"');
    plain.reset('\\');
    g_.add_alternative(character_, {g_.bytes(plain)});
    std::bitset<256> escaped;
    for (const char c : std::string_view("\"\\/bfnrt")) escaped.set(uint8_t(c));
    g_.add_alternative(character_, {g_.byte('\\'), g_.bytes(escaped)});
    std::bitset<256> hex = byte_range('0', '9') | byte_range('a', 'f') | byte_range('A', 'F');
    g_.add_alternative(character_, {g_.byte('\\'), g_.byte('u'), g_.bytes(hex), g_.bytes(hex), g_.bytes(hex), g_.bytes(hex)});
    add_multibyte_utf8(character_);
    return character_;
  }

 public:
  // One character of raw text (Kimi K3's string arguments): any but NUL, whole UTF-8 sequences.
  Rule text_character() {
    if (text_character_ >= 0) return text_character_;
    text_character_ = g_.add_rule();
    g_.add_alternative(text_character_, {g_.bytes(byte_range(0x01, 0x7f))});
    add_multibyte_utf8(text_character_);
    return text_character_;
  }

 private:
  void add_multibyte_utf8(Rule r) {
    // Well-formed UTF-8 only (RFC 3629 table 3-7): no overlong forms, surrogates or code points past U+10FFFF.
    const auto range = [&](int lo, int hi) { return g_.bytes(byte_range(lo, hi)); };
    const Grammar::Symbol tail = range(0x80, 0xbf);
    for (const Grammar::Sequence& sequence : std::initializer_list<Grammar::Sequence>{
             {range(0xc2, 0xdf), tail},
             {range(0xe0, 0xe0), range(0xa0, 0xbf), tail},
             {range(0xe1, 0xec), tail, tail},
             {range(0xed, 0xed), range(0x80, 0x9f), tail},
             {range(0xee, 0xef), tail, tail},
             {range(0xf0, 0xf0), range(0x90, 0xbf), tail, tail},
             {range(0xf1, 0xf3), tail, tail, tail},
             {range(0xf4, 0xf4), range(0x80, 0x8f), tail, tail}})
      g_.add_alternative(r, sequence);
  }

  // {"key": value, ...} with any keys, `values` for every value.
  void define_free_object(Rule r, Rule values) {
    const Rule member = g_.add_rule();
    g_.add_alternative(member, {Grammar::ref(string(0, -1)), g_.byte(':'), space(), Grammar::ref(values)});
    const Rule more = g_.add_rule();
    g_.add_alternative(more, {g_.byte(','), space(), Grammar::ref(member)});
    g_.add_alternative(r, g_.literal("{}"));
    g_.add_alternative(r, {g_.byte('{'), Grammar::ref(member), Grammar::ref(g_.repeat(Grammar::ref(more), 0, -1)), g_.byte('}')});
  }

  void define_array(Rule r, Rule items, int64_t min, int64_t max) {
    if (min == 0) g_.add_alternative(r, g_.literal("[]"));
    if (max == 0) return;
    const Rule more = g_.add_rule();
    g_.add_alternative(more, {g_.byte(','), space(), Grammar::ref(items)});
    const Rule rest = g_.repeat(Grammar::ref(more), std::max<int64_t>(min - 1, 0), max < 0 ? -1 : max - 1);
    g_.add_alternative(r, {g_.byte('['), Grammar::ref(items), Grammar::ref(rest), g_.byte(']')});
  }

  static void check_keywords(const json& s, const std::string& where) {
    static const std::set<std::string> understood = {
        "type",     "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
        "maxLength", "enum",      "const",    "anyOf",                "oneOf", "allOf",    "$ref",     "$defs",
        "definitions", "title",   "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
        "readOnly", "writeOnly"};
    for (const auto& [key, v] : s.items())
      HYLA_CHECK(understood.count(key),
                 "{}: the JSON Schema keyword '{}' is not supported by constrained sampling (supported: type, properties, "
                 "required, additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, "
                 "oneOf, allOf of one, $ref/$defs)",
                 where, key);
  }

  static int64_t count(const json& s, const char* key, int64_t fallback, const std::string& where) {
    const auto it = s.find(key);
    if (it == s.end()) return fallback;
    HYLA_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() <= kMaxCount,
               "{}.{} must be an integer in [0, {}], got {}", where, key, kMaxCount, json_excerpt(*it));
    return it->get<int64_t>();
  }

  static std::vector<std::string> types(const json& s, const std::string& where) {
    const auto it = s.find("type");
    if (it == s.end()) {
      for (const char* key : {"properties", "required", "additionalProperties"})
        if (s.contains(key)) return {"object"};
      for (const char* key : {"items", "minItems", "maxItems"})
        if (s.contains(key)) return {"array"};
      for (const char* key : {"minLength", "maxLength"})
        if (s.contains(key)) return {"string"};
      return {"any"};
    }
    std::vector<std::string> names;
    if (it->is_string()) names.push_back(it->get<std::string>());
    else if (it->is_array() && !it->empty())
      for (const json& t : *it) names.push_back(t.is_string() ? t.get<std::string>() : "?");
    static const std::set<std::string> known = {"object", "array", "string", "number", "integer", "boolean", "null"};
    for (const std::string& t : names)
      HYLA_CHECK(known.count(t), "{}.type must be object, array, string, number, integer, boolean, null or a list of them, got {}",
                 where, json_excerpt(*it));
    HYLA_CHECK(!names.empty(), "{}.type must not be empty", where);
    return names;
  }

  Rule typed(const std::string& type, const json& s, const std::string& where) {
    if (type == "any") return value();
    if (type == "string") {
      const int64_t min = count(s, "minLength", 0, where), max = count(s, "maxLength", -1, where);
      HYLA_CHECK(max < 0 || max >= min, "{}: maxLength {} is below minLength {}", where, max, min);
      return string(min, max);
    }
    if (type == "number") return number();
    if (type == "integer") return integer();
    if (type == "boolean") return boolean();
    if (type == "null") {
      const Rule r = g_.add_rule();
      g_.add_alternative(r, g_.literal("null"));
      return r;
    }
    if (type == "array") {
      const int64_t min = count(s, "minItems", 0, where), max = count(s, "maxItems", -1, where);
      HYLA_CHECK(max < 0 || max >= min, "{}: maxItems {} is below minItems {}", where, max, min);
      const auto items = s.find("items");
      const Rule item = items == s.end() ? value() : schema(*items, where + ".items");
      const Rule r = g_.add_rule();
      define_array(r, item, min, max);
      return r;
    }
    return typed_object(s, where);
  }

  Rule typed_object(const json& s, const std::string& where) {
    std::map<std::string, const json*> properties;
    static const json anything = true;
    if (const auto it = s.find("properties"); it != s.end()) {
      HYLA_CHECK(it->is_object(), "{}.properties must be an object", where);
      for (const auto& [name, sub] : it->items()) properties[name] = &sub;
    }
    std::set<std::string> required;
    if (const auto it = s.find("required"); it != s.end()) {
      HYLA_CHECK(it->is_array(), "{}.required must be an array of names", where);
      for (const json& name : *it) {
        HYLA_CHECK(name.is_string(), "{}.required must be an array of names, got {}", where, json_excerpt(name));
        required.insert(name.get<std::string>());
        properties.emplace(name.get<std::string>(), &anything);
      }
    }
    const Rule r = g_.add_rule();
    if (properties.empty()) {
      const auto extra = s.find("additionalProperties");
      if (extra != s.end() && extra->is_boolean() && !extra->get<bool>()) g_.add_alternative(r, g_.literal("{}"));
      else if (extra == s.end() || extra->is_boolean()) g_.add_alternative(r, {Grammar::ref(object())});
      else define_free_object(r, schema(*extra, where + ".additionalProperties"));
      return r;
    }
    // first[i]: properties i.. with none written yet; rest[i]: the same after one (so each starts with ",").
    const size_t n = properties.size();
    std::vector<Rule> first(n + 1), rest(n + 1);
    first[n] = g_.add_rule();
    rest[n] = first[n];
    g_.add_alternative(first[n], {});
    auto it = properties.rbegin();
    for (size_t i = n; i-- > 0; ++it) {
      const std::string& name = it->first;
      const Rule member = g_.add_rule();
      Sequence kv = g_.literal(json(name).dump() + ":");
      kv.push_back(space());
      kv.push_back(Grammar::ref(schema(*it->second, where + ".properties." + name)));
      g_.add_alternative(member, kv);
      const bool optional = !required.count(name);
      rest[i] = g_.add_rule();
      g_.add_alternative(rest[i], {g_.byte(','), space(), Grammar::ref(member), Grammar::ref(rest[i + 1])});
      if (optional) g_.add_alternative(rest[i], {Grammar::ref(rest[i + 1])});
      first[i] = g_.add_rule();
      g_.add_alternative(first[i], {Grammar::ref(member), Grammar::ref(rest[i + 1])});
      if (optional) g_.add_alternative(first[i], {Grammar::ref(first[i + 1])});
    }
    g_.add_alternative(r, {g_.byte('{'), Grammar::ref(first[0]), g_.byte('}')});
    return r;
  }

  Rule reference(const json& ref, const std::string& where) {
    HYLA_CHECK(ref.is_string(), "{}.$ref must be a string", where);
    const std::string target = ref.get<std::string>();
    if (const auto it = refs_.find(target); it != refs_.end()) return it->second;
    const json* resolved = nullptr;
    if (target == "#") {
      resolved = root_;
    } else {
      for (const char* section : {"#/$defs/", "#/definitions/"}) {
        const std::string prefix = section;
        if (target.rfind(prefix, 0) != 0 || !root_->is_object()) continue;
        const auto defs = root_->find(prefix.substr(2, prefix.size() - 3));
        if (defs != root_->end() && defs->is_object() && defs->contains(target.substr(prefix.size())))
          resolved = &(*defs)[target.substr(prefix.size())];
      }
    }
    HYLA_CHECK(resolved, "{}.$ref '{}' does not name the root ('#') or an entry of #/$defs or #/definitions", where, target);
    // Registered before it is built, so a recursive schema refers back to it.
    const Rule r = g_.add_rule();
    refs_[target] = r;
    g_.add_alternative(r, {Grammar::ref(schema(*resolved, target))});
    return r;
  }

  Grammar& g_;
  const json* root_;
  bool strict_;
  Rule value_ = -1, object_ = -1, array_ = -1, integer_ = -1, number_ = -1, boolean_ = -1, space_ = -1, character_ = -1,
       text_character_ = -1;
  std::map<std::pair<int64_t, int64_t>, Rule> strings_;
  std::map<std::string, Rule> refs_;
};

}  // namespace

std::shared_ptr<const Grammar> json_object_grammar() {
  auto grammar = std::make_shared<Grammar>();
  const Rule start = grammar->add_rule();
  JsonGrammarBuilder builder(*grammar, nullptr, true);
  grammar->add_alternative(start, {Grammar::ref(builder.object())});
  return grammar;
}

std::shared_ptr<const Grammar> json_schema_grammar(const json& schema, const std::string& where) {
  auto grammar = std::make_shared<Grammar>();
  const Rule start = grammar->add_rule();
  JsonGrammarBuilder builder(*grammar, &schema, true);
  grammar->add_alternative(start, {Grammar::ref(builder.schema(schema, where))});
  return grammar;
}

namespace {

// One alternative per tool: the text `call` writes around the rule of that tool's arguments (its
// parameters schema; any object when it has none).
using CallText = std::function<Sequence(Grammar&, const ToolSchema&, Rule arguments)>;
std::shared_ptr<const Grammar> call_grammar(const std::vector<ToolSchema>& tools, const CallText& call) {
  auto grammar = std::make_shared<Grammar>();
  const Rule start = grammar->add_rule();
  JsonGrammarBuilder builder(*grammar, nullptr, false);
  for (const ToolSchema& tool : tools) {
    JsonGrammarBuilder arguments(*grammar, &tool.parameters, false);
    const Rule args = tool.parameters.is_null()
                          ? builder.object()
                          : arguments.schema(tool.parameters, fmt::format("the parameters of tool '{}'", tool.name));
    grammar->add_alternative(start, call(*grammar, tool, args));
  }
  return grammar;
}

void append(Sequence& to, const Sequence& more) { to.insert(to.end(), more.begin(), more.end()); }

}  // namespace

std::shared_ptr<const Grammar> tool_call_grammar(const std::vector<ToolSchema>& tools, ToolCallFrom from,
                                                 int32_t call_close_token) {
  HYLA_ASSERT(!tools.empty() && (from != ToolCallFrom::Arguments || tools.size() == 1));
  return call_grammar(tools, [&](Grammar& g, const ToolSchema& tool, Rule args) {
    Sequence call;
    if (from == ToolCallFrom::Marker) append(call, g.literal("\n"));
    if (from != ToolCallFrom::Arguments) append(call, g.literal("{\"name\": " + json(tool.name).dump() + ", \"arguments\": "));
    call.push_back(Grammar::ref(args));
    append(call, g.literal("}\n"));
    call.push_back(Grammar::special(call_close_token));
    return call;
  });
}

std::shared_ptr<const Grammar> kimi_k2_call_grammar(const std::vector<ToolSchema>& tools, bool named, size_t call_index,
                                                    KimiK2CallMarkers markers) {
  HYLA_ASSERT(!tools.empty() && (!named || tools.size() == 1));
  return call_grammar(tools, [&](Grammar& g, const ToolSchema& tool, Rule args) {
    Sequence call;
    if (!named) {
      append(call, g.literal(fmt::format("functions.{}:{}", tool.name, call_index)));
      call.push_back(Grammar::special(markers.argument_begin));
    }
    call.push_back(Grammar::ref(args));
    call.push_back(Grammar::special(markers.call_end));
    return call;
  });
}

namespace {

// A Kimi K3 tag's attribute value as its renderer writes it.
std::string k3_attribute(std::string_view value) {
  std::string out;
  for (const char c : value) out += c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  return out;
}

const char* k3_type(const json& value) {
  if (value.is_boolean()) return "boolean";
  if (value.is_null()) return "null";
  if (value.is_number()) return "number";
  if (value.is_string()) return "string";
  return value.is_object() ? "object" : "array";
}

// Kimi K3's call text around the grammar's rules: tags are <|open|>NAME ATTRIBUTES<|sep|> …
// <|close|>NAME<|sep|>, their names and attributes plain text.
struct K3Writer {
  Grammar& g;
  KimiK3Markers m;
  Sequence open(std::string_view text) {
    Sequence s = {Grammar::special(m.open)};
    append(s, g.literal(text));
    s.push_back(Grammar::special(m.sep));
    return s;
  }
  Sequence close(std::string_view name) {
    Sequence s = {Grammar::special(m.close)};
    append(s, g.literal(name));
    s.push_back(Grammar::special(m.sep));
    return s;
  }
  // One argument tag of `key`: its type attribute and value as the schema allows (the renderer
  // writes a string's raw text and any other value's JSON).
  Rule argument(JsonGrammarBuilder& builder, const std::string& key, const json& schema, const std::string& where) {
    const Rule r = g.add_rule();
    const std::string head = "argument key=\"" + k3_attribute(key) + "\" type=\"";
    const auto add = [&](std::string_view type, const Sequence& value) {
      Sequence s = open(head + std::string(type) + "\"");
      append(s, value);
      append(s, close("argument"));
      g.add_alternative(r, s);
    };
    const auto literal_value = [&](const json& v) { return g.literal(v.is_string() ? v.get<std::string>() : v.dump()); };
    if (schema.is_object() && schema.contains("const")) {
      add(k3_type(schema["const"]), literal_value(schema["const"]));
      return r;
    }
    if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
      for (const json& v : schema["enum"]) add(k3_type(v), literal_value(v));
      return r;
    }
    const json* type = schema.is_object() && schema.contains("type") ? &schema["type"] : nullptr;
    if (type && *type == "string") {
      const int64_t min = std::clamp<int64_t>(schema.value("minLength", int64_t(0)), 0, kMaxCount);
      const int64_t max = schema.contains("maxLength") ? std::clamp<int64_t>(schema.value("maxLength", int64_t(0)), min, kMaxCount) : -1;
      add("string", {Grammar::ref(g.repeat(Grammar::ref(builder.text_character()), min, max))});
      return r;
    }
    const Sequence value = {Grammar::ref(builder.schema(schema, where))};
    if (type && type->is_string()) {
      add(*type == "integer" ? "number" : type->get<std::string>(), value);
      return r;
    }
    // Several types, or none said: the value as JSON under a type that makes the reader parse it.
    for (const char* t : {"object", "array", "number", "boolean", "null"}) add(t, value);
    return r;
  }
};

}  // namespace

std::shared_ptr<const Grammar> kimi_k3_call_grammar(const std::vector<ToolSchema>& tools, bool thinking, bool one_call,
                                                    KimiK3Markers markers) {
  HYLA_ASSERT(!tools.empty());
  auto grammar = std::make_shared<Grammar>();
  Grammar& g = *grammar;
  const Rule start = g.add_rule();
  K3Writer w{g, markers};
  const Rule call = g.add_rule();
  for (const ToolSchema& tool : tools) {
    const std::string where = fmt::format("the parameters of tool '{}'", tool.name);
    JsonGrammarBuilder builder(g, &tool.parameters, false);
    Sequence s = w.open("call tool=\"" + k3_attribute(tool.name) + "\" index=\"");
    s.pop_back();  // the index's digits come before the separator
    s.push_back(g.bytes(byte_range('1', '9')));
    s.push_back(Grammar::ref(g.repeat(g.bytes(byte_range('0', '9')), 0, 2)));
    append(s, g.literal("\""));
    s.push_back(Grammar::special(markers.sep));
    const json& p = tool.parameters;
    if (p.is_object() && p.contains("properties") && p["properties"].is_object() && !p.contains("$ref") &&
        !p.contains("anyOf") && !p.contains("oneOf") && !p.contains("allOf")) {
      // One tag per property in the order of their names, required ones always (the renderer's
      // tags; a parsed JSON object keeps no order).
      std::set<std::string> required;
      if (p.contains("required") && p["required"].is_array())
        for (const json& k : p["required"])
          if (k.is_string()) required.insert(k.get<std::string>());
      for (const auto& [key, schema] : p["properties"].items()) {
        const Rule tag = w.argument(builder, key, schema, where + ".properties." + key);
        s.push_back(Grammar::ref(required.count(key) ? tag : g.optional({Grammar::ref(tag)})));
      }
    } else {  // any object, or a schema the tags cannot spell: the renderer's JSON block
      const Rule object = p.is_null() ? builder.object() : builder.schema(p, where);
      Sequence block = w.open("json type=\"object\"");
      block.push_back(Grammar::ref(object));
      append(block, w.close("json"));
      s.push_back(Grammar::ref(g.optional(block)));
    }
    append(s, w.close("call"));
    g.add_alternative(call, s);
  }
  Sequence reply;
  if (thinking) {  // the think channel's text is free (ordinary tokens), then the channel closes
    reply.push_back(Grammar::ref(g.repeat(g.bytes(byte_range(0x00, 0xff)), 0, -1)));
    append(reply, w.close("think"));
    append(reply, w.open("response"));
  }
  append(reply, w.close("response"));  // an empty response: the reply is the call
  append(reply, w.open("tools"));
  reply.push_back(Grammar::ref(call));
  if (!one_call) reply.push_back(Grammar::ref(g.repeat(Grammar::ref(call), 0, -1)));
  append(reply, w.close("tools"));
  append(reply, w.close("message"));
  g.add_alternative(start, reply);
  return grammar;
}

}  // namespace hyla
