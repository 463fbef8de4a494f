// The scheduler: slots, continuous batching, sampling, stop strings, the prompt caches and context
// shift. It owns the llm::Context on its own thread; request handlers submit Tasks from any thread and
// read their Results from the task's Channel. No JSON here: api.cpp shapes what it produces.
//
// Continuous batching: each step builds ONE Batch holding the next token of every generating slot
// plus prompt chunks of the slots still evaluating their prompt (oldest request first), bounded by
// min(-b, -ub) tokens, calls decode once and samples every slot that finished its input. A long
// prompt is spread over several steps, so the other streams keep producing tokens while it is read.
//
// Prompt cache: a slot keeps the tokens of its last request in its KV sequence. A request goes to the
// idle slot whose cache shares the longest prefix with its prompt (least recently used otherwise) and
// evaluates only the rest (the last prompt token is always evaluated again: it gives the logits).
// With --cache-ram, the tokens a slot is about to overwrite are first saved (seq_save) to an LRU of
// host-RAM blobs, and restored (seq_restore) when a later prompt shares a longer prefix with a blob
// than with its slot.
//
// --cache-reuse N (or a request's n_cache_reuse): past the common prefix, runs of at least N cached
// tokens that come next in the prompt are moved to their new positions with their keys re-rotated
// (Context::seq_move) instead of being evaluated again, as llama-server does for code completion. As
// there, the moved tokens keep the keys and values their old context gave them: an approximation the
// client opts into. With layers on an offload device nothing moves and the prompt is evaluated.
//
// n_cmpl / n > 1: one task per completion; the first evaluates the prompt, the others wait for that
// and start from a copy of its slot's cache.
//
// --kv-unified: all slots share one pool of -c cells (the engine pages it), so one request may use
// all of it. Each step is planned against the free cells: idle slots give their cells back first (their
// tokens go to the RAM cache), and if the running requests alone outgrow the pool, the youngest one is
// stopped (stop_type "limit", or a 503 if it was still reading its prompt) rather than failing a decode.
//
// A full slot never degrades silently: generation that reaches the end of the slot stops with
// stop_type "limit", or with --context-shift drops the older half of the tokens after n_keep and
// shifts the kept tail to its new positions (Context::seq_move re-rotates its keys).
//
// Speculative decoding (a Speculator given): a generating slot's part of the batch is its next token
// and the draft after it, every entry with logits; the slot then samples position by position as it
// would without a draft and keeps each drafted token that equals its sample (its KV row is already
// there); the rest of the draft is truncated away. Speculating and plain slots share the steps.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../llm.hpp"
#include "prompt_cache.hpp"
#include "speculative.hpp"

namespace srv {

// What a request asks of its generation.
struct TaskParams {
    int n_predict = -1, n_probs = 0, id_slot = -1, n_keep = 0;
    bool stream = false, cache_prompt = true, return_tokens = false, ignore_eos = false;
    bool return_progress = false;      // Progress results while the prompt is evaluated
    bool post_sampling_probs = false;  // n_probs as probabilities after the sampler (shaping only)
    bool timings_per_token = false;    // partial results carry the timings (shaping only)
    int n_indent = 0;                  // a line after the first with fewer leading blanks ends generation
    int t_max_predict_ms = 0;          // a new line after this much generation time ends it (0: off)
    int n_cache_reuse = 0;             // --cache-reuse: least chunk of the cache moved to its new position (0: off)
    bool embed = false;      // an embedding (or rerank) task: the whole prompt in one step, no generation
    int embd_normalize = 2;  // of its pooled vector (embd_normalize's norms)
    std::vector<std::string> stop;
    // --reasoning-budget: after this many tokens of thinking, think_end is forced (-1: unlimited,
    // 0: at once). thinking_open: the prompt opened the thinking block; else it opens when the
    // output starts with think_open.
    int reasoning_budget = -1;
    bool thinking_open = false;
    std::string think_open, think_end;
    std::vector<int32_t> think_end_tokens;
    llm::SamplerParams sampling;
    llm::DraftParams speculative;  // speculative.n_max / n_min / p_min (n_max 0: this request does not speculate)
};

// A sampled token's log-probability and the n_probs most likely tokens with their probabilities.
struct TokenProb {
    int32_t id = 0;
    double logprob = 0;
    std::vector<std::pair<int32_t, float>> top;
};

// What the scheduler sends back: partial results (text as it becomes final; with return_progress,
// Progress while the prompt is read) and one final result, or an error.
struct Result {
    enum Kind { Partial, Progress, Final, Error } kind = Partial;
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<TokenProb> probs;
    // Partial, Progress and Final (Progress: n_prompt_evaluated counts the cached tokens too)
    // Final; embedding tasks: the pooled vector, or each token's with Pooling::None
    std::vector<std::vector<float>> embedding;
    int slot = -1, n_prompt = 0, n_prompt_evaluated = 0, n_cache_reused = 0, n_predicted = 0, n_cache = 0;
    int n_draft = 0, n_draft_accepted = 0;  // Final: tokens drafted, and kept by the target
    std::string stop_type = "none", stopping_word;
    bool truncated = false;
    double prompt_ms = 0, predicted_ms = 0;
    // Error
    int status = 500;
    std::string message, err_type;
};

// One task's results, from the scheduler thread to the handler thread.
struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Result> q;
    std::atomic<bool> cancelled{false};
    void push(Result r);
    bool pop(Result& r, int timeout_ms);
};

struct Task {
    int64_t id = 0;
    int64_t parent = -1;  // n_cmpl > 1: starts once this task's prompt is evaluated, and copies its cache
    std::vector<int32_t> prompt;
    TaskParams p;
    std::shared_ptr<Channel> ch;
};

// A slot: one KV sequence, its cached tokens and the task it runs.
struct Slot {
    int id = 0;
    std::vector<int32_t> cache;   // the tokens held in KV sequence `id` (always ctx.seq_len(id) of them)
    std::vector<int32_t> target;  // the tokens that must be in the cache before the next sample
    std::unique_ptr<Task> task;   // null when idle
    std::unique_ptr<llm::Sampler> sampler;
    uint64_t last_used = 0;
    bool generating = false;      // the prompt is evaluated; producing tokens
    int n_prompt = 0, n_cache_reused = 0, n_prompt_evaluated = 0, n_decoded = 0, n_shifts = 0;
    std::string text;             // generated so far (cut at a stop string)
    size_t n_sent = 0;            // bytes of text already sent as partial results
    std::vector<int32_t> unsent_tokens;
    std::vector<TokenProb> unsent_probs;
    double t_start = 0, t_first = 0;
    std::string stop_type = "none", stopping_word;
    bool truncated = false;
    std::vector<std::vector<float>> embedding;  // an embedding task's result
    enum class Thinking { Before, Inside, Over } thinking = Thinking::Over;  // the reasoning budget's view
    int n_thinking = 0;                                                     // tokens generated inside
    std::deque<int32_t> forced;                                             // tokens to emit instead of sampling
    std::vector<int32_t> drafted;           // this step's draft, after the pending token
    int n_draft = 0, n_draft_accepted = 0;  // this request's
    size_t line_start = 0;        // n_indent: where the last line began (0: no new line yet)
    bool line_checked = false;    // that line's indentation is checked
    size_t pending() const { return target.size() - cache.size(); }
};

// What /slots shows of a slot, copied by the scheduler after each step.
struct SlotView {
    int id = 0, n_past = 0, n_decoded = 0, n_remain = -1, n_prompt = 0;
    int n_prompt_processed = 0, n_prompt_cache = 0;  // of the prompt: evaluated, reused from the cache
    int64_t task = -1;
    bool busy = false, has_new_line = false, speculative = false;
    TaskParams params;  // of the running task (when busy)
};

// Counters behind /metrics.
struct Stats {
    uint64_t prompt_tokens = 0, predicted_tokens = 0, n_decode = 0, n_busy_slots = 0, requests_done = 0;
    double prompt_s = 0, predicted_s = 0;
    int64_t kv_tokens = 0, n_tokens_max = 0;  // n_tokens_max: the most tokens a slot held so far
    uint64_t n_draft_tokens = 0, n_draft_accepted = 0, n_drafts = 0;  // speculative decoding
};

// /slots/{id}?action=...: what a slot's KV sequence is asked to do, on the scheduler thread.
struct SlotAction {
    enum Kind { Save, Restore, Erase } kind = Save;
    int slot = 0;
    std::string path;  // the file (Save, Restore), already confined to --slot-save-path
};

// What it did: tokens saved / restored / erased, file bytes, milliseconds; or an error.
struct SlotActionResult {
    int n_tokens = 0;
    size_t n_bytes = 0;
    double ms = 0;
    int status = 200;
    std::string error;
};

// The queue's state with the counters, read together.
struct Load {
    Stats stats;
    int busy = 0, deferred = 0;
};

struct SchedulerConfig {
    int n_slots = 1;
    int budget = 512;          // most tokens per step: min(-b, -ub)
    int max_queue = 64;        // requests that may wait for a slot
    bool context_shift = false, kv_unified = false;
    bool special = false;        // special tokens go into the text (-sp)
    size_t ram_cache_bytes = 0;  // SIZE_MAX: unbounded, 0: off
    bool embeddings = false;     // the context computes embeddings: only embed tasks are served
};

class Scheduler {
public:
    // spec: speculative decoding's drafters, or null.
    Scheduler(const llm::Model& model, llm::Context& ctx, const SchedulerConfig& cfg, Speculator* spec = nullptr);

    // ---- any thread
    // Queues a task; a 503 ApiError when --max-queue requests already wait for a slot.
    std::shared_ptr<Channel> submit(std::vector<int32_t> prompt, const TaskParams& p);
    // n_cmpl completions of one prompt (n_cmpl at most the slots): the first task evaluates the
    // prompt, the others start from a copy of its cache. Their channels, in that order.
    std::vector<std::shared_ptr<Channel>> submit_n(const std::vector<int32_t>& prompt, const TaskParams& p, int n_cmpl);
    void cancel(const std::shared_ptr<Channel>& ch);
    // Runs a slot action between steps (the slot must be idle) and waits for it.
    SlotActionResult slot_action(const SlotAction& a);
    std::vector<SlotView> slot_views() const;
    Load load() const;
    int n_slots() const { return cfg_.n_slots; }
    int n_ctx_slot() const { return n_ctx_slot_; }
    int budget() const { return cfg_.budget; }
    bool embeddings() const { return cfg_.embeddings; }
    bool speculative() const { return spec_ != nullptr; }
    llm::Pooling pooling() const { return ctx_.pooling(); }

    // ---- the scheduler thread: steps until stop(), then fails what is left with 503
    void run();
    void stop();

private:
    std::unique_ptr<Task> make_task(std::vector<int32_t> prompt, const TaskParams& p);
    void enqueue(std::vector<std::unique_ptr<Task>> tasks);
    Slot* pick_slot(const Task& t, const std::vector<bool>& taken);
    void start_task(Slot& s, std::unique_ptr<Task> t);
    bool step(llm::Batch& batch);
    void on_logits(Slot& s, const float* logits);
    void plan_drafts(size_t budget);
    void verify(Slot& s, int first_logits);
    int on_embeddings(Slot& s, int first_output);
    void budget_thinking(Slot& s);
    bool limit_lines(Slot& s, size_t piece_at);
    size_t reuse_chunks(Slot& s, const Task& t, size_t reuse);
    size_t copy_parent_prefix(Slot& s, const Task& t, size_t reuse);
    bool waits_for_parent(const Task& t, const std::vector<std::pair<Slot*, std::unique_ptr<Task>>>& starting) const;
    void emit_partial(Slot& s);
    void finish(Slot& s, const std::string& stop_type);
    void fail_slot(Slot& s, int status, const std::string& msg);
    void release(Slot& s);
    void context_shift(Slot& s);
    void publish();
    int pool_room();
    bool make_room(size_t need);
    TokenProb token_prob(const float* logits, int32_t tok, const Slot& s) const;
    void run_slot_actions();
    SlotActionResult do_slot_action(const SlotAction& a);
    SlotActionResult save_slot(Slot& s, const std::string& path);
    SlotActionResult restore_slot(Slot& s, const std::string& path);
    void send_progress(Slot& s);

    const llm::Model& model_;
    llm::Context& ctx_;
    const SchedulerConfig cfg_;
    Speculator* const spec_;
    const int n_ctx_slot_, n_vocab_;
    std::atomic<int64_t> next_task_id_{0};

    // Shared between handlers and the scheduler, under mu_.
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Task>> queue_;
    int n_busy_ = 0;
    bool stop_ = false;
    std::vector<SlotView> views_;
    struct PendingAction {
        SlotAction action;
        SlotActionResult result;
        bool done = false;
    };
    std::deque<std::shared_ptr<PendingAction>> actions_;
    std::condition_variable actions_cv_;
    Stats stats_;

    // Scheduler thread only.
    std::vector<Slot> slots_;
    RamCache ram_;
    uint64_t use_clock_ = 0;
};

}  // namespace srv
