#pragma once
// The chat format of SPEC §8: each turn is "<|im_start|>{role}\n{content}<|im_end|>\n".
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "hyla/data/tokenizer.h"

namespace hyla {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
};

// The conversation as text; with add_generation_prompt, ends with an open "<|im_start|>assistant\n"
// turn for the model to complete.
std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt = false);

// The same conversation as ids: the turn markers are special ids, while roles and contents are
// encoded as plain text, so text inside a message can never forge a turn marker. Equals
// encode(apply_chat_template(...), allow_special=true) whenever no message contains special-token text.
std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                 bool add_generation_prompt = false);

}  // namespace hyla
