#pragma once
// Behind chat_template.h: a format renders a conversation as pieces (text, marker tokens, images)
// and reads a reply back. One file per format (chat_template.cpp holds hyla's).
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/data/chat_template.h"

namespace hyla::chat {

struct Piece {
  enum class Kind { Text, Special, Image };
  Kind kind = Kind::Text;
  std::string text;             // Text: plain text; Special: the marker token's content
  const Image* image = nullptr;  // Image
};

class Pieces {
 public:
  void text(std::string_view s);
  void special(std::string_view token);
  // A message's content with its images at their places.
  void content(const ChatMessage& message);
  // Whether what is rendered so far ends in a text piece that ends in `c`.
  bool ends_with(char c) const;
  std::vector<Piece>& list() { return list_; }

 private:
  std::vector<Piece> list_;
};

void render_hyla(std::span<const ChatMessage> messages, bool add_generation_prompt, const ChatOptions& options, Pieces& out);
void render_kimi_k2(std::span<const ChatMessage> messages, bool add_generation_prompt, const ChatOptions& options, Pieces& out);
void render_kimi_k3(std::span<const ChatMessage> messages, bool add_generation_prompt, const ChatOptions& options, Pieces& out);

AssistantReply parse_hyla(std::string_view text, const ChatOptions& options, bool partial);
AssistantReply parse_kimi_k2(std::string_view text, const ChatOptions& options, bool partial);
AssistantReply parse_kimi_k3(std::string_view text, const ChatOptions& options, bool partial);

// Where the segment of `text` that starts at `from` ends: at the first of `delimiters`, else at
// the end of the text; with `partial`, before the longest tail that may begin a delimiter.
size_t segment_end(std::string_view text, size_t from, std::initializer_list<std::string_view> delimiters, bool partial);

// Where the JSON value starting at `from` (after any whitespace) ends, or npos when the text ends
// before it does: strings, escapes and nesting are followed, nothing else is checked. A number or
// literal that reaches the end of the text is unfinished (it may go on).
size_t json_value_end(std::string_view text, size_t from);

// The text `text` ends with, without trailing whitespace: what of a value still being written may be
// streamed (the whitespace may turn out to lie after the value's end).
std::string_view trim_trailing_space(std::string_view text);

// A JSON value as Python's json.dumps writes it (what Jinja's tojson gives in Hugging Face's chat
// templates): ", " and ": " separators, or "," and ":" with `compact`; keys in their order, or
// sorted by code point (json.dumps's sort_keys, case-sensitive) with `sort_keys`; non-ASCII kept.
std::string python_json(const nlohmann::ordered_json& value, bool compact, bool sort_keys);

// The offered tools as OpenAI's request lists them: {"type": "function", "function": {…}} each,
// keys in the order of the definitions' text.
nlohmann::ordered_json openai_tools(std::span<const std::string> functions);

}  // namespace hyla::chat
