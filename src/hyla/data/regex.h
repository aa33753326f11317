#pragma once
// A compiled PCRE2 pattern (UTF mode, Unicode properties, JIT when available) that also runs on
// invalid UTF-8: ill-formed bytes simply never match, so byte-level tokenisers see every byte.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace hyla {

// Per-thread scratch for matching: PCRE2's match data, and a JIT stack that grows to kJitStackBytes
// (PCRE2's default is 32 KiB, which a pattern with nested repetitions, such as Kimi's pre-split
// pattern, exhausts on a run of a few thousand letters: DNA, base64, minified text). One per
// thread, reused across calls.
class RegexMatchData {
 public:
  static constexpr size_t kJitStackBytes = size_t(64) << 20;  // reserved, touched as it grows
  RegexMatchData();
  ~RegexMatchData();
  RegexMatchData(const RegexMatchData&) = delete;
  RegexMatchData& operator=(const RegexMatchData&) = delete;
  pcre2_real_match_data_8* get() const { return data_; }
  pcre2_real_match_context_8* context() const { return context_; }

 private:
  pcre2_real_match_data_8* data_;
  pcre2_real_match_context_8* context_;
  pcre2_real_jit_stack_8* jit_stack_;
};

class Regex {
 public:
  // `literal` matches `pattern` as plain text. `source` names the origin for error messages.
  Regex(std::string pattern, bool literal, const std::string& source);
  const std::string& pattern() const { return pattern_; }
  bool literal() const { return literal_; }

  // Finds the first non-empty match at or after `start`; false if there is none. A text whose match
  // needs more than the JIT stack is matched by PCRE2's interpreter instead (its frames on the heap);
  // only what exhausts that too is an error.
  bool find(std::string_view subject, size_t start, RegexMatchData& scratch, size_t& match_begin,
            size_t& match_end) const;

 private:
  std::string pattern_;
  bool literal_;
  std::shared_ptr<pcre2_real_code_8> code_;
  bool jit_ = false;
};

}  // namespace hyla
