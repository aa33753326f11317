#pragma once
// Assembling generated text: token bytes become text only once they form complete UTF-8, and text
// that could be the start of a stop string is held back until it is known not to be one.
#include <string>
#include <string_view>
#include <vector>

namespace hyla {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop = {});
  // Adds a token's bytes; returns the text that is now final (may be empty). After a stop string
  // appears, the text ends before it and stopped() is true.
  std::string push(std::string_view bytes);
  // The text still held back (end of generation without a stop).
  std::string flush();
  bool stopped() const { return !stop_found_.empty(); }
  const std::string& stop_found() const { return stop_found_; }  // the stop string that ended it (the earliest)
  const std::string& text() const { return text_; }  // everything final so far

 private:
  std::vector<std::string> stop_;
  std::string bytes_;   // incomplete UTF-8 tail
  std::string held_;    // complete text that may begin a stop string
  std::string text_;
  std::string stop_found_;
};

}  // namespace hyla
