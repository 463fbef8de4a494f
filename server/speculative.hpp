// Speculative decoding's drafters, for the scheduler and the command-line modes: n-gram lookup in a
// sequence's own tokens and a draft model (loaded beside the target, on the target's worker threads).
// Verification is the caller's: it samples every drafted position from the target and keeps a drafted
// token only while it equals the sample (llm.hpp, "Speculative decoding").
//
// Backing off: each sequence's drafts are capped by how the last ones fared (all accepted: the cap
// doubles; otherwise it becomes the accepted count + 1), so text that the drafter cannot predict costs
// one extra position per step rather than a whole --draft-max batch.
#pragma once
#include <memory>
#include <vector>

#include "../llm.hpp"
#include "args.hpp"

namespace srv {

class Speculator {
public:
    // Loads -md (its vocabulary checked against the target's) with n_seq sequences of the target
    // context's size (-cd: another total); throws llm::Error.
    Speculator(const Options& o, const llm::Model& target, const llm::Context& target_ctx, int n_seq);
    bool has_draft_model() const { return draft_ != nullptr; }
    // A new request on sequence seq: the cap starts over.
    void reset(int seq);
    // The draft after `tokens` (all of sequence seq so far; the target has not evaluated the last):
    // n-gram lookup first, then the draft model; at most min(p.n_max, room, the cap) tokens. A draft
    // model that fails logs and drafts nothing.
    std::vector<int32_t> draft(int seq, const std::vector<int32_t>& tokens, const llm::DraftParams& p, int room, int n_batch);
    // Reads `tokens` into the draft model's sequence seq ahead of the first draft (nothing for n-gram).
    void prefill(int seq, const std::vector<int32_t>& tokens, int n_batch);
    // How many of the last draft of seq the target kept (moves the cap).
    void record(int seq, int n_drafted, int n_accepted);
    std::string describe() const;  // "n-gram (n = 3)", "draft model F", ... for the log

private:
    const SpecOptions o_;
    std::unique_ptr<llm::Model> model_;
    std::unique_ptr<llm::DraftModel> draft_;
    std::vector<int> cap_;  // per sequence
};

}  // namespace srv
