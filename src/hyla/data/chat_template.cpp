#include "hyla/data/chat_template.h"

namespace hyla {

std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string text;
  for (const ChatMessage& m : messages) text += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) text += "<|im_start|>assistant\n";
  return text;
}

std::vector<int32_t> encode_chat(const Tokenizer& tokenizer, std::span<const ChatMessage> messages,
                                 bool add_generation_prompt) {
  const int32_t start = tokenizer.special_id("<|im_start|>"), end = tokenizer.special_id("<|im_end|>");
  std::vector<int32_t> ids;
  for (const ChatMessage& m : messages) {
    ids.push_back(start);
    tokenizer.encode_append(m.role + "\n" + m.content, false, ids);
    ids.push_back(end);
    tokenizer.encode_append("\n", false, ids);
  }
  if (add_generation_prompt) {
    ids.push_back(start);
    tokenizer.encode_append("assistant\n", false, ids);
  }
  return ids;
}

}  // namespace hyla
