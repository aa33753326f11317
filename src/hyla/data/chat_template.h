#pragma once
// The chat format of SPEC §8: each turn is "<|im_start|>{role}\n{content}<|im_end|>\n"; an
// assistant's tool calls follow its content as "<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>",
// and a tool's result is the content of a "tool" turn as "<tool_response>\n{result}\n</tool_response>".
// SPEC §8 does not say how the available tools are offered: hyla lists them in the system turn
// (tools_system_prompt), one JSON function definition per line inside <tools></tools>.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hyla/core/image.h"
#include "hyla/data/tokenizer.h"

namespace hyla {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
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
  std::vector<ChatImage> images;     // in increasing `at`; encode_chat lays out their spans
};

// The conversation as text; with add_generation_prompt, ends with an open "<|im_start|>assistant\n"
// turn for the model to complete. Images are not shown (their spans exist only as ids).
std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt = false);

// The same conversation as ids: turn and tool markers are special ids, while roles, contents and
// call arguments are encoded as plain text, so text inside a message can never forge a marker.
// Equals encode(apply_chat_template(...), allow_special=true) whenever no message contains
// special-token text or images. An image's span (image_text.h) stands at its place in the content;
// `patch_size` is the model's (vision.patch_size), needed when a message has images.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                 bool add_generation_prompt = false, int64_t patch_size = 0);
// Every message's images, in the order their spans appear (a GenerationRequest's images).
std::vector<Image> chat_images(std::span<const ChatMessage> messages);

// The text that offers tools to the model: `functions` are JSON function definitions
// ({"name", "description", "parameters"}), one per line.
std::string tools_system_prompt(std::span<const std::string> functions);

// `messages` with the tools offered in the system turn (appended to a leading system message, or
// in a new one).
std::vector<ChatMessage> with_tools(std::span<const ChatMessage> messages, std::span<const std::string> functions);

// An assistant reply split into its text and the calls of its <tool_call> blocks. A block whose
// body is not a JSON object with a string "name" stays in the text.
struct AssistantReply {
  std::string content;
  std::vector<ToolCall> tool_calls;
};
AssistantReply parse_assistant_reply(std::string_view text);

}  // namespace hyla
