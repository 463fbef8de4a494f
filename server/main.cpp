// llm-server: one static binary with the command-line modes of llama-cli / llama-bench /
// llama-perplexity and the HTTP API of llama-server.
//
//   llm-server -m MODEL -p PROMPT [-n N]           complete a prompt, print llama.cpp-style timings
//   llm-server -m MODEL --prompt-ids 1,2,3 --dump-logits FILE
//                                                   write float32 logits of every prompt position
//   llm-server -m MODEL --tokenize -p TEXT          print token ids (vocabulary-only files work)
//   llm-server --chat-template-file F --render-chat REQUEST.json
//                                                   print the rendered chat prompt (no model)
//   llm-server -m MODEL --bench -p 512 -n 128 -r 5  prompt / generation tokens per second
//   llm-server -m MODEL [--host H --port P ...]     the HTTP server (no mode flag)
//
// Without -m, --models-dir / --models-preset run the router (router.cpp): a child process per model.
//
// Units: args (flags, --help), cli (the command-line modes), server (the HTTP mode's lifecycle), router, api
// (routes, requests, responses: all JSON), scheduler (slots, batching, sampling), prompt_cache (host-RAM
// slot states), util, engine (the one unit compiling llm.hpp's implementation).
#include <cstdio>
#include <exception>

#include "args.hpp"
#include "cli.hpp"
#include "router.hpp"
#include "server.hpp"
#include "util.hpp"

int main(int argc, char** argv) {
    using namespace srv;
    Options o = parse_args(argc, argv);
    try {
        set_log_options(o.log_verbosity, o.log_file);
        for (const auto& [level, text] : o.notes) log_msg(level, "%s", text.c_str());
        // As llama-server built without OpenSSL, but for either file: serving plain HTTP to clients
        // that were promised TLS would be a silent downgrade.
        if ((wants_router(o) || wants_server(o)) && (!o.srv.ssl_key_file.empty() || !o.srv.ssl_cert_file.empty()))
            usage_error("the server is built without SSL support (--ssl-key-file, --ssl-cert-file): put a TLS proxy in front");
        if (wants_router(o)) return run_router(o, argc, argv);
        if (o.tokenize) return run_tokenize(o);
        if (o.plan) return run_plan(o);
        if (!o.render_chat.empty()) return run_render_chat(o);
        if (wants_server(o)) return run_server(o);
        double t0 = now_seconds();
        auto model = llm::Model::load(o.model, model_options(o));
        fprintf(stderr, "loaded %s: %s, %d layers, n_embd %d, %d heads (%d kv), vocab %d, %.1fM params, "
                        "weights %.2f MiB, %.0f ms\n",
                o.model.c_str(), model->arch_str.c_str(), model->hp.n_layer, model->hp.n_embd, model->hp.n_head,
                model->hp.n_head_kv, model->hp.n_vocab, model->n_params() / 1e6, mib(model->weight_bytes()),
                (now_seconds() - t0) * 1000);
        if (!o.dump_logits.empty()) return run_dump_logits(o, *model);
        if (!o.perplexity_file.empty()) return run_perplexity(o, *model);
        if (o.bench) return run_bench(o, *model);
        if (o.has_prompt || o.has_prompt_ids || !o.prompt_file.empty()) return run_complete(o, *model);
        usage_error("nothing to do: give -p PROMPT, --prompt-ids, --tokenize, --dump-logits or --bench");
    } catch (const std::exception& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
