#pragma once
// What `hyla eval images` reports: a JSON summary (accuracy with a Wilson 95% interval per run
// and per label, a confusion matrix when each label has one answer, i.e. classification) and a
// self-contained report.html (tables, the confusion matrix as a heat map, example images with
// the model's answers, the text-only twin's comparison).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hyla/eval/image_eval.h"

namespace hyla {

struct ImageEvalRun {
  ImageControl control = ImageControl::None;
  ImageEvalResult result;
};

// label_names[i] names label i (classes or question types); labels beyond them are "label i".
nlohmann::ordered_json summarize_image_eval(const std::vector<ImageEvalRun>& runs,
                                            const std::vector<std::string>& label_names);
// `summary` as summarize_image_eval returns it, plus whatever the caller added ("text": the twin).
std::string image_eval_html(const nlohmann::ordered_json& summary, const std::vector<ImageEvalRun>& runs);

}  // namespace hyla
