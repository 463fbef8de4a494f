// Speculative decoding's drafters (see speculative.hpp).
#include "speculative.hpp"

#include <algorithm>

#include "util.hpp"

namespace srv {

namespace {

// The most steps a sequence skips the draft model before trying it again; when that try fails too, the
// sequence gives up on it (skips it for good): each try costs a catch-up of the tokens it skipped.
const int kMaxBackoff = 32;
const int kGaveUp = INT32_MAX;

// The draft model's context: one sequence per target sequence, -cd cells in all (default: the
// target's), -td / -tbd threads of the target's pool.
llm::ContextParams draft_context_params(const Options& o, const llm::Context& target_ctx, int n_seq) {
    llm::ContextParams cp = context_params(o, o.spec.n_ctx > 0 ? o.spec.n_ctx : target_ctx.n_ctx());
    cp.n_seq = n_seq;
    if (o.spec.n_threads > 0) cp.n_threads = o.spec.n_threads;
    cp.n_threads_batch = o.spec.n_threads_batch > 0 ? o.spec.n_threads_batch : o.spec.n_threads > 0 ? o.spec.n_threads : o.n_threads_batch;
    cp.type_k = o.spec.type_k;
    cp.type_v = o.spec.type_v;
    cp.embeddings = false;
    cp.head_vocab = o.spec.draft_vocab;
    return cp;
}

}  // namespace

Speculator::Speculator(const Options& o, const llm::Model& target, const llm::Context& target_ctx, int n_seq)
    : o_(o.spec), seqs_(n_seq) {
    if (o_.model.empty()) return;
    const double t0 = now_seconds();
    llm::ModelOptions mo = model_options(o);
    mo.n_gpu_layers = o_.n_gpu_layers;
    model_ = llm::Model::load(o_.model, mo);
    llm::check_draft_vocab(target, *model_);
    draft_ = std::make_unique<llm::DraftModel>(*model_, target.hp.n_vocab, draft_context_params(o, target_ctx, n_seq), target_ctx);
    log_msg('I', "draft model %s: %s, %d layers, %.1fM params, %.0f ms; kv cache %.2f MiB, %d tokens per sequence", o_.model.c_str(),
            model_->arch_str.c_str(), model_->hp.n_layer, model_->n_params() / 1e6, (now_seconds() - t0) * 1000,
            mib(draft_->context().kv_bytes()), draft_->context().n_ctx_seq());
}

void Speculator::reset(int seq) { seqs_[seq] = Sequence(); }

std::vector<int32_t> Speculator::draft(int seq, const std::vector<int32_t>& tokens, const llm::DraftParams& p, int room, int n_batch, int base) {
    Sequence& s = seqs_[seq];
    s.last = Source::None;
    llm::DraftParams capped = p;
    capped.n_max = std::min(p.n_max, room);
    if (capped.n_max <= 0 || capped.n_max < p.n_min) return {};
    std::vector<int32_t> out, proposal;  // the lookup's draft as the cost model cuts it, and as found
    if (o_.ngram) out = ngram_draft(s, tokens, capped.n_max, base, proposal);
    bool model_now = draft_ != nullptr;
    if (model_now && o_.backoff && s.skip > 0) {  // backing off from the draft model
        s.skip--;
        model_now = false;
    }
    if (model_now && lookup_outruns_model(s, (int)out.size(), base)) model_now = false;  // it sits this step out
    if (model_now) {  // it checks the lookup's proposal if there is one
        std::vector<int32_t> by_model = model_draft(s, seq, tokens, capped, n_batch, base, proposal);
        if (!by_model.empty() && !out.empty()) {  // the lookup's proposal is checked against what follows
            s.unverified = std::move(out);
            s.unverified_at = tokens.size();
        }
        if (!by_model.empty()) out = std::move(by_model);
    }
    if ((int)out.size() < p.n_min) {
        out.clear();
        s.last = Source::None;
    }
    return out;
}

// The lookup's proposal (also in `proposal` as found), cut to the length the cost model prefers for its
// acceptance so far; one that is not verified (cut to nothing) is checked against the tokens that follow.
std::vector<int32_t> Speculator::ngram_draft(Sequence& s, const std::vector<int32_t>& tokens, int n_max, int base, std::vector<int32_t>& proposal) {
    if (!s.unverified.empty() && tokens.size() > s.unverified_at) {
        size_t kept = 0;
        const size_t seen = std::min(s.unverified.size(), tokens.size() - s.unverified_at);
        while (kept < seen && tokens[s.unverified_at + kept] == s.unverified[kept]) kept++;
        s.ngram_outcome(kept, kept < seen);
        s.unverified.clear();
    }
    proposal = s.lookup.draft(tokens, o_.ngram_n, n_max);
    std::vector<int32_t> out = proposal;
    if (out.empty() || !o_.backoff) {
        s.last = out.empty() ? Source::None : Source::Ngram;
        return out;
    }
    const int k = cost_.best_length(s.ngram_acceptance(), (int)out.size(), base, 0);
    if (k == 0) {
        s.unverified = std::move(out);
        s.unverified_at = tokens.size();
        return {};
    }
    out.resize(k);
    s.last = Source::Ngram;
    return out;
}

// With both drafters: whether the lookup's draft (k tokens, as the cost model cut it) is expected to
// make more tokens per ms alone than the draft model's calls have made so far (their measured yield
// and time, a checked proposal's tokens included). Then the draft model is not called this step: on a
// copied stretch (a rewrite's renames learnt) its check is one more batch for tokens the lookup has
// already; its cache catches up on its next call.
bool Speculator::lookup_outruns_model(const Sequence& s, int k, int base) const {
    if (!o_.backoff || !s.model_tried || k == 0 || !cost_.measured()) return false;
    const double lookup_rate = cost_.rate(llm::DraftCost::expected_kept(s.ngram_acceptance(), k), k, 0, base);
    return lookup_rate >= cost_.rate(s.model_kept, s.model_drafted, s.model_ms, base);
}

// The draft model's draft, checking the lookup's proposal in one batch when there is one. The tokens it
// drafts alone are capped where the next one's expected yield no longer pays for its decode; the whole
// draft where the next token no longer pays for its verification. The catch-up of tokens drafted by the
// lookup or skipped while backing off is not counted in the call's cost.
std::vector<int32_t> Speculator::model_draft(Sequence& s, int seq, const std::vector<int32_t>& tokens, const llm::DraftParams& p, int n_batch,
                                             int base, const std::vector<int32_t>& proposal) {
    llm::DraftParams capped = p;
    int n_own_max = p.n_max;
    if (o_.backoff && s.model_tried) {
        auto cap = [&](double ms_per_token) { return std::min(p.n_max, std::max({1, p.n_min, cost_.best_length(s.model_acceptance(), p.n_max, base, ms_per_token)})); };
        n_own_max = cap(s.model_ms / std::max(1.0, s.model_decodes));
        capped.n_max = proposal.empty() ? n_own_max : cap(0);
    }
    std::vector<int32_t> out;
    try {
        const double t0 = now_seconds();
        if (draft_->cached_prefix(seq, tokens) + 2 < tokens.size())  // more than the usual last one or two
            draft_->feed(seq, std::vector<int32_t>(tokens.begin(), tokens.end() - 1), n_batch);
        const double t1 = now_seconds();
        out = draft_->draft(seq, tokens, capped, n_batch, proposal, n_own_max);
        s.call_ms = (now_seconds() - t1) * 1000;
        counters_.catch_up_ms += (t1 - t0) * 1000;
        counters_.model_ms += s.call_ms;
    } catch (const llm::Error& e) {
        log_msg('W', "draft model: %s (no draft this step)", e.what());
        return {};
    }
    s.call_decodes = draft_->last_decodes();
    s.call_base = base;
    counters_.model_calls++;
    counters_.model_decodes += draft_->last_decodes();
    counters_.checked += !proposal.empty();
    counters_.confirmed += draft_->last_confirmed();
    if ((int)out.size() < p.n_min) out.clear();
    if (out.empty()) record_model_call(s, 0, 0);
    else s.last = Source::Model;
    return out;
}

// The draft model's averages after a call, and whether the sequence backs off from it.
void Speculator::record_model_call(Sequence& s, int n_drafted, int n_kept) {
    const double w = s.model_tried ? 0.25 : 1.0;  // the first call sets the averages
    s.model_ms += w * (s.call_ms - s.model_ms);
    s.model_decodes += w * (s.call_decodes - s.model_decodes);
    s.model_drafted += w * (n_drafted - s.model_drafted);
    s.model_kept += w * (n_kept - s.model_kept);
    s.model_kept_sum = 0.9 * s.model_kept_sum + n_kept;
    s.model_rejected = 0.9 * s.model_rejected + (n_kept < n_drafted);
    s.model_tried = true;
    if (!o_.backoff) return;
    if (cost_.pays(s.model_kept, s.model_drafted, s.model_ms, s.call_base)) {
        s.backoff = 1;
    } else if (s.backoff > kMaxBackoff) {
        s.skip = kGaveUp;
    } else {
        s.skip = s.backoff;
        s.backoff *= 2;
    }
}

void Speculator::prefill(int seq, const std::vector<int32_t>& tokens, int n_batch) {
    if (draft_) draft_->feed(seq, tokens, n_batch);
}

void Speculator::record(int seq, int n_drafted, int n_accepted) {
    Sequence& s = seqs_[seq];
    if (s.last == Source::Ngram) {
        s.ngram_outcome(n_accepted, n_accepted < n_drafted);
    } else if (s.last == Source::Model) {
        record_model_call(s, n_drafted, n_accepted);
    }
    s.last = Source::None;
}

std::string Speculator::describe() const {
    std::string s;
    if (o_.ngram) s = "n-gram lookup (suffixes of " + std::to_string(o_.ngram_n) + "..2 tokens, following renames)";
    if (draft_) s += (s.empty() ? "draft model " : ", then draft model ") + o_.model;
    return s + "; draft-max " + std::to_string(o_.draft.n_max) + ", draft-min " + std::to_string(o_.draft.n_min) + ", p-min " +
           std::to_string(o_.draft.p_min);
}

}  // namespace srv
