#include "hyla/data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "hyla/core/error.h"

namespace hyla {

RegexMatchData::RegexMatchData()
    : data_(pcre2_match_data_create(1, nullptr)),
      context_(pcre2_match_context_create(nullptr)),
      jit_stack_(pcre2_jit_stack_create(32 << 10, kJitStackBytes, nullptr)) {
  HYLA_ASSERT(data_ != nullptr && context_ != nullptr);
  // Without a JIT stack (a PCRE2 built without JIT) the default one serves, and the interpreter
  // takes over where it falls short.
  if (jit_stack_) pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
}

RegexMatchData::~RegexMatchData() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

Regex::Regex(std::string pattern, bool literal, const std::string& source)
    : pattern_(std::move(pattern)), literal_(literal) {
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  if (literal_) options |= PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(), options, &error,
                                   &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("{}: invalid regex at offset {}: {}", source, error_offset, reinterpret_cast<const char*>(message));
  }
  code_.reset(code, pcre2_code_free);
  // JIT is several times faster; without it (e.g. a platform PCRE2 lacks JIT for) the interpreter
  // gives the same matches.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

bool Regex::find(std::string_view subject, size_t start, RegexMatchData& scratch, size_t& match_begin,
                 size_t& match_end) const {
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  while (start < subject.size()) {
    int rc = jit_ ? pcre2_jit_match(code_.get(), text, subject.size(), start, 0, scratch.get(), scratch.context())
                  : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_.get(), text, subject.size(), start, PCRE2_NO_JIT, scratch.get(), scratch.context());
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      const bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT;
      // The pattern's head names it; a tokenizer's whole pattern runs to hundreds of characters.
      size_t cut = std::min<size_t>(pattern_.size(), 48);
      while (cut < pattern_.size() && cut > 0 && (uint8_t(pattern_[cut]) & 0xC0) == 0x80) --cut;  // whole characters
      const std::string head = cut < pattern_.size() ? pattern_.substr(0, cut) + "…" : pattern_;
      fail("regex /{}/ ({} characters): matching failed at byte {} of a {}-byte text: {} (PCRE2 error {}){}", head,
           pattern_.size(), start, subject.size(), reinterpret_cast<const char*>(message), rc,
           limit ? "; the pattern backtracks past PCRE2's limits on this text: bound its repetitions or make them "
                   "possessive (e.g. \\p{L}++)"
                 : "");
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.get());
    if (ovector[1] > ovector[0]) {
      match_begin = ovector[0];
      match_end = ovector[1];
      return true;
    }
    // An empty match splits nothing: retry one character further on (past continuation bytes).
    start = ovector[0] + 1;
    while (start < subject.size() && (uint8_t(subject[start]) & 0xC0) == 0x80) ++start;
  }
  return false;
}

}  // namespace hyla
