// llm-server's command-line modes, llama-cli / llama-bench / llama-perplexity style: each runs once
// and returns the process exit status.
#pragma once
#include "args.hpp"

namespace srv {

int run_tokenize(const Options& o);            // --tokenize: token ids of -p / -f (vocabulary-only files work)
int run_plan(const Options& o);                // --plan: the memory a deployment needs, from metadata only
int run_dump_logits(const Options& o, const llm::Model& m);  // --dump-logits FILE
int run_complete(const Options& o, const llm::Model& m);     // -p / -f / --prompt-ids: complete, print timings
int run_bench(const Options& o, const llm::Model& m);        // --bench: pp / tg tokens per second
int run_perplexity(const Options& o, const llm::Model& m);   // --perplexity FILE [--kl-base BASE]

}  // namespace srv
