// bAbI's stories (Weston et al., 2015) at random places, in order, in the essay haystack (as
// BABILong places them): where is a person (QA1), where is an object (QA2), where was an object
// before a place (QA3).
#include <fmt/format.h>

#include <array>

#include "hyla/eval/longctx_task_parts.h"

namespace hyla {
namespace {

constexpr std::array kPeople = {"Mary", "John", "Daniel", "Sandra", "Fred", "Julie", "Bill", "Emily"};
constexpr std::array kPlaces = {"kitchen", "garden", "bathroom", "bedroom", "office", "hallway", "cellar", "balcony"};
constexpr std::array kObjects = {"football", "apple", "milk", "book", "lamp", "key"};
constexpr std::array kMoves = {"went to", "moved to", "journeyed to", "travelled to"};
constexpr std::array kTakes = {"picked up", "got", "grabbed"};
constexpr std::array kDrops = {"dropped", "discarded", "put down"};

struct Story {
  std::vector<std::string> facts;
  std::string question, answer;
};

// QA1: where is a person. The asked person moves at least twice; the answer is the last move.
Story qa1_story(Rng& rng) {
  for (;;) {
    Story s;
    std::array<int, kPeople.size()> at;
    at.fill(-1);
    std::array<int, kPeople.size()> moves{};
    for (int f = 0; f < 8; ++f) {
      const size_t who = size_t(rng.below(4));
      int where = int(rng.below(kPlaces.size()));
      if (where == at[who]) where = (where + 1) % int(kPlaces.size());
      at[who] = where;
      ++moves[who];
      s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kMoves[rng.below(kMoves.size())], kPlaces[size_t(where)]));
    }
    std::vector<size_t> askable;
    for (size_t p = 0; p < 4; ++p)
      if (moves[p] >= 2) askable.push_back(p);
    if (askable.empty()) continue;
    const size_t who = askable[rng.below(askable.size())];
    s.question = fmt::format("Where is {}?", kPeople[who]);
    s.answer = kPlaces[size_t(at[who])];
    return s;
  }
}

// QA2 and QA3 share one simulation: people move, objects are picked up and dropped; a held
// object is wherever its holder is. Every person moves before taking anything, so every place is known.
struct World {
  std::array<int, kPeople.size()> person_at;
  std::array<int, kObjects.size()> holder, object_at;
  std::array<std::vector<int>, kObjects.size()> path;  // each object's distinct consecutive places
  World() {
    person_at.fill(-1);
    holder.fill(-1);
    object_at.fill(-1);
  }
  void place_object(size_t o, int where) {
    object_at[o] = where;
    if (path[o].empty() || path[o].back() != where) path[o].push_back(where);
  }
};

Story object_story(Rng& rng, bool before, int events) {
  for (;;) {
    Story s;
    World w;
    constexpr size_t people = 4, objects = 3;
    for (int e = 0; e < events; ++e) {
      const size_t who = size_t(rng.below(people));
      const uint64_t roll = rng.below(10);
      size_t held = objects;
      for (size_t o = 0; o < objects; ++o)
        if (w.holder[o] == int(who)) held = o;
      if (w.person_at[who] < 0 || roll < 5) {  // move (and carry what is held)
        int where = int(rng.below(kPlaces.size()));
        if (where == w.person_at[who]) where = (where + 1) % int(kPlaces.size());
        w.person_at[who] = where;
        if (held < objects) w.place_object(held, where);
        s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kMoves[rng.below(kMoves.size())], kPlaces[size_t(where)]));
      } else if (held < objects) {  // drop
        w.holder[held] = -1;
        s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kDrops[rng.below(kDrops.size())], kObjects[held]));
      } else {  // take a free object, which is now where its taker is
        const size_t o = size_t(rng.below(objects));
        if (w.holder[o] >= 0) continue;
        w.holder[o] = int(who);
        w.place_object(o, w.person_at[who]);
        s.facts.push_back(fmt::format("{} {} the {}.", kPeople[who], kTakes[rng.below(kTakes.size())], kObjects[o]));
      }
    }
    std::vector<size_t> askable;
    for (size_t o = 0; o < objects; ++o)
      if (before ? w.path[o].size() >= 2 : w.object_at[o] >= 0) askable.push_back(o);
    if (askable.empty()) continue;
    const size_t o = askable[rng.below(askable.size())];
    if (!before) {
      s.question = fmt::format("Where is the {}?", kObjects[o]);
      s.answer = kPlaces[size_t(w.object_at[o])];
      return s;
    }
    // A place the object reached once only, so "before" names one place.
    std::vector<size_t> steps;
    for (size_t k = 1; k < w.path[o].size(); ++k)
      if (std::count(w.path[o].begin(), w.path[o].end(), w.path[o][k]) == 1) steps.push_back(k);
    if (steps.empty()) continue;
    const size_t k = steps[rng.below(steps.size())];
    s.question = fmt::format("Where was the {} before the {}?", kObjects[o], kPlaces[size_t(w.path[o][k])]);
    s.answer = kPlaces[size_t(w.path[o][k - 1])];
    return s;
  }
}

}  // namespace

LongCtxSample babi_sample(const SampleRequest& request, int qa) {
  const Story story = qa == 1 ? qa1_story(request.rng) : object_story(request.rng, qa == 3, 14);
  Needles n;
  n.planted = story.facts;
  n.placement = Placement::Spread;
  n.prefix = request.paraphrased ? "Read the story hidden in the text below and answer the question about it in one word.\n"
                                 : "Answer the question from the story told in the following text. Only give the answer.\n";
  n.suffix = request.paraphrased ? fmt::format("\nFrom the story, answer this: {} The answer is the", story.question)
                                 : fmt::format("\nQuestion: {} Answer: the", story.question);
  n.expected = {story.answer};
  return haystack_sample(request, Filler::Essay, n);
}

}  // namespace hyla
