#pragma once
// A plan as the text `hyla plan` prints and as the one JSON object `hyla plan --json` prints.
#include <nlohmann/json.hpp>
#include <string>

#include "hyla/plan/plan.h"

namespace hyla {

std::string plan_text(const Plan& plan);
nlohmann::json plan_json(const Plan& plan);

}  // namespace hyla
