#pragma once
// Grammars (grammar.h) for JSON output: any object (response_format json_object), the instances
// of a JSON Schema (json_schema), and one well-formed tool call in SPEC §8's format (a named or
// required tool_choice). The JSON is compact, with at most one space after ':' and ','.
//
// The schema subset: type (one or a list), properties, required, additionalProperties, items,
// minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf (read as anyOf), allOf of
// one schema, $ref to the root or into #/$defs or #/definitions; annotations (title, description,
// default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are ignored. Any other
// keyword (pattern, format, minimum, multipleOf, ...) is refused with an Error naming it and where it is,
// rather than silently not enforced. Properties come out in the order of their names (a parsed
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
// A call after the reply's forced start: for one named tool, the start ends at `"arguments": `
// and the grammar is its arguments then `}\n` and the `</tool_call>` token; otherwise the start
// is `<tool_call>\n` and the grammar is `{"name": …, "arguments": …}` for any of the tools.
std::shared_ptr<const Grammar> tool_call_grammar(const std::vector<ToolSchema>& tools, bool name_forced,
                                                 int32_t call_close_token);

}  // namespace hyla
