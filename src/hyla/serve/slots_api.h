#pragma once
// llama-server's slot endpoints over the engine's slots (Scheduler::slots, save_slot, ...):
//   GET /slots → one object per slot: id, n_ctx, is_processing, n_tokens (in its state) and, once
//     a request has used it, id_task, n_prompt_tokens, n_prompt_tokens_cache, next_token
//     (has_next_token, n_remain, n_decoded); ?fail_on_no_slot=1 answers 503 when none is free.
//   POST /slots/{id}?action=save|restore {"filename": NAME} → the slot's state written to, or read
//     from, NAME in the --slot-save-path directory (slot_file.h);
//   POST /slots/{id}?action=erase → the slot's state emptied.
// A busy slot's action waits for its request to finish. Errors are OpenAI-shaped: 501 without
// --slot-save-path, 400 for a bad slot id, action or filename, or a file that cannot be restored.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "hyla/infer/scheduler.h"

namespace hyla {

nlohmann::json slots_listing(const std::vector<Scheduler::SlotInfo>& slots, int64_t context);

enum class SlotVerb : uint8_t { Save, Restore, Erase };

struct SlotAction {
  int slot = 0;
  SlotVerb verb = SlotVerb::Erase;
  std::string filename;         // save and restore
  std::filesystem::path file;   // in the slot directory
};

// Reads a POST /slots/{id} request: the id from the path, action from the query, the filename from
// the body (a JSON object). Throws ApiError.
SlotAction parse_slot_action(const std::string& id, const std::string& action, const std::string& body,
                             const std::filesystem::path& slot_directory, int slots);

// What the action does to the scheduler (on the engine's worker), as llama-server answers it:
// {id_slot, filename, n_saved, n_written, timings: {save_ms}}, {id_slot, filename, n_restored,
// n_read, timings: {restore_ms}} or {id_slot, n_erased}. A file that cannot be restored is a 400.
nlohmann::json run_slot_action(Scheduler& scheduler, const SlotAction& action);

}  // namespace hyla
