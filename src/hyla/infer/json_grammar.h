#pragma once
// Grammars (grammar.h) for JSON output: any object (response_format json_object), the instances
// of a JSON Schema (json_schema), and one well-formed tool call in SPEC §8's format (a named or
// required tool_choice, or a call the model starts under "auto"). The JSON is compact, with at
// most one space after ':' and ','.
//
// The schema subset: type (one or a list), properties, required, additionalProperties, items,
// minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf (read as anyOf), allOf of
// one schema, $ref to the root or into #/$defs or #/definitions; annotations (title, description,
// default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. Any other
// keyword (pattern, format, minimum, multipleOf, ...) is refused with an Error naming it and where it is,
// rather than silently not enforced — except in tool parameters, where such keywords are common
// (format, minimum, ...) and were never a promise of the request: a call is guaranteed its
// structure (types, properties, required, enums), and keywords outside the subset are not
// enforced there. Properties come out in the order of their names (a parsed
// JSON object keeps no order), required ones always, others when the model chooses to; no
// undeclared property is ever generated. Digits are bounded (16 before the point, 16 after, 2 in
// the exponent: every number fits a double) and so is nesting (grammar.h), so a weak model still
// ends its number.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/infer/grammar.h"

namespace hyla {

std::shared_ptr<const Grammar> json_object_grammar();
// `where` names the schema in errors (e.g. "response_format.json_schema.schema").
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::json& schema, const std::string& where);

struct ToolSchema {
  std::string name;
  nlohmann::json parameters;  // a JSON Schema of the arguments object (null: any object)
};
// One call, from where the text before it ends, to the `</tool_call>` token that closes it.
enum class ToolCallFrom {
  Arguments,  // `<tool_call>\n{"name": "…", "arguments": ` is written (a named tool_choice): one tool
  Object,     // `<tool_call>\n` is written (tool_choice "required")
  Marker,     // the model has just written the `<tool_call>` token (tool_choice "auto")
};
std::shared_ptr<const Grammar> tool_call_grammar(const std::vector<ToolSchema>& tools, ToolCallFrom from,
                                                 int32_t call_close_token);

// Kimi K2's call: `functions.NAME:INDEX`, its argument marker, the arguments the tool's schema
// allows and its end marker, from just after the call's begin marker (tool_choice "required", or
// "auto" once the model writes that marker); `named`: the argument marker is written already (a
// named tool_choice, one tool), so the arguments and the end marker.
struct KimiK2CallMarkers {
  int32_t argument_begin = -1, call_end = -1;
};
std::shared_ptr<const Grammar> kimi_k2_call_grammar(const std::vector<ToolSchema>& tools, bool named, size_t call_index,
                                                    KimiK2CallMarkers markers);

// Kimi K3's forced reply: the tools section with one call (a named tool_choice) or more
// ("required"), then the message's close. Each call is `<|open|>call tool="NAME" index="N"<|sep|>`,
// one argument tag per property of the tool's schema in the order of their names (required ones
// always; a string's raw text, any other value's JSON, with its type attribute) or, for a schema
// without properties, one JSON block, then `<|close|>call<|sep|>`. From where the generation prompt
// leaves the reply: in the think channel when `thinking` (its text free, ordinary tokens only, until
// the model closes it), then an empty response channel; else in the response channel, closed empty.
struct KimiK3Markers {
  int32_t open = -1, sep = -1, close = -1;
};
std::shared_ptr<const Grammar> kimi_k3_call_grammar(const std::vector<ToolSchema>& tools, bool thinking, bool one_call,
                                                    KimiK3Markers markers);

}  // namespace hyla
