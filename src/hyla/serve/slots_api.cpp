#include "hyla/serve/slots_api.h"

#include <fmt/format.h>

#include "hyla/core/error.h"
#include "hyla/io/json_fields.h"
#include "hyla/serve/api_error.h"

namespace hyla {

using json = nlohmann::json;

json slots_listing(const std::vector<Scheduler::SlotInfo>& slots, int64_t context) {
  json listing = json::array();
  for (const Scheduler::SlotInfo& s : slots) {
    json slot = {{"id", s.id}, {"n_ctx", context}, {"speculative", false}, {"is_processing", s.processing},
                 {"n_tokens", s.tokens}};
    if (s.request != 0) {
      slot["id_task"] = s.request;
      slot["n_prompt_tokens"] = s.prompt_tokens;
      slot["n_prompt_tokens_cache"] = s.cached_prompt_tokens;
      slot["n_prompt_tokens_processed"] = s.prompt_tokens - s.cached_prompt_tokens;
      slot["next_token"] = json::array({{{"has_next_token", s.processing},
                                         {"n_remain", s.processing ? s.max_tokens - s.generated_tokens : 0},
                                         {"n_decoded", s.generated_tokens}}});
    }
    listing.push_back(std::move(slot));
  }
  return listing;
}

namespace {

// A plain name inside the slot directory: no separators, no "..", nothing hidden.
void check_filename(const std::string& name) {
  const bool plain = !name.empty() && name.size() <= 200 && name.front() != '.' &&
                     std::ranges::all_of(name, [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
                     });
  if (!plain)
    api::invalid("filename", fmt::format("invalid filename {}: use up to 200 letters, digits, '.', '_' and '-', not "
                                         "starting with '.' (the file lives in the --slot-save-path directory)",
                                         json(name).dump()));
}

}  // namespace

SlotAction parse_slot_action(const std::string& id, const std::string& action, const std::string& body,
                             const std::filesystem::path& slot_directory, int slots) {
  SlotAction a;
  const bool digits = !id.empty() && id.size() <= 9 && std::ranges::all_of(id, [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoi(id) >= slots)
    api::invalid("id_slot", fmt::format("invalid slot id {}: this server has slots 0 to {} (GET /slots lists them)",
                                        json(id).dump(), slots - 1));
  a.slot = std::stoi(id);
  if (action == "save") a.verb = SlotVerb::Save;
  else if (action == "restore") a.verb = SlotVerb::Restore;
  else if (action == "erase") return a;
  else api::invalid("action", fmt::format("invalid action {}: save, restore or erase", json(action).dump()));
  json request;
  try {
    request = parse_json(body, "the request body");
  } catch (const Error& e) {
    api::invalid("", e.what());
  }
  if (!request.is_object()) api::invalid("", "the request body must be a JSON object with a \"filename\"");
  const json* filename = api::field(request, "filename");
  if (!filename || !filename->is_string()) api::invalid("filename", "\"filename\" must be a string");
  a.filename = filename->get<std::string>();
  check_filename(a.filename);
  a.file = slot_directory / a.filename;
  return a;
}

json run_slot_action(Scheduler& scheduler, const SlotAction& action) {
  const auto ms = [](double seconds) { return seconds * 1e3; };
  switch (action.verb) {
    case SlotVerb::Save: {
      const Scheduler::SlotTransfer t = scheduler.save_slot(action.slot, action.file);
      return {{"id_slot", action.slot}, {"filename", action.filename}, {"n_saved", t.tokens},
              {"n_written", t.bytes}, {"timings", {{"save_ms", ms(t.seconds)}}}};
    }
    case SlotVerb::Restore: {
      Scheduler::SlotTransfer t;
      try {
        t = scheduler.restore_slot(action.slot, action.file);
      } catch (const Error& e) {
        throw ApiError(400, fmt::format("unable to restore slot {}: {}", action.slot, e.what()), "filename");
      }
      return {{"id_slot", action.slot}, {"filename", action.filename}, {"n_restored", t.tokens},
              {"n_read", t.bytes}, {"timings", {{"restore_ms", ms(t.seconds)}}}};
    }
    case SlotVerb::Erase: return {{"id_slot", action.slot}, {"n_erased", scheduler.erase_slot(action.slot)}};
  }
  return {};
}

}  // namespace hyla
