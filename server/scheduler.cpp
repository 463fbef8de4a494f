// The scheduler (see scheduler.hpp).
#include "scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "util.hpp"

namespace srv {

void Channel::push(Result r) {
    {
        std::lock_guard<std::mutex> lock(mu);
        q.push_back(std::move(r));
    }
    cv.notify_one();
}

bool Channel::pop(Result& r, int timeout_ms) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !q.empty(); })) return false;
    r = std::move(q.front());
    q.pop_front();
    return true;
}

Scheduler::Scheduler(const llm::Model& model, llm::Context& ctx, const SchedulerConfig& cfg, Speculator* spec)
    : model_(model), ctx_(ctx), cfg_(cfg), spec_(spec), n_ctx_slot_(ctx.n_ctx_seq()), n_vocab_(model.hp.n_vocab) {
    slots_.resize(cfg_.n_slots);
    for (int i = 0; i < cfg_.n_slots; i++) slots_[i].id = i;
    ram_.set_limit(cfg_.ram_cache_bytes);
    publish();
}

// ---- any thread ------------------------------------------------------------------------------------

std::unique_ptr<Task> Scheduler::make_task(std::vector<int32_t> prompt, const TaskParams& p) {
    auto t = std::make_unique<Task>();
    t->id = next_task_id_++;
    t->prompt = std::move(prompt);
    t->p = p;
    t->ch = std::make_shared<Channel>();
    return t;
}

// Queues tasks together, or none of them.
void Scheduler::enqueue(std::vector<std::unique_ptr<Task>> tasks) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        // Requests that will wait for a slot: the queue beyond the idle slots.
        int waiting = (int)queue_.size() - (cfg_.n_slots - n_busy_);
        if (waiting >= cfg_.max_queue) {
            throw ApiError(503, "server is busy: " + std::to_string(queue_.size()) + " requests are waiting for a slot (--max-queue " +
                                    std::to_string(cfg_.max_queue) + ")", "unavailable_error");
        }
        for (auto& t : tasks) queue_.push_back(std::move(t));
    }
    cv_.notify_one();
}

std::shared_ptr<Channel> Scheduler::submit(std::vector<int32_t> prompt, const TaskParams& p) {
    std::vector<std::unique_ptr<Task>> tasks;
    tasks.push_back(make_task(std::move(prompt), p));
    auto ch = tasks[0]->ch;
    enqueue(std::move(tasks));
    return ch;
}

std::vector<std::shared_ptr<Channel>> Scheduler::submit_n(const std::vector<int32_t>& prompt, const TaskParams& p, int n_cmpl) {
    std::vector<std::unique_ptr<Task>> tasks;
    std::vector<std::shared_ptr<Channel>> chs;
    for (int i = 0; i < n_cmpl; i++) {
        tasks.push_back(make_task(prompt, p));
        if (i > 0) tasks[i]->parent = tasks[0]->id;
        chs.push_back(tasks[i]->ch);
    }
    enqueue(std::move(tasks));
    return chs;
}

void Scheduler::cancel(const std::shared_ptr<Channel>& ch) {
    ch->cancelled = true;
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_one();
}

std::vector<SlotView> Scheduler::slot_views() const {
    std::lock_guard<std::mutex> lock(mu_);
    return views_;
}

Load Scheduler::load() const {
    std::lock_guard<std::mutex> lock(mu_);
    Load l;
    l.stats = stats_;
    l.busy = n_busy_;
    l.deferred = std::max(0, (int)queue_.size() - (cfg_.n_slots - n_busy_));
    return l;
}

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
}

SlotActionResult Scheduler::slot_action(const SlotAction& a) {
    auto pa = std::make_shared<PendingAction>();
    pa->action = a;
    std::unique_lock<std::mutex> lock(mu_);
    actions_.push_back(pa);
    cv_.notify_one();
    actions_cv_.wait(lock, [&] { return pa->done; });
    return pa->result;
}

// ---- scheduler thread ------------------------------------------------------------------------------

Slot* Scheduler::pick_slot(const Task& t, const std::vector<bool>& taken) {
    if (t.p.id_slot >= 0) {
        Slot& s = slots_[t.p.id_slot];
        return s.task || taken[s.id] ? nullptr : &s;
    }
    Slot *best = nullptr, *lru = nullptr;
    size_t best_len = 0;
    for (Slot& s : slots_) {
        if (s.task || taken[s.id]) continue;
        size_t n = t.p.cache_prompt ? common_prefix(s.cache, t.prompt) : 0;
        if (n > best_len || (n == best_len && best && s.last_used < best->last_used)) {
            if (n > 0) { best = &s; best_len = n; }
        }
        if (!lru || s.last_used < lru->last_used) lru = &s;
    }
    return best ? best : lru;
}

void Scheduler::start_task(Slot& s, std::unique_ptr<Task> t) {
    const std::vector<int32_t>& prompt = t->prompt;
    const bool reuse_cache = t->p.cache_prompt && !t->p.embed;  // pooling needs every token in one batch
    size_t reuse = reuse_cache ? common_prefix(s.cache, prompt) : 0;
    if (ram_.enabled() && !t->p.embed) {
        // What this request would overwrite goes to host RAM first; a saved state sharing a longer
        // prefix with the prompt comes back.
        if (s.cache.size() > reuse && s.cache.size() >= 16) ram_.save(s.cache, ctx_.seq_save(s.id, (int)s.cache.size()));
        size_t len = 0;
        if (t->p.cache_prompt) {
            RamCache::Entry* e = ram_.best(prompt, reuse, &len);
            // In a unified pool, only when the cells are free anyway (a restore must not push out
            // running requests).
            if (e && (int)(e->tokens.size() + s.cache.size()) <= pool_room()) {
                try {
                    ctx_.seq_restore(s.id, e->blob);
                    s.cache = e->tokens;
                    reuse = len;
                    log_msg('I', "slot %d: restored %zu tokens from the RAM cache (%zu of them reused)", s.id, e->tokens.size(), len);
                } catch (const llm::Error& err) {  // the sequence is empty now
                    log_msg('W', "slot %d: RAM cache restore failed: %s", s.id, err.what());
                    s.cache.clear();
                    reuse = 0;
                }
            }
        }
    }
    if (reuse_cache && t->parent >= 0) reuse = copy_parent_prefix(s, *t, reuse);
    if (reuse_cache && t->p.n_cache_reuse > 0) reuse = reuse_chunks(s, *t, reuse);
    if (reuse >= prompt.size()) reuse = prompt.size() - 1;  // the last prompt token gives the logits
    ctx_.seq_truncate(s.id, (int)reuse);
    s.cache.resize(reuse);
    s.target = prompt;
    s.sampler = std::make_unique<llm::Sampler>(t->p.sampling, &model_.vocab);
    for (int32_t tok : prompt) s.sampler->accept(tok, false);  // the prompt is not the grammar's text
    s.generating = false;
    s.n_prompt = (int)prompt.size();
    s.n_cache_reused = (int)reuse;
    s.n_prompt_evaluated = s.n_decoded = s.n_shifts = 0;
    s.text.clear();
    s.n_sent = 0;
    s.unsent_tokens.clear();
    s.unsent_probs.clear();
    s.t_start = now_seconds();
    s.t_first = 0;
    s.stop_type = "none";
    s.stopping_word.clear();
    s.truncated = false;
    s.embedding.clear();
    const TaskParams& tp = t->p;
    s.thinking = tp.reasoning_budget < 0 || tp.think_end_tokens.empty() ? Slot::Thinking::Over
                 : tp.thinking_open                                     ? Slot::Thinking::Inside
                                                                        : Slot::Thinking::Before;
    s.n_thinking = 0;
    s.forced.clear();
    s.drafted.clear();
    s.n_draft = s.n_draft_accepted = 0;
    if (spec_) spec_->reset(s.id);
    s.line_start = 0;
    s.line_checked = false;
    log_msg('I', "slot %d: task %lld: prompt %zu tokens, %zu cached, n_predict %d", s.id, (long long)t->id, prompt.size(), reuse,
            t->p.n_predict);
    s.task = std::move(t);
}

// n_cmpl: a child task starts from a copy of the cache of the slot that shares most of its prompt
// (its parent's, evaluated by now) instead of evaluating the prompt again.
size_t Scheduler::copy_parent_prefix(Slot& s, const Task& t, size_t reuse) {
    Slot* donor = nullptr;
    size_t best = reuse;
    for (Slot& o : slots_) {
        const size_t n = &o == &s ? 0 : common_prefix(o.cache, t.prompt);
        if (n > best) { best = n; donor = &o; }
    }
    // In a unified pool, only when the cells are free anyway (a copy must not push out running requests).
    if (!donor || (cfg_.kv_unified && (int)best > pool_room() + (int)s.cache.size())) return reuse;
    try {
        ctx_.seq_copy(donor->id, s.id, (int)best);
    } catch (const llm::Error& e) {  // the sequence is empty now
        log_msg('W', "slot %d: copying slot %d's prompt failed: %s", s.id, donor->id, e.what());
        s.cache.clear();
        return 0;
    }
    s.cache.assign(donor->cache.begin(), donor->cache.begin() + best);
    return best;
}

// --cache-reuse N / n_cache_reuse, as llama-server: past the common prefix, each run of at least N
// cached tokens that comes next in the prompt moves to its new position (the keys re-rotated) instead
// of being evaluated again; shorter runs are skipped in the cache. Returns the reusable tokens.
size_t Scheduler::reuse_chunks(Slot& s, const Task& t, size_t reuse) {
    const std::vector<int32_t>& prompt = t.prompt;
    size_t head_c = reuse, head_p = reuse;
    while (head_c < s.cache.size() && head_p < prompt.size()) {
        size_t n = 0;
        while (head_c + n < s.cache.size() && head_p + n < prompt.size() && s.cache[head_c + n] == prompt[head_p + n]) n++;
        if (n < (size_t)t.p.n_cache_reuse) {
            head_c++;
            continue;
        }
        if (!ctx_.seq_move(s.id, (int)head_c, (int)head_p, (int)n)) {
            log_msg('W', "slot %d: --cache-reuse: the KV cache cannot be shifted on the offload device: evaluating the prompt instead", s.id);
            break;
        }
        std::copy(s.cache.begin() + head_c, s.cache.begin() + head_c + n, s.cache.begin() + head_p);
        log_msg('D', "slot %d: --cache-reuse: %zu cached tokens moved from position %zu to %zu", s.id, n, head_c, head_p);
        head_c += n;
        head_p += n;
    }
    return head_p;
}

void Scheduler::release(Slot& s) {
    s.task.reset();
    s.generating = false;
    s.target = s.cache;
    s.last_used = ++use_clock_;
    std::lock_guard<std::mutex> lock(mu_);
    n_busy_--;
}

void Scheduler::fail_slot(Slot& s, int status, const std::string& msg) {
    Result r;
    r.kind = Result::Error;
    r.status = status;
    r.message = msg;
    s.task->ch->push(std::move(r));
    release(s);
}

// Sends the generated text that is final: not the start of a possible stop string, not an incomplete
// UTF-8 sequence.
void Scheduler::emit_partial(Slot& s) {
    size_t hold = incomplete_utf8_tail(s.text);
    for (const std::string& stop : s.task->p.stop) {
        for (size_t k = std::min(stop.size() - 1, s.text.size()); k > hold; k--) {
            if (s.text.compare(s.text.size() - k, k, stop, 0, k) == 0) { hold = k; break; }
        }
    }
    size_t end = std::max(s.n_sent, s.text.size() - hold);
    if (end == s.n_sent) return;
    Result r;
    r.text = s.text.substr(s.n_sent, end - s.n_sent);
    r.slot = s.id;
    r.n_prompt = s.n_prompt;
    r.n_cache_reused = s.n_cache_reused;
    r.n_predicted = s.n_decoded;
    r.n_prompt_evaluated = s.n_prompt_evaluated;  // timings_per_token
    r.prompt_ms = (s.t_first - s.t_start) * 1000;
    r.predicted_ms = (now_seconds() - s.t_first) * 1000;
    r.tokens.swap(s.unsent_tokens);
    r.probs = std::move(s.unsent_probs);
    s.unsent_probs.clear();
    s.n_sent = end;
    s.task->ch->push(std::move(r));
}

// Prompt evaluation so far (cached tokens included), for return_progress.
void Scheduler::send_progress(Slot& s) {
    Result r;
    r.kind = Result::Progress;
    r.slot = s.id;
    r.n_prompt = s.n_prompt;
    r.n_cache_reused = s.n_cache_reused;
    r.n_prompt_evaluated = s.n_cache_reused + s.n_prompt_evaluated;
    r.prompt_ms = (now_seconds() - s.t_start) * 1000;
    s.task->ch->push(std::move(r));
}

// Slot actions waiting for the scheduler thread, answered in order.
void Scheduler::run_slot_actions() {
    std::vector<std::shared_ptr<PendingAction>> todo;
    {
        std::lock_guard<std::mutex> lock(mu_);
        todo.assign(actions_.begin(), actions_.end());
        actions_.clear();
    }
    for (auto& pa : todo) {
        SlotActionResult r = do_slot_action(pa->action);
        std::lock_guard<std::mutex> lock(mu_);
        pa->result = r;
        pa->done = true;
    }
    if (!todo.empty()) {
        publish();
        actions_cv_.notify_all();
    }
}

namespace {

// A slot file: "LLMSLOT1", the token count (int32), the tokens (int32 each), then the KV blob.
const char kSlotMagic[8] = {'L', 'L', 'M', 'S', 'L', 'O', 'T', '1'};

SlotActionResult action_error(int status, const std::string& msg) {
    SlotActionResult r;
    r.status = status;
    r.error = msg;
    return r;
}

}  // namespace

SlotActionResult Scheduler::do_slot_action(const SlotAction& a) {
    if (a.slot < 0 || a.slot >= (int)slots_.size()) return action_error(400, "invalid slot id " + std::to_string(a.slot));
    Slot& s = slots_[a.slot];
    if (s.task) return action_error(409, "slot " + std::to_string(a.slot) + " is processing a request");
    const double t0 = now_seconds();
    SlotActionResult r;
    if (a.kind == SlotAction::Erase) {
        r.n_tokens = (int)s.cache.size();
        ctx_.seq_truncate(s.id, 0);
        s.cache.clear();
        s.target.clear();
    } else {
        r = a.kind == SlotAction::Save ? save_slot(s, a.path) : restore_slot(s, a.path);
        if (r.status != 200) return r;
    }
    r.ms = (now_seconds() - t0) * 1000;
    s.last_used = ++use_clock_;
    log_msg('I', "slot %d: %s %d tokens", s.id, a.kind == SlotAction::Save ? "saved" : a.kind == SlotAction::Restore ? "restored" : "erased",
            r.n_tokens);
    return r;
}

SlotActionResult Scheduler::save_slot(Slot& s, const std::string& path) {
    std::vector<uint8_t> blob = ctx_.seq_save(s.id, (int)s.cache.size());
    const int32_t n = (int32_t)s.cache.size();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(kSlotMagic, sizeof kSlotMagic);
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(reinterpret_cast<const char*>(s.cache.data()), (std::streamsize)(n * sizeof(int32_t)));
    f.write(reinterpret_cast<const char*>(blob.data()), (std::streamsize)blob.size());
    if (!f.flush()) return action_error(500, "cannot write the slot file");
    SlotActionResult r;
    r.n_tokens = n;
    r.n_bytes = sizeof kSlotMagic + sizeof n + n * sizeof(int32_t) + blob.size();
    return r;
}

// Reads only what a sequence of the file's token count takes in this context, and checks it all
// before the slot's cache is replaced.
SlotActionResult Scheduler::restore_slot(Slot& s, const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return action_error(404, "slot file not found");
    char magic[sizeof kSlotMagic] = {};
    int32_t n = -1;
    f.read(magic, sizeof magic);
    f.read(reinterpret_cast<char*>(&n), sizeof n);
    if (!f || memcmp(magic, kSlotMagic, sizeof magic) != 0 || n < 0 || n > n_ctx_slot_) return action_error(400, "not a slot file of this server");
    std::vector<int32_t> tokens(n);
    f.read(reinterpret_cast<char*>(tokens.data()), (std::streamsize)(n * sizeof(int32_t)));
    const size_t blob_size = sizeof(int32_t) + ctx_.kv_bytes_per_token() * (size_t)n;
    std::vector<uint8_t> blob(blob_size);
    f.read(reinterpret_cast<char*>(blob.data()), (std::streamsize)blob_size);
    const bool trailing = f.peek() != std::char_traits<char>::eof();
    if (!f || trailing) return action_error(400, "the slot file does not fit this server's context");
    for (int32_t t : tokens) {
        if (t < 0 || t >= n_vocab_) return action_error(400, "the slot file holds a token outside the vocabulary");
    }
    if (cfg_.kv_unified && n > pool_room() + (int)s.cache.size()) return action_error(503, "the KV cache pool has no room for the slot file");
    try {
        ctx_.seq_restore(s.id, blob);
    } catch (const llm::Error& e) {  // the sequence is empty now
        s.cache.clear();
        s.target.clear();
        return action_error(400, std::string("the slot file does not fit this server's context: ") + e.what());
    }
    s.cache = tokens;
    s.target = tokens;
    SlotActionResult r;
    r.n_tokens = n;
    r.n_bytes = sizeof kSlotMagic + sizeof n + n * sizeof(int32_t) + blob_size;
    return r;
}

TokenProb Scheduler::token_prob(const float* logits, int32_t tok, const Slot& s) const {
    float mx = *std::max_element(logits, logits + n_vocab_);
    double sum = 0;
    for (int i = 0; i < n_vocab_; i++) sum += std::exp((double)logits[i] - mx);
    TokenProb tp;
    tp.id = tok;
    tp.logprob = (double)logits[tok] - mx - std::log(sum);
    tp.top = s.sampler->top_probs(logits, n_vocab_, s.task->p.n_probs);
    return tp;
}

void Scheduler::finish(Slot& s, const std::string& stop_type) {
    const double now = now_seconds();
    if (s.t_first == 0) s.t_first = now;
    Result r;
    r.kind = Result::Final;
    r.text = s.n_sent < s.text.size() ? s.text.substr(s.n_sent) : "";
    r.tokens.swap(s.unsent_tokens);
    r.probs = std::move(s.unsent_probs);
    s.unsent_probs.clear();
    r.slot = s.id;
    r.n_prompt = s.n_prompt;
    r.n_prompt_evaluated = s.n_prompt_evaluated;
    r.n_cache_reused = s.n_cache_reused;
    r.n_predicted = s.n_decoded;
    r.n_cache = (int)s.cache.size();
    r.n_draft = s.n_draft;
    r.n_draft_accepted = s.n_draft_accepted;
    r.stop_type = stop_type;
    r.stopping_word = s.stopping_word;
    r.truncated = s.truncated;
    r.embedding = std::move(s.embedding);
    r.prompt_ms = (s.t_first - s.t_start) * 1000;
    r.predicted_ms = (now - s.t_first) * 1000;
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.prompt_tokens += s.n_prompt_evaluated;
        stats_.prompt_s += r.prompt_ms / 1000;
        stats_.predicted_tokens += s.n_decoded;
        stats_.predicted_s += r.predicted_ms / 1000;
        stats_.requests_done++;
    }
    const std::string shifts = s.n_shifts ? ", " + std::to_string(s.n_shifts) + " context shifts" : "";
    const std::string drafts = s.n_draft ? ", " + std::to_string(s.n_draft_accepted) + " of " + std::to_string(s.n_draft) + " drafted accepted" : "";
    log_msg('I', "slot %d: task %lld done (%s): prompt %d tokens, %d evaluated in %.1f ms; %d predicted in %.1f ms (%.2f tokens/s)%s%s",
            s.id, (long long)s.task->id, stop_type.c_str(), s.n_prompt, s.n_prompt_evaluated, r.prompt_ms, s.n_decoded, r.predicted_ms,
            r.predicted_ms > 0 ? 1000.0 * s.n_decoded / r.predicted_ms : 0.0, shifts.c_str(), drafts.c_str());
    s.task->ch->push(std::move(r));
    release(s);
}

// --context-shift: the slot is full. Keep the first n_keep tokens, drop half of the rest, and move the
// tail to its new positions with its keys re-rotated, as llama-server shifts its cache (where the
// cache cannot move, on an offload device, the tail is evaluated again instead).
void Scheduler::context_shift(Slot& s) {
    const int n_cached = (int)s.cache.size();
    int n_keep = s.task->p.n_keep < 0 ? s.n_prompt : s.task->p.n_keep;
    n_keep = std::max(0, std::min(n_keep, n_cached - 2));
    const int n_discard = (n_cached - n_keep) / 2, n_tail = n_cached - n_keep - n_discard;
    std::vector<int32_t> t(s.target.begin(), s.target.begin() + n_keep);
    t.insert(t.end(), s.target.begin() + n_keep + n_discard, s.target.end());
    s.target = std::move(t);
    const bool moved = ctx_.seq_move(s.id, n_keep + n_discard, n_keep, n_tail);
    const int n_left = moved ? n_keep + n_tail : n_keep;
    ctx_.seq_truncate(s.id, n_left);
    s.cache.assign(s.target.begin(), s.target.begin() + n_left);
    s.n_shifts++;
    log_msg('I', "slot %d: context shift: keep %d, discard %d, %s %d tokens", s.id, n_keep, n_discard, moved ? "shift" : "evaluate again", n_tail);
}

// n_indent and t_max_predict_ms, as llama-server (for code completion): each line after the first must
// start with n_indent blanks (a line with fewer ends the generation, cut before its first non-blank
// byte), and a new line after t_max_predict_ms of generation ends it. True when the slot finished.
bool Scheduler::limit_lines(Slot& s, size_t piece_at) {
    const TaskParams& p = s.task->p;
    while (p.n_indent > 0) {
        if (s.line_start > 0 && !s.line_checked) {
            size_t pos = s.line_start;
            while (pos < s.text.size() && (s.text[pos] == ' ' || s.text[pos] == '\t')) pos++;
            if (pos == s.text.size()) break;  // only blanks so far
            s.line_checked = true;
            if ((int)(pos - s.line_start) < p.n_indent) {
                s.text.resize(pos);
                s.n_sent = std::min(s.n_sent, pos);
                finish(s, "limit");
                return true;
            }
        }
        const size_t nl = s.text.find('\n', s.line_start);
        if (nl == std::string::npos) break;
        s.line_start = nl + 1;
        s.line_checked = false;
    }
    if (p.t_max_predict_ms > 0 && s.text.find('\n', piece_at) != std::string::npos &&
        (now_seconds() - s.t_first) * 1000 > p.t_max_predict_ms) {
        finish(s, "limit");
        return true;
    }
    return false;
}

// --reasoning-budget, before each token: a thinking block opens when the output starts with its tag,
// ends with the end tag, and once it holds the budget's tokens the end tag is forced.
void Scheduler::budget_thinking(Slot& s) {
    const TaskParams& p = s.task->p;
    if (s.thinking == Slot::Thinking::Over || !s.forced.empty()) return;
    const size_t start = s.text.find_first_not_of(" \t\r\n");
    if (s.thinking == Slot::Thinking::Before) {
        if (start == std::string::npos) return;  // only spaces so far
        const std::string head = s.text.substr(start, p.think_open.size());
        if (head.size() < p.think_open.size() && p.think_open.compare(0, head.size(), head) == 0) return;  // undecided
        if (head != p.think_open) {
            s.thinking = Slot::Thinking::Over;  // the answer starts without thinking
            return;
        }
        s.thinking = Slot::Thinking::Inside;
    }
    if (s.text.find(p.think_end) != std::string::npos) {
        s.thinking = Slot::Thinking::Over;
        return;
    }
    if (s.n_thinking >= p.reasoning_budget) {
        s.forced.assign(p.think_end_tokens.begin(), p.think_end_tokens.end());
        s.thinking = Slot::Thinking::Over;
        log_msg('D', "slot %d: reasoning budget of %d tokens spent: ending the thinking", s.id, p.reasoning_budget);
    }
}

void Scheduler::on_logits(Slot& s, const float* logits) {
    const TaskParams& p = s.task->p;
    if (!s.generating) {
        s.generating = true;
        s.t_first = now_seconds();
        if (p.n_predict == 0) return finish(s, "limit");
    }
    budget_thinking(s);
    int32_t tok = 0;
    try {  // a grammar can reach a state no token continues, or one too ambiguous to follow
        if (!s.forced.empty()) {
            tok = s.forced.front();
            s.forced.pop_front();
        } else {
            tok = s.sampler->sample(logits, n_vocab_);
        }
        s.sampler->accept(tok);
    } catch (const llm::Error& e) {
        return fail_slot(s, 500, std::string("sampling failed: ") + e.what());
    }
    s.n_decoded++;
    if (s.thinking == Slot::Thinking::Inside) s.n_thinking++;
    if (p.n_probs > 0) s.unsent_probs.push_back(token_prob(logits, tok, s));
    const llm::Vocab& v = model_.vocab;
    if (v.is_eog(tok) && !p.ignore_eos) return finish(s, "eos");
    s.unsent_tokens.push_back(tok);
    const size_t before = s.text.size();
    s.text += v.token_to_piece(tok, cfg_.special);
    size_t stop_at = std::string::npos;
    for (const std::string& stop : p.stop) {  // the earliest match that ends in the new piece
        size_t at = s.text.find(stop, before > stop.size() ? before - stop.size() : 0);
        if (at < stop_at) { stop_at = at; s.stopping_word = stop; }
    }
    if (stop_at != std::string::npos) {
        s.text.resize(stop_at);
        s.n_sent = std::min(s.n_sent, stop_at);
        return finish(s, "word");
    }
    if (limit_lines(s, before)) return;
    if (p.n_predict > 0 && s.n_decoded >= p.n_predict) return finish(s, "limit");
    s.target.push_back(tok);
    if ((int)s.cache.size() >= n_ctx_slot_) {  // no cell left for the token just sampled
        if (!cfg_.context_shift) {
            s.target.pop_back();
            log_msg('W', "slot %d: context full (%d tokens): stopping", s.id, n_ctx_slot_);
            return finish(s, "limit");
        }
        context_shift(s);
    }
    emit_partial(s);
}

// Drafts for the generating slots that speculate, within what the step's budget leaves beyond every
// generating slot's next token, the slot's cells and the tokens the request may still produce.
void Scheduler::plan_drafts(size_t budget) {
    size_t n_next = 0;
    for (Slot& s : slots_) n_next += s.task && s.pending() == 1;
    size_t spare = budget > n_next ? budget - n_next : 0;
    for (Slot& s : slots_) {
        s.drafted.clear();
        if (!spec_ || !s.task || !s.generating || s.pending() != 1 || spare == 0) continue;
        const TaskParams& p = s.task->p;
        if (p.speculative.n_max <= 0 || p.embed) continue;
        int room = std::min<int>((int)spare, n_ctx_slot_ - 1 - (int)s.cache.size());  // drafts follow the pending token
        if (p.n_predict > 0) room = std::min(room, p.n_predict - s.n_decoded - 1);
        s.drafted = spec_->draft(s.id, s.target, p.speculative, room, cfg_.budget, (int)(budget - spare));
        spare -= s.drafted.size();
    }
}

// The target's verdict on a slot's draft: each position is sampled as it would be without one, and a
// drafted token stays while it equals that sample (its KV row is in place); the rest leaves the cache.
void Scheduler::verify(Slot& s, int first_logits) {
    const std::vector<int32_t> draft = std::move(s.drafted);
    s.drafted.clear();
    s.n_draft += (int)draft.size();
    int accepted = 0;
    for (size_t i = 0;; i++) {
        on_logits(s, ctx_.logits(first_logits + (int)i));
        if (i == draft.size() || !s.task || s.pending() != 1 || s.target.back() != draft[i]) break;
        s.cache.push_back(draft[i]);
        s.n_draft_accepted++;
        accepted++;
    }
    ctx_.seq_truncate(s.id, (int)s.cache.size());
    spec_->record(s.id, (int)draft.size(), accepted);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.n_draft_tokens += draft.size();
    stats_.n_draft_accepted += accepted;
    stats_.n_drafts++;
}

// An embedding task's prompt is evaluated: its pooled vector (normalized as asked), or with
// Pooling::None every token's. Returns how many output entries it used.
int Scheduler::on_embeddings(Slot& s, int first_output) {
    s.t_first = now_seconds();
    const int n = ctx_.n_embd_out();
    int used = 1;
    if (ctx_.pooling() == llm::Pooling::None) {
        used = s.n_prompt;
        for (int i = 0; i < used; i++) s.embedding.emplace_back(ctx_.embeddings(first_output + i), ctx_.embeddings(first_output + i) + n);
    } else {
        s.embedding.emplace_back(n);
        llm::embd_normalize(ctx_.seq_embeddings(s.id), s.embedding[0].data(), n, s.task->p.embd_normalize);
    }
    finish(s, "none");
    return used;
}

// One scheduler step: one Batch, one decode. Returns false when there was nothing to evaluate.
bool Scheduler::step(llm::Batch& batch) {
    struct Part { Slot* s; size_t n; bool logits; };
    std::vector<Part> parts;
    batch.clear();
    size_t n_next = 0;  // generating slots: one token each
    for (Slot& s : slots_) n_next += s.task && s.pending() == 1;
    if (!make_room(std::max<size_t>(n_next, 1))) return false;
    size_t budget = std::min((size_t)cfg_.budget, (size_t)pool_room());
    plan_drafts(budget);
    auto add = [&](Slot& s, size_t n) {
        const size_t from = s.cache.size();
        const bool logits = n == s.pending();
        const bool every_token = s.task->p.embed && ctx_.pooling() == llm::Pooling::None;
        for (size_t i = 0; i < n; i++) batch.add(s.target[from + i], (int32_t)(from + i), s.id, logits && (every_token || i == n - 1));
        parts.push_back({&s, n, logits});
        budget -= n;
    };
    // The next token of every generating slot first (with its draft), then prompt chunks, oldest request first.
    for (Slot& s : slots_) {
        if (!s.task || s.pending() != 1 || budget == 0) continue;
        add(s, 1);
        for (size_t i = 0; i < s.drafted.size(); i++) batch.add(s.drafted[i], (int32_t)(s.cache.size() + 1 + i), s.id, true);
        budget -= s.drafted.size();
    }
    std::vector<Slot*> prefill;
    for (Slot& s : slots_) {
        if (s.task && s.pending() > 1) prefill.push_back(&s);
    }
    std::sort(prefill.begin(), prefill.end(), [](Slot* a, Slot* b) { return a->task->id < b->task->id; });
    for (Slot* s : prefill) {
        if (budget == 0) break;
        if (s->task->p.embed && s->pending() > budget) continue;  // pooled whole: wait for a step with room
        add(*s, std::min(budget, s->pending()));
    }
    if (parts.empty()) return false;
    const double t_decode = now_seconds();
    try {
        ctx_.decode(batch);
    } catch (const llm::Error& e) {
        log_msg('E', "decode failed: %s", e.what());
        // Out of device memory: the server stays healthy, the requests may be tried again (503).
        const int status = dynamic_cast<const llm::DeviceMemoryError*>(&e) ? 503 : 500;
        for (Part& pt : parts) {
            pt.s->cache.resize(std::min(pt.s->cache.size(), (size_t)ctx_.seq_len(pt.s->id)));
            ctx_.seq_truncate(pt.s->id, (int)pt.s->cache.size());  // a draft's rows may be there
            pt.s->drafted.clear();
            fail_slot(*pt.s, status, std::string("decode failed: ") + e.what());
        }
        return true;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.n_decode++;
        stats_.n_busy_slots += n_busy_;
    }
    int li = 0;
    for (Part& pt : parts) {
        Slot& s = *pt.s;
        const size_t from = s.cache.size();
        s.cache.insert(s.cache.end(), s.target.begin() + from, s.target.begin() + from + pt.n);
        if (!s.generating) {
            s.n_prompt_evaluated += (int)pt.n;
            if (s.task->p.return_progress) send_progress(s);
        }
        if (pt.logits && s.task->p.embed) {
            li += on_embeddings(s, li);
        } else if (pt.logits && !s.drafted.empty()) {
            const int n_rows = 1 + (int)s.drafted.size();
            verify(s, li);
            li += n_rows;
        } else if (pt.logits) {
            on_logits(s, ctx_.logits(li++));
        }
    }
    if (spec_) spec_->record_decode((int)batch.size(), (now_seconds() - t_decode) * 1000);  // sampling included
    return true;
}

// Cells a step may still add (unified pool): the free pages, less one page for each running slot
// whose next token may open a new page. Split mode: unbounded here (the per-slot checks guard it).
int Scheduler::pool_room() {
    if (!cfg_.kv_unified) return INT32_MAX;
    const int page = ctx_.kv_page_size();
    int opening = 0;
    for (const Slot& s : slots_) opening += s.task && s.cache.size() % page == 0;
    return std::max(0, ctx_.n_cells_free() - page * opening);
}

// Frees pool cells until `need` fit: idle slots' caches first (least recently used; they go to the
// RAM cache), then the youngest running request is stopped. False when no request is left to run.
bool Scheduler::make_room(size_t need) {
    while ((size_t)pool_room() < need) {
        Slot* idle = nullptr;
        for (Slot& s : slots_) {
            if (!s.task && !s.cache.empty() && (!idle || s.last_used < idle->last_used)) idle = &s;
        }
        if (idle) {
            if (ram_.enabled() && idle->cache.size() >= 16) ram_.save(idle->cache, ctx_.seq_save(idle->id, (int)idle->cache.size()));
            log_msg('I', "slot %d: %zu cached tokens evicted to make room in the KV pool", idle->id, idle->cache.size());
            ctx_.seq_truncate(idle->id, 0);
            idle->cache.clear();
            idle->target.clear();
            continue;
        }
        Slot* young = nullptr;
        for (Slot& s : slots_) {
            if (s.task && (!young || s.task->id > young->task->id)) young = &s;
        }
        if (!young) return false;
        log_msg('W', "slot %d: the KV pool is full (%d of %d cells used): stopping task %lld", young->id, ctx_.n_cells_used(),
                ctx_.n_ctx(), (long long)young->task->id);
        if (young->generating) {
            young->target.resize(young->cache.size());
            finish(*young, "limit");
        } else {
            fail_slot(*young, 503, "the KV cache pool is full: try again later");
        }
        size_t n_next = 0, n_busy = 0;
        for (Slot& s : slots_) {
            n_next += s.task && s.pending() == 1;
            n_busy += s.task != nullptr;
        }
        if (n_busy == 0) return false;
        need = std::max<size_t>(n_next, 1);
    }
    return true;
}

// An n_cmpl child waits while its parent's prompt is still to be evaluated (queued, starting now, or
// reading it in a slot); a parent that is gone (cancelled, failed) holds nothing back.
bool Scheduler::waits_for_parent(const Task& t, const std::vector<std::pair<Slot*, std::unique_ptr<Task>>>& starting) const {
    if (t.parent < 0) return false;
    for (const auto& q : queue_) if (q->id == t.parent) return true;
    for (const auto& st : starting) if (st.second->id == t.parent) return true;
    for (const Slot& s : slots_) if (s.task && s.task->id == t.parent && !s.generating) return true;
    return false;
}

void Scheduler::publish() {
    std::vector<SlotView> views(slots_.size());
    int64_t kv = 0;
    for (size_t i = 0; i < slots_.size(); i++) {
        const Slot& s = slots_[i];
        SlotView& v = views[i];
        v.id = s.id;
        v.n_past = (int)s.cache.size();
        kv += v.n_past;
        v.busy = s.task != nullptr;
        v.speculative = spec_ && (!v.busy || s.task->p.speculative.n_max > 0);
        if (v.busy) {
            v.task = s.task->id;
            v.n_decoded = s.n_decoded;
            v.n_prompt = s.n_prompt;
            v.n_prompt_processed = s.n_prompt_evaluated;
            v.n_prompt_cache = s.n_cache_reused;
            v.n_remain = s.task->p.n_predict < 0 ? -1 : s.task->p.n_predict - s.n_decoded;
            v.has_new_line = s.text.find('\n') != std::string::npos;
            v.params = s.task->p;
        }
    }
    std::lock_guard<std::mutex> lock(mu_);
    views_ = std::move(views);
    stats_.kv_tokens = kv;
    for (const SlotView& v : views_) stats_.n_tokens_max = std::max<int64_t>(stats_.n_tokens_max, v.n_past);
}

void Scheduler::run() {
    llm::Batch batch;
    for (;;) {
        std::vector<std::pair<Slot*, std::unique_ptr<Task>>> starts;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !queue_.empty() || n_busy_ > 0 || !actions_.empty(); });
            if (stop_) break;
            // Waiting requests go to idle slots in arrival order; cancelled ones are dropped.
            std::vector<bool> taken(slots_.size(), false);
            for (auto it = queue_.begin(); it != queue_.end();) {
                if ((*it)->ch->cancelled) { it = queue_.erase(it); continue; }
                if (waits_for_parent(**it, starts)) { ++it; continue; }
                Slot* s = pick_slot(**it, taken);
                if (!s) { ++it; continue; }
                taken[s->id] = true;
                n_busy_++;
                starts.emplace_back(s, std::move(*it));
                it = queue_.erase(it);
            }
        }
        run_slot_actions();
        for (auto& st : starts) start_task(*st.first, std::move(st.second));
        for (Slot& s : slots_) {
            if (s.task && s.task->ch->cancelled) {
                log_msg('I', "slot %d: task %lld cancelled (client gone)", s.id, (long long)s.task->id);
                release(s);
            }
        }
        step(batch);
        publish();
    }
    for (Slot& s : slots_) {
        if (s.task) fail_slot(s, 503, "the server is shutting down");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& pa : actions_) {
        pa->result.status = 503;
        pa->result.error = "the server is shutting down";
        pa->done = true;
    }
    actions_.clear();
    actions_cv_.notify_all();
    for (auto& t : queue_) {
        Result r;
        r.kind = Result::Error;
        r.status = 503;
        r.message = "the server is shutting down";
        t->ch->push(std::move(r));
    }
    queue_.clear();
}

}  // namespace srv
