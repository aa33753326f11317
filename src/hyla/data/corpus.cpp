#include "hyla/data/corpus.h"

#include <sys/wait.h>
#include <zlib.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "hyla/core/error.h"

namespace hyla {

namespace {

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

std::string run_bible() {
  FILE* pipe = ::popen("bible -f Gen1:1-Rev22:21 2>/dev/null", "r");
  HYLA_CHECK(pipe != nullptr, "cannot start the `bible` program");
  std::string output;
  std::array<char, 1 << 16> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  HYLA_CHECK(code != 127, "the `bible` program is not installed (Debian package bible-kjv)");
  HYLA_CHECK(code == 0 && !output.empty(), "`bible -f Gen1:1-Rev22:21` failed (exit code {})", code);
  return output;
}

}  // namespace

std::string kjv_plain_text(std::string_view output) {
  std::string text;
  text.reserve(output.size());
  std::string_view chapter;  // reference up to the ':' of the current chapter, e.g. "Ge1"
  size_t line_number = 0;
  while (!output.empty()) {
    const size_t end = output.find('\n');
    std::string_view line = output.substr(0, end);
    output.remove_prefix(end == std::string_view::npos ? output.size() : end + 1);
    ++line_number;
    if (is_blank(line)) continue;
    // A reference is an optional book number, letters, the chapter, ':', the verse, one space.
    size_t i = 0;
    if (i < line.size() && std::isdigit(uint8_t(line[i]))) ++i;
    const size_t letters = i;
    while (i < line.size() && std::isalpha(uint8_t(line[i]))) ++i;
    const size_t digits = i;
    while (i < line.size() && std::isdigit(uint8_t(line[i]))) ++i;
    const size_t colon = i;
    const bool has_colon = i > digits && i < line.size() && line[i] == ':';
    if (has_colon) ++i;
    const size_t verse = i;
    while (i < line.size() && std::isdigit(uint8_t(line[i]))) ++i;
    HYLA_CHECK(i > letters && digits > letters && has_colon && i > verse && i < line.size() && line[i] == ' ',
               "bible output line {}: no verse reference at its start: '{}'", line_number, line.substr(0, 40));
    const std::string_view reference = line.substr(0, colon);
    if (!chapter.empty() && reference != chapter) text += '\n';  // blank line between chapters
    chapter = reference;
    text += line.substr(i + 1);
    text += '\n';
  }
  HYLA_CHECK(!text.empty(), "bible output holds no verses");
  return text;
}

std::string kjv_text() { return kjv_plain_text(run_bible()); }

namespace {

// A paragraph's text as sentences, one a line: its lines joined by single spaces, the italics
// marks (_word_) dropped, and a break after '.', '?' or '!' (and any closing quote or bracket)
// where a space and a capital letter or an opening quote follow.
void append_sentences(std::string_view paragraph, std::string& out) {
  std::string joined;
  for (const char c : paragraph) {
    if (c == '_') continue;
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    if (space) {
      if (!joined.empty() && joined.back() != ' ') joined += ' ';
    } else {
      joined += c;
    }
  }
  while (!joined.empty() && joined.back() == ' ') joined.pop_back();
  size_t start = 0;
  for (size_t i = 0; i < joined.size(); ++i) {
    if (joined[i] != '.' && joined[i] != '?' && joined[i] != '!') continue;
    size_t end = i + 1;
    while (end < joined.size() && (joined[end] == '"' || joined[end] == '\'' || joined[end] == ')')) ++end;
    if (end + 1 < joined.size() && joined[end] == ' ' &&
        (std::isupper(uint8_t(joined[end + 1])) || joined[end + 1] == '"')) {
      out.append(joined, start, end - start).append("\n");
      start = end + 1;
      i = end;
    }
  }
  if (start < joined.size()) out.append(joined, start).append("\n");
}

}  // namespace

std::string devil_plain_text(std::string_view dict) {
  size_t preface = std::string_view::npos;
  for (size_t at = 0; at < dict.size();) {
    const size_t end = std::min(dict.find('\n', at), dict.size());
    std::string_view line = dict.substr(at, end - at);
    line.remove_prefix(std::min(line.find_first_not_of(' '), line.size()));
    if (line == "PREFACE") {
      preface = end;
      break;
    }
    at = end + 1;
  }
  HYLA_CHECK(preface != std::string_view::npos, "not The Devil's Dictionary: it has no PREFACE line");
  std::string_view rest = dict.substr(preface);
  std::string text;
  while (true) {
    std::string_view paragraph = next_document(rest);
    if (paragraph.empty()) break;
    paragraph.remove_prefix(paragraph.find_first_not_of(" \t"));
    if (paragraph.find_first_of(" \n") == std::string_view::npos) continue;  // the dictionary's alphabet line
    if (!text.empty()) text += '\n';
    append_sentences(paragraph, text);
  }
  HYLA_CHECK(!text.empty(), "The Devil's Dictionary holds no text after its preface heading");
  return text;
}

std::string devil_text() {
  const char* path = "/usr/share/dictd/devil.dict.dz";
  HYLA_CHECK(std::filesystem::exists(path), "{} is missing (Debian package dict-devil)", path);
  const std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path, "rb"), gzclose);
  HYLA_CHECK(file != nullptr, "cannot open {}", path);
  std::string dict;
  std::array<char, 1 << 16> buffer;
  int n = 0;
  while ((n = gzread(file.get(), buffer.data(), unsigned(buffer.size()))) > 0) dict.append(buffer.data(), size_t(n));
  HYLA_CHECK(n == 0 && gzeof(file.get()), "{}: corrupt or truncated gzip data", path);
  return devil_plain_text(dict);
}

std::string_view next_document(std::string_view& rest) {
  // Skip blank lines.
  while (!rest.empty()) {
    const size_t end = rest.find('\n');
    if (!is_blank(rest.substr(0, end))) break;
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
  }
  size_t length = 0;  // the document so far, up to the end of its last non-blank line
  while (length < rest.size()) {
    const size_t end = rest.find('\n', length);
    const size_t line_end = end == std::string_view::npos ? rest.size() : end;
    if (is_blank(rest.substr(length, line_end - length))) break;
    length = line_end == rest.size() ? line_end : line_end + 1;
  }
  std::string_view document = rest.substr(0, length);
  rest.remove_prefix(length);
  if (!document.empty() && document.back() == '\n') document.remove_suffix(1);
  return document;
}

}  // namespace hyla
