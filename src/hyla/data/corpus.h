#pragma once
// Text corpora and what a "document" is in them.
#include <string>
#include <string_view>

namespace hyla {

// The King James Bible as plain text, from the `bible` program (Debian package bible-kjv): one
// verse per line with its reference ("Ge1:1 ") removed, and a blank line between chapters, so each
// chapter is one document. About 4.2 MB.
std::string kjv_text();
// The same from text in the program's output format ("Ge1:1 In the beginning...", one verse a line).
std::string kjv_plain_text(std::string_view bible_output);

// The Devil's Dictionary (Ambrose Bierce, 1911; public domain), from Debian package dict-devil's
// /usr/share/dictd/devil.dict.dz: from its preface on, one sentence a line and a blank line
// between paragraphs (an entry, a verse), so each paragraph is one document. About 360 KB of prose
// nothing like the KJV's: the long-context suite's held-out haystack.
std::string devil_text();
// The same from the dictionary's decompressed text.
std::string devil_plain_text(std::string_view dict);

// Documents are blocks of text separated by blank lines (lines that are empty or hold only spaces,
// tabs and carriage returns); a file without blank lines is one document. Returns the next
// document of `rest` (without the newline that ends its last line) and advances `rest` past it;
// an empty view when no document is left.
std::string_view next_document(std::string_view& rest);

}  // namespace hyla
