#include "hyla/core/error.h"

#include <filesystem>
#include <new>
#include <system_error>

namespace hyla {

std::string describe_exception(const std::exception& e) {
  if (dynamic_cast<const Error*>(&e)) return e.what();
  if (dynamic_cast<const InternalError*>(&e)) return fmt::format("{} (a bug in hyla; please report it)", e.what());
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return "out of memory: an allocation failed (free memory, or ask for less: a shorter --context, fewer "
           "sequences at once, a smaller --expert-memory)";
  // The system's own errors name the path or the call and the reason.
  if (dynamic_cast<const std::filesystem::filesystem_error*>(&e) || dynamic_cast<const std::system_error*>(&e))
    return e.what();
  if (dynamic_cast<const std::logic_error*>(&e))
    return "internal error: an index, key or length out of range (a bug in hyla; please report it with the command "
           "and its input)";
  return "internal error: an unexpected failure (a bug in hyla; please report it with the command and its input)";
}

}  // namespace hyla
