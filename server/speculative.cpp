// Speculative decoding's drafters (see speculative.hpp).
#include "speculative.hpp"

#include <algorithm>

#include "util.hpp"

namespace srv {

namespace {

const int kMaxDraft = 256;  // --draft-max's bound: the cap of a sequence before its first draft

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
    return cp;
}

}  // namespace

Speculator::Speculator(const Options& o, const llm::Model& target, const llm::Context& target_ctx, int n_seq)
    : o_(o.spec), cap_(n_seq, kMaxDraft) {
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

void Speculator::reset(int seq) { cap_[seq] = kMaxDraft; }

std::vector<int32_t> Speculator::draft(int seq, const std::vector<int32_t>& tokens, const llm::DraftParams& p, int room, int n_batch) {
    llm::DraftParams capped = p;
    capped.n_max = std::min({p.n_max, room, std::max(cap_[seq], p.n_min)});
    if (capped.n_max <= 0 || capped.n_max < p.n_min) return {};
    std::vector<int32_t> out;
    if (o_.ngram) out = llm::ngram_draft(tokens, o_.ngram_n, capped.n_max);
    if (out.empty() && draft_) {
        try {
            out = draft_->draft(seq, tokens, capped, n_batch);
        } catch (const llm::Error& e) {
            log_msg('W', "draft model: %s (no draft this step)", e.what());
        }
    }
    if ((int)out.size() < p.n_min) out.clear();
    return out;
}

void Speculator::prefill(int seq, const std::vector<int32_t>& tokens, int n_batch) {
    if (draft_) draft_->feed(seq, tokens, n_batch);
}

void Speculator::record(int seq, int n_drafted, int n_accepted) {
    if (n_drafted == 0) return;
    cap_[seq] = n_accepted == n_drafted ? std::min(kMaxDraft, 2 * n_drafted) : n_accepted + 1;
}

std::string Speculator::describe() const {
    std::string s;
    if (o_.ngram) s = "n-gram lookup (suffixes of " + std::to_string(o_.ngram_n) + "..2 tokens)";
    if (draft_) s += (s.empty() ? "draft model " : ", then draft model ") + o_.model;
    return s + "; draft-max " + std::to_string(o_.draft.n_max) + ", draft-min " + std::to_string(o_.draft.n_min) + ", p-min " +
           std::to_string(o_.draft.p_min);
}

}  // namespace srv
