// llm-quantize: quantize a GGUF model as llama-quantize does (same type mixes, bit-identical data).
//
//   llm-quantize [options] IN.gguf OUT.gguf TYPE [THREADS]
#define LLM_IMPLEMENTATION
#include "llm.hpp"

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// Deletes the unfinished output, then dies of the same signal (SA_RESETHAND restored the default action),
// so the parent sees the usual status of a killed process.
static void on_fatal_signal(int sig) {
    llm::remove_unfinished_outputs();
    raise(sig);
}

static void remove_output_on_signals() {
    struct sigaction sa {};
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
}

static void usage(FILE* f) {
    fprintf(f,
            "usage: llm-quantize [options] IN.gguf OUT.gguf TYPE [THREADS]\n"
            "\n"
            "options:\n"
            "  --pure                      every quantizable tensor gets TYPE's default type (no mix rules)\n"
            "  --output-tensor-type T      type for output.weight (e.g. q8_0, f16)\n"
            "  --token-embedding-type T    type for token_embd.weight\n"
            "  --leave-output-tensor       keep output.weight as it is\n"
            "  --allow-requantize          accept already-quantized input tensors (quality suffers)\n"
            "  --dry-run                   show the per-tensor types and sizes, write nothing\n"
            "  -h, --help                  this text\n"
            "\n"
            "TYPE: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K\n"
            "      IQ4_NL F16 BF16 F32 (Q3_K, Q4_K, Q5_K are the _M mixes), or a numeric file type.\n"
            "THREADS: worker threads (default: all hardware threads).\n");
}

int main(int argc, char** argv) {
    remove_output_on_signals();
    llm::QuantizeOptions opt;
    std::vector<std::string> pos;
    try {
        for (int i = 1; i < argc; i++) {
            std::string a = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) llm::fail("option %s needs a value", a.c_str());
                return argv[++i];
            };
            if (a == "-h" || a == "--help") {
                usage(stdout);
                return 0;
            } else if (a == "--pure") {
                opt.pure = true;
            } else if (a == "--allow-requantize") {
                opt.allow_requantize = true;
            } else if (a == "--leave-output-tensor") {
                opt.leave_output_tensor = true;
            } else if (a == "--dry-run") {
                opt.dry_run = true;
            } else if (a == "--output-tensor-type") {
                opt.output_tensor_type = llm::type_from_name(value());
                opt.has_output_tensor_type = true;
            } else if (a == "--token-embedding-type") {
                opt.token_embedding_type = llm::type_from_name(value());
                opt.has_token_embedding_type = true;
            } else if (a.size() > 1 && a[0] == '-') {
                llm::fail("unknown option %s (see --help)", a.c_str());
            } else {
                pos.push_back(a);
            }
        }
        // As llama-quantize: with --dry-run the output file may be left out (IN TYPE [THREADS]).
        auto is_type = [](const std::string& s) {
            try {
                llm::file_type_from_name(s);
                return true;
            } catch (const llm::Error&) {
                return false;
            }
        };
        if (opt.dry_run && pos.size() >= 2 && pos.size() <= 3 && is_type(pos[1])) pos.insert(pos.begin() + 1, "");
        if (pos.size() < 3 || pos.size() > 4) {
            usage(stderr);
            return 2;
        }
        opt.ftype = llm::file_type_from_name(pos[2]);
        if (pos.size() == 4) {
            char* end = nullptr;
            long n = strtol(pos[3].c_str(), &end, 10);
            if (!end || *end || n < 1 || n > 4096) llm::fail("bad thread count '%s'", pos[3].c_str());
            opt.n_threads = (int)n;
        }
        if (!opt.dry_run && pos[0] == pos[1]) llm::fail("input and output are the same file");
        llm::quantize_model(pos[0], pos[1], opt);
    } catch (const std::exception& e) {
        fprintf(stderr, "llm-quantize: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
