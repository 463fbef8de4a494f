// llm-server's command-line modes (see cli.hpp).
#include "cli.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>

#include "speculative.hpp"
#include "util.hpp"

namespace srv {

namespace {

// Feeds tokens [0, n) of `tokens` into sequence 0 in chunks of n_batch; returns the logits of the
// last token (or, with all_logits, appends every row to *all).
void prefill(llm::Context& ctx, const std::vector<int32_t>& tokens, int start, int n_batch, std::vector<float>* all) {
    const int n_vocab = ctx.model().hp.n_vocab;
    llm::Batch batch;
    for (int b = start; b < (int)tokens.size(); b += n_batch) {
        batch.clear();
        int e = std::min((int)tokens.size(), b + n_batch);
        for (int i = b; i < e; i++) batch.add(tokens[i], i, 0, all != nullptr || i == (int)tokens.size() - 1);
        ctx.decode(batch);
        if (all) {
            for (int i = 0; i < ctx.n_logits(); i++) all->insert(all->end(), ctx.logits(i), ctx.logits(i) + n_vocab);
        }
    }
}

std::vector<int32_t> prompt_tokens(const Options& o, const llm::Model& m, bool add_special, bool parse_special) {
    if (o.has_prompt_ids) {
        for (int32_t id : o.prompt_ids) {
            if (m.hp.n_vocab > 0 && id >= m.hp.n_vocab) usage_error("token id " + std::to_string(id) + " is outside the vocabulary");
        }
        return o.prompt_ids;
    }
    std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
    return m.vocab.tokenize(text, add_special, parse_special);
}

}  // namespace

int run_tokenize(const Options& o) {
    llm::ModelOptions mo;
    mo.vocab_only = true;
    mo.use_mmap = o.use_mmap;
    auto m = llm::Model::load(o.model, mo);
    if (!o.has_prompt && o.prompt_file.empty()) usage_error("--tokenize needs -p TEXT or -f FILE");
    std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
    std::vector<int32_t> ids = m->vocab.tokenize(text, o.add_special, o.parse_special);
    std::string line;
    for (size_t i = 0; i < ids.size(); i++) line += (i ? " " : "") + std::to_string(ids[i]);
    printf("%s\n", line.c_str());
    return 0;
}

int run_dump_logits(const Options& o, const llm::Model& m) {
    std::vector<int32_t> tokens = prompt_tokens(o, m, true, true);
    if (tokens.empty()) usage_error("the prompt is empty");
    llm::Context ctx(m, context_params(o, o.n_ctx > 0 ? o.n_ctx : std::max<int>(256, (int)tokens.size())));
    if ((int)tokens.size() > ctx.n_ctx_seq()) {
        throw llm::Error("prompt of " + std::to_string(tokens.size()) + " tokens is longer than the context (" +
                         std::to_string(ctx.n_ctx_seq()) + ")");
    }
    std::vector<float> logits;
    prefill(ctx, tokens, 0, o.n_batch, &logits);
    FILE* f = fopen(o.dump_logits.c_str(), "wb");
    if (!f) throw llm::Error("cannot write " + o.dump_logits + ": " + strerror(errno));
    size_t w = fwrite(logits.data(), sizeof(float), logits.size(), f);
    if (fclose(f) != 0 || w != logits.size()) throw llm::Error("write to " + o.dump_logits + " failed");
    fprintf(stderr, "wrote %zu x %d logits to %s\n", tokens.size(), m.hp.n_vocab, o.dump_logits.c_str());
    return 0;
}

namespace {

void print_timing(const char* what, double ms, int n) {
    fprintf(stderr, "%18s = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n", what, ms, n,
            n > 0 ? ms / n : 0.0, n > 0 && ms > 0 ? 1000.0 * n / ms : 0.0);
}

// What a generation did with its drafts.
struct DraftStats {
    int drafted = 0, accepted = 0, steps = 0;  // steps: target evaluations that carried a draft
    int decodes = 0;                           // target evaluations in all
    double draft_ms = 0, decode_ms = 0, sample_ms = 0;
};

// The drafters of -md / --spec-type, or null without them.
std::unique_ptr<Speculator> make_speculator(const Options& o, const llm::Model& m, const llm::Context& ctx) {
    if (!o.spec.enabled()) return nullptr;
    auto spec = std::make_unique<Speculator>(o, m, ctx, 1);
    fprintf(stderr, "speculative decoding: %s\n", spec->describe().c_str());
    return spec;
}

// Samples up to `limit` tokens after `tokens` (sequence 0 of ctx holds them; row 0 of its logits is the
// last one's), stopping at an end-of-generation token (unless ignore_eos) or when on_token says so.
// With a speculator each evaluation carries a draft after the sampled token: every position is sampled
// as without one and a drafted token is kept while it equals the sample. Returns the tokens sampled.
int generate(llm::Context& ctx, llm::Sampler& sampler, Speculator* spec, const llm::DraftParams& dp, std::vector<int32_t> tokens, int limit,
             int n_batch, bool ignore_eos, const std::function<bool(int32_t)>& on_token, DraftStats& st) {
    const llm::Model& m = ctx.model();
    std::vector<int32_t> draft;
    size_t row = 0;        // the logits row to sample: the accepted drafts so far
    double t_decode = 0;   // when the last decode began: its time, sampling included, is the cost model's
    int n_gen = 0;
    llm::Batch batch;
    while (n_gen < limit) {
        const double t_sample = now_seconds();
        const int32_t tok = sampler.sample(ctx.logits((int)row), m.hp.n_vocab);
        sampler.accept(tok);
        st.sample_ms += (now_seconds() - t_sample) * 1000;
        n_gen++;
        const bool kept = row < draft.size() && tok == draft[row];
        st.accepted += kept;
        if ((m.vocab.is_eog(tok) && !ignore_eos) || !on_token(tok) || n_gen == limit) break;
        tokens.push_back(tok);
        if (kept) {  // its logits are the next row
            row++;
            continue;
        }
        if (spec) {
            spec->record(0, (int)draft.size(), (int)row);
            spec->record_decode((int)batch.size(), (now_seconds() - t_decode) * 1000);
        }
        ctx.seq_truncate(0, (int)tokens.size() - 1);  // the rejected drafts' rows go
        const int room = std::min(limit - n_gen - 1, ctx.n_ctx_seq() - (int)tokens.size());
        const double t_draft = now_seconds();
        draft = spec ? spec->draft(0, tokens, dp, room, n_batch) : std::vector<int32_t>();
        st.draft_ms += (now_seconds() - t_draft) * 1000;
        st.drafted += (int)draft.size();
        st.steps += !draft.empty();
        batch.clear();
        batch.add(tok, (int)tokens.size() - 1, 0, true);
        for (size_t i = 0; i < draft.size(); i++) batch.add(draft[i], (int)(tokens.size() + i), 0, true);
        t_decode = now_seconds();
        ctx.decode(batch);
        st.decode_ms += (now_seconds() - t_decode) * 1000;
        st.decodes++;
        row = 0;
    }
    return n_gen;
}

// The median of repeated measurements and their standard deviation.
std::pair<double, double> median_stddev(const std::vector<double>& xs) {
    std::vector<double> sorted = xs;
    std::sort(sorted.begin(), sorted.end());
    double mean = 0, var = 0;
    for (double x : xs) mean += x / xs.size();
    for (double x : xs) var += (x - mean) * (x - mean) / std::max<size_t>(1, xs.size() - 1);
    return {sorted[sorted.size() / 2], std::sqrt(var)};
}

// The drafts' yield (with a draft model its in-loop time per decode), and where the generation's time
// went (the draft model's part split further).
void print_draft_stats(const DraftStats& st, int n_gen, const Speculator& spec) {
    fprintf(stderr, "%18s = %5d tokens in %d drafts, %d accepted (%.1f%%); %d tokens generated", "draft", st.drafted, st.steps,
            st.accepted, st.drafted ? 100.0 * st.accepted / st.drafted : 0.0, n_gen);
    const Speculator::Counters& c = spec.counters();
    if (spec.has_draft_model())
        fprintf(stderr, "; draft model %.2f ms per decode (%d decodes)", c.model_decodes ? c.model_ms / c.model_decodes : 0.0, c.model_decodes);
    fprintf(stderr, "\n");
    fprintf(stderr, "%18s = %.0f ms target decodes (%d), %.0f ms sampling, %.0f ms drafting: draft model %.0f ms in %d calls + %.0f ms catch-up\n",
            "spec time", st.decode_ms, st.decodes, st.sample_ms, st.draft_ms, c.model_ms, c.model_calls, c.catch_up_ms);
    if (c.checked) fprintf(stderr, "%18s = %d lookup proposals checked by the draft model, %d tokens confirmed\n", "draft checks", c.checked, c.confirmed);
}

}  // namespace

int run_complete(const Options& o, const llm::Model& m) {
    std::vector<int32_t> tokens = prompt_tokens(o, m, true, true);
    if (tokens.empty()) usage_error("the prompt is empty");
    llm::Context ctx(m, context_params(o, o.n_ctx));
    fprintf(stderr, "kv cache: %.2f MiB for %d tokens, %.2f KiB per token (K %s, V %s); %d threads\n",
            mib(ctx.kv_bytes()), ctx.n_ctx(), ctx.kv_bytes_per_token() / 1024.0, llm::type_info(o.type_k).name,
            llm::type_info(o.type_v).name, ctx.n_threads());
    fprintf(stderr, "cpu kernels: %s\n", llm::isa_name(llm::isa_current()).c_str());
    if ((int)tokens.size() >= ctx.n_ctx_seq()) {
        throw llm::Error("prompt of " + std::to_string(tokens.size()) + " tokens does not fit the context of " +
                         std::to_string(ctx.n_ctx_seq()) + " (raise -c)");
    }
    if (o.verbose_prompt) {
        for (int32_t t : tokens) fprintf(stderr, "%6d -> '%s'\n", t, m.vocab.token_to_piece(t).c_str());
    }
    llm::Sampler sampler(o.sampling, &m.vocab);
    for (int32_t t : tokens) sampler.accept(t, false);  // the prompt is not the grammar's text
    fputs(o.prompt_file.empty() && !o.has_prompt_ids ? o.prompt.c_str() : "", stdout);
    fflush(stdout);

    double t0 = now_seconds();
    prefill(ctx, tokens, 0, o.n_batch, nullptr);
    double t_prompt = now_seconds() - t0;

    const int pos = (int)tokens.size();
    const int limit = o.n_predict < 0 ? ctx.n_ctx_seq() - pos : std::min(o.n_predict, ctx.n_ctx_seq() - pos);
    std::unique_ptr<Speculator> spec = make_speculator(o, m, ctx);
    if (spec) spec->prefill(0, tokens, o.n_batch);
    double t1 = now_seconds();
    std::string generated;  // for -r / --reverse-prompt: generation stops once one appears in it
    auto at_reverse_prompt = [&](size_t before) {
        return std::any_of(o.reverse_prompts.begin(), o.reverse_prompts.end(), [&](const std::string& r) {
            return generated.find(r, before > r.size() ? before - r.size() : 0) != std::string::npos;
        });
    };
    auto print = [&](int32_t tok) {
        const std::string piece = m.vocab.token_to_piece(tok, o.special);
        fputs(piece.c_str(), stdout);
        fflush(stdout);
        const size_t before = generated.size();
        generated += piece;
        return !at_reverse_prompt(before);
    };
    DraftStats st;
    const int n_gen = generate(ctx, sampler, spec.get(), o.spec.draft, tokens, limit, o.n_batch, o.ignore_eos, print, st);
    double t_gen = now_seconds() - t1;
    printf("\n");
    fprintf(stderr, "\n");
    print_timing("prompt eval time", t_prompt * 1000, (int)tokens.size());
    print_timing("eval time", t_gen * 1000, n_gen);
    print_timing("total time", (t_prompt + t_gen) * 1000, (int)tokens.size() + n_gen);
    if (spec) print_draft_stats(st, n_gen, *spec);
    return 0;
}

// llama-bench style: pp = one prompt of n_prompt tokens from an empty cache; tg = n_gen single-token
// steps. Each test repeats; the median is reported with the standard deviation. Like llama-bench, every
// prompt (the warm-up's too) and every generated step draws fresh random tokens (BOS first where the
// model adds one): a MoE model then routes each repetition to other experts instead of re-reading the
// ones the last repetition left in cache. With -md / --spec-type, "tgN spec": N tokens generated greedily
// with speculation after the prompt (-f FILE's text, else random tokens), timed after the prompt is read.
int run_bench(const Options& o, const llm::Model& m) {
    const int n_prompt = o.has_prompt ? atoi(o.prompt.c_str()) : 512;
    const int n_gen = o.n_predict < 0 ? 128 : o.n_predict;
    if (n_prompt < 0 || n_gen < 0 || o.bench_reps <= 0) usage_error("--bench needs -p N >= 0, -n N >= 0, -r N > 0");
    std::mt19937 rng(42);
    auto random_token = [&] { return (int32_t)(rng() % m.hp.n_vocab); };
    const bool bos_first = m.vocab.add_bos() && m.vocab.bos() >= 0;
    auto first_token = [&] { return bos_first ? m.vocab.bos() : random_token(); };
    auto random_prompt = [&](int n) {
        std::vector<int32_t> tokens(n);
        for (int i = 0; i < n; i++) tokens[i] = i == 0 ? first_token() : random_token();
        return tokens;
    };
    const std::vector<int32_t> spec_prompt = o.prompt_file.empty() ? random_prompt(std::max(n_prompt, 1)) : m.vocab.tokenize(read_file(o.prompt_file), true, true);
    if (spec_prompt.empty()) usage_error("the prompt file is empty");
    llm::Context ctx(m, context_params(o, std::max(o.n_ctx, std::max((int)spec_prompt.size(), n_prompt) + n_gen + 1)));
    std::unique_ptr<Speculator> spec = make_speculator(o, m, ctx);

    // Warm-up pass (page in the weights), not measured.
    prefill(ctx, random_prompt(std::min(std::max(n_prompt, 1), 16)), 0, o.n_batch, nullptr);
    auto measure = [&](bool pp) {
        std::vector<double> tps;
        for (int r = 0; r < o.bench_reps; r++) {
            ctx.seq_truncate(0, 0);
            const std::vector<int32_t> prompt = pp ? random_prompt(n_prompt) : std::vector<int32_t>();
            double t0 = now_seconds();
            if (pp) {
                prefill(ctx, prompt, 0, o.n_batch, nullptr);
            } else {
                llm::Batch b;
                int32_t token = first_token();
                for (int i = 0; i < n_gen; i++) {
                    b.clear();
                    b.add(token, i, 0, true);
                    ctx.decode(b);
                    token = random_token();
                }
            }
            tps.push_back((pp ? n_prompt : n_gen) / (now_seconds() - t0));
        }
        return median_stddev(tps);
    };
    char model_desc[128];
    snprintf(model_desc, sizeof model_desc, "%s %.0fM", m.arch_str.c_str(), m.n_params() / 1e6);
    fprintf(stderr, "cpu kernels: %s\n", llm::isa_name(llm::isa_current()).c_str());
    printf("| %-20s | %10s | %8s | %7s | %7s | %16s |\n", "model", "size", "params", "threads", "test", "t/s (median)");
    printf("| %-20s | %10s | %8s | %7s | %7s | %16s |\n", "---", "---", "---", "---", "---", "---");
    auto row = [&](const std::string& test, std::pair<double, double> r) {
        printf("| %-20s | %7.2f MiB | %7.2fM | %7d | %7s | %8.2f ± %5.2f |\n", model_desc, mib(m.weight_bytes()),
               m.n_params() / 1e6, ctx.n_threads(), test.c_str(), r.first, r.second);
        fflush(stdout);
    };
    if (n_prompt > 0) row("pp" + std::to_string(n_prompt), measure(true));
    if (n_gen > 0) row("tg" + std::to_string(n_gen), measure(false));
    if (n_gen > 0 && spec) {
        DraftStats st;
        int generated = 0;
        std::vector<double> tps;
        llm::SamplerParams greedy;
        greedy.temperature = 0;
        for (int r = 0; r < o.bench_reps; r++) {
            ctx.seq_truncate(0, 0);
            prefill(ctx, spec_prompt, 0, o.n_batch, nullptr);
            spec->reset(0);
            spec->prefill(0, spec_prompt, o.n_batch);
            llm::Sampler sampler(greedy, &m.vocab);
            st = DraftStats();
            const double t0 = now_seconds();
            generated = generate(ctx, sampler, spec.get(), o.spec.draft, spec_prompt, n_gen, o.n_batch, true, [](int32_t) { return true; }, st);
            tps.push_back(generated / (now_seconds() - t0));
        }
        row("tg" + std::to_string(n_gen) + " spec", median_stddev(tps));
        print_draft_stats(st, generated, *spec);
    }
    return 0;
}

// --perplexity FILE [--kl-base BASE]: llama-perplexity's numbers (and its --kl-divergence ones).
int run_perplexity(const Options& o, const llm::Model& m) {
    std::unique_ptr<llm::Model> base;
    if (!o.kl_base.empty()) {
        base = llm::Model::load(o.kl_base, model_options(o));
    }
    llm::PerplexityParams p;
    p.n_ctx = o.n_ctx > 0 ? o.n_ctx : 512;
    p.n_batch = o.n_batch;
    p.n_chunks = o.n_chunks;
    p.n_threads = o.n_threads;
    llm::PerplexityResult r = llm::evaluate_perplexity(m, base.get(), read_file(o.perplexity_file), p, llm::perplexity_progress_printer(stdout));
    llm::print_perplexity_report(r, stdout);
    return 0;
}

namespace {

std::string human_bytes(size_t b) {
    char buf[64];
    if (b >= (1ull << 29)) snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
    else if (b >= 1024) snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
    else snprintf(buf, sizeof buf, "%zu B", b);
    return buf;
}

}  // namespace

// --plan with -ngl: what each device holds (its layers' weights, their KV cache, a batch's activations)
// against its free memory; without a device found, over -ts's (or one) devices of unknown memory.
// Returns whether everything fits.
static bool plan_devices(const Options& o, const llm::Model& m, int n_cells) {
    const llm::OffloadDriver& d = llm::offload_driver();
    std::string why = "this build has no GPU backend";
    std::vector<llm::OffloadDevice> found;
    if (d.probe && d.probe(why)) found = d.list();
    const bool known = !found.empty();
    for (size_t i = 0; !known && i < std::max<size_t>(1, o.tensor_split.size()); i++) found.push_back({"GPU" + std::to_string(i), why, 0, 0});
    const llm::Placement pl = llm::place_on_devices(m.hp.n_layer, model_options(o), found);
    const std::vector<llm::DeviceMemory> need = llm::offload_memory(m, pl, n_cells, o.type_k, o.type_v, o.n_batch);
    const int offloaded = m.hp.n_layer - std::min(m.hp.n_layer, pl.first_device_layer) + (pl.output_on_device ? 1 : 0);
    printf("offload:          %d/%d layers over %zu device(s)\n", offloaded, m.hp.n_layer + 1, pl.slices.size());
    bool fits = true;
    for (size_t i = 0; i < need.size(); i++) {
        const llm::Placement::Slice& s = pl.slices[i];
        const llm::OffloadDevice& dev = found[s.device];
        printf("  %s (%s): %s: weights %s, kv %s, compute %s (batch %d) = %s", dev.name.c_str(), dev.description.c_str(), s.describe().c_str(),
               human_bytes(need[i].weights).c_str(), human_bytes(need[i].kv).c_str(),
               human_bytes(need[i].compute).c_str(), o.n_batch, human_bytes(need[i].total()).c_str());
        if (known) printf("; free %s -> %s\n", human_bytes(dev.free_bytes).c_str(), need[i].total() <= dev.free_bytes ? "fits" : "DOES NOT FIT");
        else printf("\n");
        fits = fits && (!known || need[i].total() <= dev.free_bytes);
    }
    return fits;
}

// --plan: the KV-cache spreadsheet, from metadata only. -c is the context each slot gets here, so the
// total is slots x context (the server itself splits -c across its slots: give it -c C*N for N
// slots of C tokens).
int run_plan(const Options& o) {
    llm::ModelOptions mo;
    mo.metadata_only = true;
    auto m = llm::Model::load(o.model, mo);
    const int n_ctx = o.n_ctx > 0 ? o.n_ctx : std::min(m->hp.n_ctx_train, 4096);
    llm::MemoryPlan p = llm::plan_memory(*m, n_ctx, o.n_parallel, o.type_k, o.type_v, o.n_batch);
    const llm::HParams& hp = m->hp;
    printf("model:            %s (%s), %d layers, n_embd %d, %d heads", o.model.c_str(), m->arch_str.c_str(), hp.n_layer, hp.n_embd, hp.n_head);
    if (hp.mla) printf(", MLA latent %d + rope %d\n", hp.kv_lora_rank, hp.n_rot);
    else printf(" (%d kv) x %d dims\n", hp.n_head_kv, hp.head_dim_k);
    printf("weights:          %s (%zu bytes)\n", human_bytes(p.weight_bytes).c_str(), p.weight_bytes);
    printf("kv per token:     %zu B (%s) with K %s, V %s\n", p.kv_bytes_per_token, human_bytes(p.kv_bytes_per_token).c_str(),
           llm::type_info(o.type_k).name, hp.mla ? "- (latent)" : llm::type_info(o.type_v).name);
    printf("kv per slot:      %s (%d tokens)\n", human_bytes(p.kv_bytes_per_slot).c_str(), n_ctx);
    printf("kv total:         %s (%d slots)\n", human_bytes(p.kv_bytes_total).c_str(), o.n_parallel);
    printf("compute buffers:  %s (estimate, batch %d)\n", human_bytes(p.compute_bytes).c_str(), o.n_batch);
    printf("total:            %s\n", human_bytes(p.total_bytes).c_str());
    if (p.mem_available) {
        printf("available:        %s -> %s\n", human_bytes(p.mem_available).c_str(), p.fits ? "fits" : "DOES NOT FIT");
    } else {
        printf("available:        unknown\n");
    }
    const bool devices_fit = o.n_gpu_layers == 0 || plan_devices(o, *m, n_ctx * o.n_parallel);
    printf("server flags:     -c %lld -np %d\n", (long long)n_ctx * o.n_parallel, o.n_parallel);
    return p.fits && devices_fit ? 0 : 2;
}

// --render-chat: the template is --chat-template-file's text, else --chat-template's (Jinja text).
int run_render_chat(const Options& o) {
    try {
        if (o.srv.chat_template_file.empty() && o.srv.chat_template.empty()) usage_error("--render-chat needs --chat-template-file F");
        const llm::JinjaTemplate tpl(o.srv.chat_template_file.empty() ? o.srv.chat_template : read_file(o.srv.chat_template_file));
        const std::string prompt = llm::chat_apply_template(tpl, read_file(o.render_chat));
        fwrite(prompt.data(), 1, prompt.size(), stdout);
        return 0;
    } catch (const std::exception& e) {
        std::string line = e.what();
        std::replace(line.begin(), line.end(), '\n', ' ');
        fprintf(stderr, "error: %s\n", line.c_str());
        return 1;
    }
}

}  // namespace srv
