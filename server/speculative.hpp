// Speculative decoding's drafters, for the scheduler and the command-line modes: n-gram lookup in a
// sequence's own tokens (following a rewrite's renames: llm::NgramLookup) and a draft model (loaded
// beside the target, on the target's worker threads).
// Verification is the caller's: it samples every drafted position from the target and keeps a drafted
// token only while it equals the sample (llm.hpp, "Speculative decoding").
//
// Backing off (--spec-backoff cost, the default): a cost model (llm::DraftCost) of the target's
// measured decode time by batch size decides how much to draft. An n-gram draft costs nothing to make:
// it is cut to the length with the most tokens per ms for its measured acceptance (0: not verified; its
// proposal is still checked against the next token, so the estimate keeps moving). A draft model call
// costs its decodes: while its measured yield per call does not pay for them and the verification, the
// sequence skips it for 1, 2, 4 .. 32 steps and then tries again (its cache catches up in one batch);
// when the try after 32 skipped steps fails too, the sequence gives up on it (its catch-ups would cost
// more than its drafts yield). With both drafters it checks the lookup's proposal in one batch, unless the
// lookup's draft alone is expected to make more tokens per ms (then the draft model sits the step out).
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
    // A new request on sequence seq: its acceptance estimates start over.
    void reset(int seq);
    // The draft after `tokens` (all of sequence seq so far; the target has not evaluated the last):
    // n-gram lookup first, then the draft model (checking the lookup's proposal, if any, in one batch,
    // then drafting on alone); at most min(p.n_max, room) tokens, fewer as the cost
    // model says, with `base` entries in the step's batch besides the draft (1: only the pending token).
    // A draft model that fails logs and drafts nothing.
    std::vector<int32_t> draft(int seq, const std::vector<int32_t>& tokens, const llm::DraftParams& p, int room, int n_batch, int base = 1);
    // Reads `tokens` into the draft model's sequence seq ahead of the first draft (nothing for n-gram).
    void prefill(int seq, const std::vector<int32_t>& tokens, int n_batch);
    // How many of the last draft of seq the target kept (moves the acceptance estimates).
    void record(int seq, int n_drafted, int n_accepted);
    // A target decode of n_tokens entries took ms (the cost model's input).
    void record_decode(int n_tokens, double ms) { cost_.record_decode(n_tokens, ms); }
    std::string describe() const;  // "n-gram (n = 3)", "draft model F", ... for the log
    // Where the draft model's time went, over all sequences (the -p mode's report).
    struct Counters {
        int model_calls = 0, checked = 0, confirmed = 0;  // its calls, those that checked a lookup proposal, tokens confirmed
        int model_decodes = 0;                            // the decodes of its calls (a checked proposal: one)
        double model_ms = 0, catch_up_ms = 0;             // drafting, and feeding it the tokens it had not seen
    };
    const Counters& counters() const { return counters_; }

private:
    enum class Source { None, Ngram, Model };
    // What a sequence's drafts have yielded (moving sums and averages).
    struct Sequence {
        Source last = Source::None;                  // the drafter of the draft being verified
        llm::NgramLookup lookup;                     // the n-gram lookup and the renames it learnt
        double ngram_kept = 1, ngram_rejected = 1;   // n-gram tokens kept, drafts cut short (prior: 1/2)
        std::vector<int32_t> unverified;             // an n-gram proposal not verified, to check against
        size_t unverified_at = 0;                    //   the tokens that come after this many
        bool model_tried = false;                    // the draft model's per-call averages are set:
        double model_ms = 0, model_decodes = 0, model_drafted = 0, model_kept = 0;
        double model_kept_sum = 3, model_rejected = 1;  // its tokens kept, drafts cut short (prior: 3/4)
        double call_ms = 0, call_decodes = 0;        // the call being verified, and its batch's
        int call_base = 1;                           //   other entries
        int skip = 0, backoff = 1;                   // steps to skip the draft model, the next skip
        void ngram_outcome(size_t kept, bool cut) {  // recent drafts count most
            ngram_kept = 0.8 * ngram_kept + (double)kept;
            ngram_rejected = 0.8 * ngram_rejected + cut;
        }
        // The geometric model's acceptance of each drafter: tokens kept per token kept or draft cut short.
        double ngram_acceptance() const { return ngram_kept / (ngram_kept + ngram_rejected); }
        double model_acceptance() const { return model_kept_sum / (model_kept_sum + model_rejected); }
    };
    std::vector<int32_t> ngram_draft(Sequence& s, const std::vector<int32_t>& tokens, int n_max, int base, std::vector<int32_t>& proposal);
    std::vector<int32_t> model_draft(Sequence& s, int seq, const std::vector<int32_t>& tokens, const llm::DraftParams& p, int n_batch, int base,
                                     const std::vector<int32_t>& proposal);
    void record_model_call(Sequence& s, int n_drafted, int n_kept);
    bool lookup_outruns_model(const Sequence& s, int k, int base) const;
    const SpecOptions o_;
    std::unique_ptr<llm::Model> model_;
    std::unique_ptr<llm::DraftModel> draft_;
    std::vector<Sequence> seqs_;
    llm::DraftCost cost_;
    Counters counters_;
};

}  // namespace srv
