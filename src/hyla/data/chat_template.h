#pragma once
// Chat formats (SPEC §8): how a conversation becomes a prompt and how an assistant reply is read
// back. Three formats, chosen by the tokenizer's special tokens:
// - hyla's ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" turns; an assistant's tool calls follow
//   its content as "<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>", a tool's result is a
//   "tool" turn's "<tool_response>\n{result}\n</tool_response>", and offered tools are listed in the
//   system turn, one JSON function definition per line inside <tools></tools> (or, with
//   ChatOptions::compact_tools, one line "name(arg, ...): description" per tool);
// - Kimi K2 (Kimi Linear's template, chat_kimi_k2.cpp) and Kimi K3's XTML (chat_kimi_k3.cpp), each
//   rendered exactly as the checkpoint's own Jinja template renders it (tests/data/chat holds the
//   goldens that scripts/chat-template-goldens.py draws from those templates).
// A rendering is a list of pieces: marker tokens are special ids, everything from a message (roles,
// contents, call arguments) is encoded as plain text, so text inside a message never forges a marker.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/data/tokenizer.h"

namespace hyla {

enum class ChatFormat { Hyla, KimiK2, KimiK3 };
std::string_view to_string(ChatFormat format);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
  std::string id;         // the client's id for it, if any: a tool message's tool_call_id names it
};

// A model image (data/image_file.h's to_model_image) placed at byte `at` of a message's content.
struct ChatImage {
  size_t at = 0;
  Image image;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant turns only
  std::vector<ChatImage> images;     // in increasing `at`: hyla's image spans, Kimi K3's media spans
  std::string reasoning;             // assistant turns: the think channel (Kimi K3 renders it)
  std::string name;                  // the participant's name (Kimi K3: an attribute; a tool turn's tool)
  std::string tool_call_id;          // tool turns: the id of the call it answers
};

// What the request asks of the template beyond its messages.
struct ChatOptions {
  std::vector<std::string> tools;   // JSON function definitions offered ({"name", "description", "parameters"})
  std::string tool_choice = "auto";  // auto, required or none: with none hyla leaves the tools out, the
                                     // Kimi templates declare them (K3 says what the model may do)
  bool thinking = true;              // Kimi K3: the think channel (its template's default)
  std::string thinking_effort = "max";  // Kimi K3: low, high or max; empty: not said
  // hyla's format: each offered tool as one line, "name(arg, ...): description", instead of its
  // JSON definition, with the call syntax in one line: a prompt short enough for a small model's
  // agent episodes (the Kimi formats declare their tools as their templates do).
  bool compact_tools = false;
  bool offers_tools() const { return !tools.empty() && tool_choice != "none"; }
};

// An assistant reply read back: its text, its think channel and its calls. A call that does not
// parse stays in the content (so the reader sees it), and malformed_call says so.
struct AssistantReply {
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::string reasoning;
  bool malformed_call = false;
};

class ChatTemplate {
 public:
  // The format the tokenizer's specials name: <|open|> <|sep|> <|close|> <|end_of_msg|> Kimi K3,
  // <|im_system|> <|im_user|> <|im_assistant|> <|im_middle|> Kimi K2, else hyla's.
  explicit ChatTemplate(Tokenizer tokenizer);
  ChatTemplate(Tokenizer tokenizer, ChatFormat format);

  ChatFormat format() const { return format_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

  // The conversation as text; with add_generation_prompt it ends where the assistant's reply
  // begins. Images are not shown (their spans exist only as ids).
  std::string apply(std::span<const ChatMessage> messages, bool add_generation_prompt = false,
                    const ChatOptions& options = {}) const;
  // The same conversation as ids; equals encode(apply(...), allow_special=true) whenever no
  // message contains special-token text or images. `patch_size` is the side of the pixels one
  // image position covers (VisionConfig::position_pixels), needed when a message has images. Kimi K3
  // places an image as <|media_begin|>image WxH<|media_content|>, a <|media_pad|> per position and
  // <|media_end|> (W×H the image's source size); the other formats as hyla's span (image_text.h).
  std::vector<int32_t> encode(std::span<const ChatMessage> messages, bool add_generation_prompt = false,
                              const ChatOptions& options = {}, int64_t patch_size = 0) const;

  // A reply's text (after the generation prompt, the end-of-turn token left out) read back; its
  // calls are extracted when `options` offers tools. With `partial` the text is a reply still being
  // written: no call is extracted, and content and reasoning stop where a call begins and before any
  // tail that may begin a marker, so that each partial result extends the one before.
  AssistantReply parse_reply(std::string_view text, const ChatOptions& options = {}, bool partial = false) const;

  // Text that forces the reply to open with a call (tool_choice "required", or one named tool), or
  // a hyla::Error naming what this format cannot force. `previous_calls` counts the conversation's
  // calls (Kimi K2 numbers them).
  std::string forced_call_prefix(std::string_view tool_name, size_t previous_calls) const;

  // The ids that end an assistant turn (with <|endoftext|>, where the tokenizer has them).
  std::vector<int32_t> end_ids() const;

 private:
  Tokenizer tokenizer_;
  ChatFormat format_;
};

// Every message's images, in the order their spans appear (a GenerationRequest's images).
std::vector<Image> chat_images(std::span<const ChatMessage> messages);

}  // namespace hyla
