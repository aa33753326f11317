#pragma once
// An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP
// status, so clients written for the OpenAI API surface it as they would OpenAI's own.
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace hyla {

struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}

  nlohmann::json to_json() const {
    return {{"error",
             {{"message", what()},
              {"type", type},
              {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
              {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}}}};
  }
};

// Reading request bodies, shared by every API's reader (api_request.h, anthropic_api.h,
// responses_api.h).
namespace api {

// A 400 naming the field `param`.
[[noreturn]] inline void invalid(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param);
}

// A present, non-null member of a JSON object, or nullptr.
inline const nlohmann::json* field(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace api

}  // namespace hyla
