// llm-server's command line (see args.hpp): one table entry per flag.
#include "args.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace srv {

[[noreturn]] void usage_error(const std::string& msg) {
    fprintf(stderr, "error: %s\n(run llm-server --help for usage)\n", msg.c_str());
    exit(1);
}

namespace {

// --help groups, in llama-server's order, then the command-line modes of this binary.
enum class Group { Common, Sampling, Server, Modes };

const char* group_title(Group g) {
    switch (g) {
        case Group::Common: return "common params";
        case Group::Sampling: return "sampling params";
        case Group::Server: return "example-specific params";
        case Group::Modes: return "llm-server command-line modes (llama-cli / llama-bench / llama-perplexity)";
    }
    return "";
}

// A flag's value as given (a switch gets "true" or "false"), with the flag's spelling for errors.
struct Arg {
    std::string flag, value;

    int to_int() const {
        char* end = nullptr;
        long x = strtol(value.c_str(), &end, 10);
        if (value.empty() || *end || x < INT32_MIN || x > INT32_MAX) usage_error("expected an integer after " + flag + ", got '" + value + "'");
        return (int)x;
    }
    float to_float() const {
        char* end = nullptr;
        float x = strtof(value.c_str(), &end);
        if (value.empty() || *end) usage_error("expected a number after " + flag + ", got '" + value + "'");
        return x;
    }
    // Switch values, and the environment's spellings of them.
    bool on() const {
        if (value == "true" || value == "1" || value == "on" || value == "enabled") return true;
        if (value == "false" || value == "0" || value == "off" || value == "disabled") return false;
        usage_error("expected true/false (1/0, on/off, enabled/disabled) for " + flag + ", got '" + value + "'");
    }
    // -fa's value (bare -fa: on), with llama.cpp's spellings.
    llm::FlashAttn to_flash_attn() const {
        if (value == "auto" || value == "-1") return llm::FlashAttn::Auto;
        if (value.empty() || value == "on" || value == "enabled" || value == "1") return llm::FlashAttn::On;
        if (value == "off" || value == "disabled" || value == "0") return llm::FlashAttn::Off;
        usage_error("expected on, off or auto after " + flag + ", got '" + value + "'");
    }
    llm::Type to_type() const {
        try {
            return llm::type_from_name(value);
        } catch (const llm::Error& e) {
            usage_error(e.what());
        }
    }
    std::vector<std::string> list() const {  // comma-separated, empty items dropped
        std::vector<std::string> out;
        std::stringstream ss(value);
        std::string item;
        while (std::getline(ss, item, ',')) if (!item.empty()) out.push_back(item);
        return out;
    }
};

using Apply = std::function<void(Options&, const Arg&)>;

// One flag: its spellings (negations turn a switch off), environment variable, value placeholder
// (nullptr: a switch; "[a|b]": an optional value out of these; "A B": two values), --help group and
// text, and what it does.
struct Flag {
    std::vector<std::string> names, negations;
    const char* env;
    const char* value;
    Group group;
    std::string help;
    Apply apply;
};

// The effect of a flag that cannot apply to this build: accepted, and `meaning` is logged.
Apply note(const std::string& meaning, char level = 'I') {
    return [meaning, level](Options& o, const Arg& a) { o.notes.push_back({level, a.flag + ": " + meaning}); };
}

const char* kCpuOnly = "this is a CPU build: there is nothing to offload (ignored)";
const char* kNoDownload = "nothing is ever downloaded here: give the model file with -m (ignored)";
const char* kNoLookupCache = "n-gram speculation looks up the request's own tokens (--spec-type ngram-simple); no lookup cache files (ignored)";
const char* kNoMedia = "no multimodal input in this build (ignored)";
const char* kThreadsOwn = "the engine runs its own thread pool of -t threads (ignored)";
const char* kLater = "accepted; this build's sampler does not have it yet (ignored)";

#ifdef LLM_OFFLOAD
// -ngl / -ngld N | all | auto (llama.cpp's spellings; all and auto offload everything).
int gpu_layer_count(const Arg& a) {
    const int n = a.value == "all" || a.value == "auto" ? -1 : a.to_int();
    if (n < -1) usage_error(a.flag + " must be a layer count, all or auto");
    return n;
}
void set_gpu_layers(Options& o, const Arg& a) { o.n_gpu_layers = gpu_layer_count(a); }

// -ts A,B,... (or A/B/...): each device's share of the offloaded layers.
void set_tensor_split(Options& o, const Arg& a) {
    o.tensor_split.clear();
    std::string list = a.value;
    std::replace(list.begin(), list.end(), '/', ',');
    std::stringstream ss(list);
    for (std::string item; std::getline(ss, item, ',');) {
        const float share = Arg{a.flag, item}.to_float();
        if (!(share >= 0) || o.tensor_split.size() >= 128) usage_error(a.flag + ": at most 128 shares, none negative");
        o.tensor_split.push_back(share);
    }
}

// -sm none | layer | row (row: split by layers here, as there is no row split).
void set_split_mode(Options& o, const Arg& a) {
    if (a.value != "none" && a.value != "layer" && a.value != "row") usage_error(a.flag + " must be none, layer or row");
    if (a.value == "row") o.notes.push_back({'W', a.flag + " row: this build splits by layers"});
    o.split_layers = a.value != "none";
}

// --device A,B,... | none: the devices to offload to, by --list-devices' names.
void set_devices(Options& o, const Arg& a) {
    o.devices.clear();
    std::stringstream ss(a.value);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) o.devices.push_back(item);
    if (o.devices.empty() || (o.devices.size() > 1 && std::count(o.devices.begin(), o.devices.end(), "none")))
        usage_error(a.flag + " takes device names (--list-devices) or none");
}

// --list-devices: the driver's devices, as llama.cpp lists them.
[[noreturn]] void list_devices(Options&, const Arg&) {
    const llm::OffloadDriver& d = llm::offload_driver();
    std::string why;
    const bool found = d.probe && d.probe(why);
    printf("Available devices:\n");
    if (!found) fprintf(stderr, "%s: %s\n", d.name.c_str(), why.c_str());
    for (const llm::OffloadDevice& dev : found ? d.list() : std::vector<llm::OffloadDevice>{})
        printf("  %s: %s (%zu MiB, %zu MiB free)\n", dev.name.c_str(), dev.description.c_str(), dev.total_bytes >> 20, dev.free_bytes >> 20);
    exit(0);
}
#endif

// --spec-type: llama-server's names of the kinds this build has (none, a draft model, n-gram lookup);
// its other n-gram variants run as the lookup, with a note.
void set_spec_type(Options& o, const Arg& a) {
    for (const std::string& t : a.list()) {
        if (t == "none") {
            o.spec.ngram = false;
        } else if (t == "ngram-simple" || t == "ngram") {
            o.spec.ngram = true;
        } else if (t == "ngram-map-k" || t == "ngram-map-k4v" || t == "ngram-mod" || t == "ngram-cache") {
            o.spec.ngram = true;
            o.notes.push_back({'I', a.flag + " " + t + ": runs as ngram-simple (the lookup of the request's own tokens)"});
        } else if (t != "draft-simple" && t != "draft") {  // the draft model speculates whenever -md gives one
            usage_error(a.flag + ": unknown type '" + t + "' (none, draft-simple, ngram-simple)");
        }
    }
}

std::vector<int32_t> parse_ids(const Arg& a) {
    std::vector<int32_t> ids;
    std::stringstream ss(a.value);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        long v = strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) usage_error("bad token id '" + item + "' in --prompt-ids");
        ids.push_back((int32_t)v);
    }
    return ids;
}

// -lm / --load-mode: llama.cpp's loading modes onto mmap and mlock.
void set_load_mode(Options& o, const Arg& a) {
    const std::string& m = a.value;
    if (m != "auto" && m != "none" && m != "mmap" && m != "mlock" && m != "mmap+mlock" && m != "dio") {
        usage_error("--load-mode must be auto, none, mmap, mlock, mmap+mlock or dio");
    }
    o.use_mmap = m == "auto" || m == "mmap" || m == "mmap+mlock";
    o.mlock = m == "mlock" || m == "mmap+mlock";
    if (m == "dio") o.notes.push_back({'I', a.flag + " dio: no direct I/O here, the file is read without mmap"});
}

// Backslash escapes of -p text (-e / --escape): \n \r \t \' \" \\ .
std::string unescape(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] != '\\' || i + 1 == s.size()) { out += s[i]; continue; }
        char c = s[++i];
        out += c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
        if (c != 'n' && c != 'r' && c != 't' && c != '\'' && c != '"' && c != '\\') out.insert(out.size() - 1, 1, '\\');
    }
    return out;
}

// ---- Sampling flags ----------------------------------------------------------------------------
std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
    return out;
}

std::string read_text_file(const Arg& a) {
    std::ifstream f(a.value, std::ios::binary);
    if (!f) usage_error("cannot read " + a.flag + " " + a.value);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// A grammar given on the command line, parsed now so that an error stops the start.
std::string checked_grammar(const Arg& a, const std::string& gbnf) {
    try {
        llm::Grammar check(gbnf);
    } catch (const llm::Error& e) {
        usage_error(a.flag + ": " + e.what());
    }
    return gbnf;
}

std::string schema_grammar(const Arg& a, const std::string& schema) {
    try {
        return llm::json_schema_to_grammar(schema);
    } catch (const llm::Error& e) {
        usage_error(a.flag + ": " + e.what());
    }
}

// --dry-sequence-breaker S: the first one replaces the default breakers; "none" leaves none.
void add_dry_breaker(Options& o, const Arg& a) {
    if (!o.dry_breakers_given || a.value == "none") o.sampling.dry_sequence_breakers.clear();
    o.dry_breakers_given = true;
    if (a.value != "none") o.sampling.dry_sequence_breakers.push_back(a.value);
}

// -l / --logit-bias TOKEN_ID(+/-)BIAS, as llama.cpp: "15043+1", "15043-inf".
void add_logit_bias(Options& o, const Arg& a) {
    const size_t sign = a.value.find_first_of("+-", 1);
    if (sign == std::string::npos) usage_error(a.flag + " expects TOKEN_ID(+/-)BIAS, got '" + a.value + "'");
    const Arg token{a.flag, a.value.substr(0, sign)}, bias{a.flag, a.value.substr(sign + 1)};
    const float b = bias.to_float();
    o.sampling.logit_bias.emplace_back(token.to_int(), a.value[sign] == '-' ? -b : b);
}

void read_api_key_file(Options& o, const Arg& a) {
    std::ifstream f(a.value);
    if (!f) usage_error("cannot read --api-key-file " + a.value);
    std::string line;
    while (std::getline(f, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (!line.empty() && line[0] != '#') o.srv.api_keys.push_back(line);
    }
}

[[noreturn]] void print_usage();
[[noreturn]] void print_completion_bash();

const std::vector<Flag>& flags() {
    using G = Group;
    static const std::vector<Flag> table = {
        // ---- common params
        {{"-h", "--help", "--usage"}, {}, nullptr, nullptr, G::Common, "print usage and exit", [](Options&, const Arg&) { print_usage(); }},
        {{"--version"}, {}, nullptr, nullptr, G::Common, "show version and build info",
         [](Options&, const Arg&) { printf("llm-server (llm.hpp), a static CPU build\n"); exit(0); }},
        {{"-cl", "--cache-list"}, {}, nullptr, nullptr, G::Common, "show list of models in cache (there is none: nothing is downloaded)",
         [](Options&, const Arg&) { printf("no models in cache: llm-server never downloads\n"); exit(0); }},
        {{"--completion-bash"}, {}, nullptr, nullptr, G::Common, "print source-able bash completion script",
         [](Options&, const Arg&) { print_completion_bash(); }},
        {{"-t", "--threads"}, {}, "LLAMA_ARG_THREADS", "N", G::Common, "threads (default: physical cores; -1 = default)",
         [](Options& o, const Arg& a) { o.n_threads = a.to_int() == -1 ? 0 : a.to_int(); }},
        {{"-tb", "--threads-batch"}, {}, "LLAMA_ARG_THREADS_BATCH", "N", G::Common,
         "threads for prompts (batches of more than one token; default: -t; -1 = default)",
         [](Options& o, const Arg& a) { o.n_threads_batch = a.to_int() == -1 ? 0 : a.to_int(); }},
        {{"-C", "--cpu-mask"}, {}, nullptr, "M", G::Common, "CPU affinity mask", note(kThreadsOwn)},
        {{"-Cr", "--cpu-range"}, {}, nullptr, "lo-hi", G::Common, "range of CPUs for affinity", note(kThreadsOwn)},
        {{"--cpu-strict"}, {}, nullptr, "<0|1>", G::Common, "strict CPU placement", note(kThreadsOwn)},
        {{"--prio"}, {}, nullptr, "N", G::Common, "process/thread priority", note(kThreadsOwn)},
        {{"--poll"}, {}, nullptr, "<0...100>", G::Common,
         "how long idle workers busy-wait for work before sleeping (default 50; 0 sleeps at once, sparing a shared host's CPU)",
         [](Options& o, const Arg& a) { o.poll = a.to_int(); }},
        {{"-Cb", "--cpu-mask-batch"}, {}, nullptr, "M", G::Common, "CPU affinity mask for batches", note(kThreadsOwn)},
        {{"-Crb", "--cpu-range-batch"}, {}, nullptr, "lo-hi", G::Common, "ranges of CPUs for batches", note(kThreadsOwn)},
        {{"--cpu-strict-batch"}, {}, nullptr, "<0|1>", G::Common, "strict CPU placement for batches", note(kThreadsOwn)},
        {{"--prio-batch"}, {}, nullptr, "N", G::Common, "priority for batches", note(kThreadsOwn)},
        {{"--poll-batch"}, {}, nullptr, "<0|1>", G::Common, "polling for batches", note(kThreadsOwn)},
        {{"-c", "--ctx-size"}, {}, "LLAMA_ARG_CTX_SIZE", "N", G::Common, "context size (default: the model's, at most 4096; 0 = that)",
         [](Options& o, const Arg& a) { o.n_ctx = a.to_int(); }},
        {{"-n", "--predict", "--n-predict"}, {}, "LLAMA_ARG_N_PREDICT", "N", G::Common, "tokens to predict (default: -1 = until end of text or context)",
         [](Options& o, const Arg& a) { o.n_predict = a.to_int(); }},
        {{"-b", "--batch-size"}, {}, "LLAMA_ARG_BATCH", "N", G::Common, "prompt tokens per forward pass (default 512)",
         [](Options& o, const Arg& a) { o.n_batch = a.to_int(); }},
        {{"-ub", "--ubatch-size"}, {}, "LLAMA_ARG_UBATCH", "N", G::Common, "most tokens per server step (default 512; also bounded by -b)",
         [](Options& o, const Arg& a) { o.srv.n_ubatch = a.to_int(); }},
        {{"--keep"}, {}, nullptr, "N", G::Common, "tokens kept from the start of the prompt on a context shift (default 0, -1 = all)",
         [](Options& o, const Arg& a) { o.srv.n_keep = a.to_int(); }},
        {{"--swa-full"}, {}, "LLAMA_ARG_SWA_FULL", nullptr, G::Common, "full-size SWA cache", note("the KV cache keeps every position of every layer already (ignored)")},
        {{"-fa", "--flash-attn"}, {}, "LLAMA_ARG_FLASH_ATTN", "[on|off|auto]", G::Common,
         "Flash Attention (default auto = on; off: the softmax over all positions, then V, as llama.cpp without it (GPU; the CPU always fuses), and no quantized V cache)",
         [](Options& o, const Arg& a) { o.flash_attn = a.to_flash_attn(); }},
        {{"--perf"}, {"--no-perf"}, "LLAMA_ARG_PERF", nullptr, G::Common, "internal performance timings", note("timings are always reported (ignored)")},
        {{"-e", "--escape"}, {"--no-escape"}, nullptr, nullptr, G::Common, "process escapes (\\n, \\r, \\t, \\', \\\", \\\\) in -p (default: off here)",
         [](Options& o, const Arg& a) { o.escape = a.on(); }},
        {{"--rope-scaling"}, {}, "LLAMA_ARG_ROPE_SCALING_TYPE", "{none,linear,yarn}", G::Common, "RoPE frequency scaling method",
         note("RoPE parameters come from the model's metadata (ignored)", 'W')},
        {{"--rope-scale"}, {}, "LLAMA_ARG_ROPE_SCALE", "N", G::Common, "RoPE context scaling factor", note("RoPE parameters come from the model's metadata (ignored)", 'W')},
        {{"--rope-freq-base"}, {}, "LLAMA_ARG_ROPE_FREQ_BASE", "N", G::Common, "RoPE base frequency", note("RoPE parameters come from the model's metadata (ignored)", 'W')},
        {{"--rope-freq-scale"}, {}, "LLAMA_ARG_ROPE_FREQ_SCALE", "N", G::Common, "RoPE frequency scaling factor",
         note("RoPE parameters come from the model's metadata (ignored)", 'W')},
        {{"--yarn-orig-ctx"}, {}, "LLAMA_ARG_YARN_ORIG_CTX", "N", G::Common, "YaRN: original context size", note("YaRN parameters come from the model's metadata (ignored)")},
        {{"--yarn-ext-factor"}, {}, "LLAMA_ARG_YARN_EXT_FACTOR", "N", G::Common, "YaRN: extrapolation mix factor", note("YaRN parameters come from the model's metadata (ignored)")},
        {{"--yarn-attn-factor"}, {}, "LLAMA_ARG_YARN_ATTN_FACTOR", "N", G::Common, "YaRN: attention magnitude", note("YaRN parameters come from the model's metadata (ignored)")},
        {{"--yarn-beta-slow"}, {}, "LLAMA_ARG_YARN_BETA_SLOW", "N", G::Common, "YaRN: high correction dim", note("YaRN parameters come from the model's metadata (ignored)")},
        {{"--yarn-beta-fast"}, {}, "LLAMA_ARG_YARN_BETA_FAST", "N", G::Common, "YaRN: low correction dim", note("YaRN parameters come from the model's metadata (ignored)")},
        {{"-gan", "--grp-attn-n"}, {}, "LLAMA_ARG_GRP_ATTN_N", "N", G::Common, "group-attention factor", note("no self-extend in this build (ignored)", 'W')},
        {{"-gaw", "--grp-attn-w"}, {}, "LLAMA_ARG_GRP_ATTN_W", "N", G::Common, "group-attention width", note("no self-extend in this build (ignored)", 'W')},
        {{"-kvo", "--kv-offload"}, {"-nkvo", "--no-kv-offload"}, "LLAMA_ARG_KV_OFFLOAD", nullptr, G::Common, "KV cache offloading", note(kCpuOnly)},
        {{"--repack"}, {"-nr", "--no-repack"}, "LLAMA_ARG_REPACK", nullptr, G::Common,
         "interleave weights for the AVX-512 VNNI / AVX2 kernels at load (default: on; off keeps the file's layout)",
         [](Options& o, const Arg& a) { o.repack = a.on(); }},
        {{"--no-host"}, {}, "LLAMA_ARG_NO_HOST", nullptr, G::Common, "bypass host buffer", note(kCpuOnly)},
        {{"-ctk", "--cache-type-k"}, {}, "LLAMA_ARG_CACHE_TYPE_K", "TYPE", G::Common, "K cache type: f32, f16, q8_0, q4_0, iq4_nl (default f16)",
         [](Options& o, const Arg& a) { o.type_k = a.to_type(); }},
        {{"-ctv", "--cache-type-v"}, {}, "LLAMA_ARG_CACHE_TYPE_V", "TYPE", G::Common, "V cache type (default f16)",
         [](Options& o, const Arg& a) { o.type_v = a.to_type(); }},
        {{"-dt", "--defrag-thold"}, {}, "LLAMA_ARG_DEFRAG_THOLD", "N", G::Common, "KV cache defragmentation threshold (deprecated)",
         note("the KV cache is paged and never needs defragmenting (ignored)")},
        {{"--rpc"}, {}, "LLAMA_ARG_RPC", "SERVERS", G::Common, "RPC servers", note("no RPC backend in this build (ignored)", 'W')},
        {{"-lm", "--load-mode"}, {}, "LLAMA_ARG_LOAD_MODE", "MODE", G::Common, "auto, none, mmap, mlock, mmap+mlock, dio (default auto = mmap)", set_load_mode},
        {{"--mmap"}, {"--no-mmap"}, "LLAMA_ARG_MMAP", nullptr, G::Common, "memory-map the model (default: on)",
         [](Options& o, const Arg& a) { o.use_mmap = a.on(); }},
        {{"--mlock"}, {}, "LLAMA_ARG_MLOCK", nullptr, G::Common, "keep the model in RAM", [](Options& o, const Arg& a) { o.mlock = a.on(); }},
        {{"-lzm", "--lazy-mode"}, {}, "LLAMA_ARG_LAZY_MODE", "MODE", G::Common, "on-demand reading of large tensors", note("mmap pages tensors in on demand already (ignored)")},
        {{"--numa"}, {}, "LLAMA_ARG_NUMA", "TYPE", G::Common, "NUMA optimizations", note("no NUMA placement in this build (ignored)")},
#ifdef LLM_OFFLOAD
        {{"-dev", "--device"}, {}, "LLAMA_ARG_DEVICE", "<dev1,dev2,..>", G::Common,
         "devices to offload to, by --list-devices' names (none: no device, no GPU context at all)", set_devices},
        {{"--list-devices"}, {}, nullptr, nullptr, G::Common, "print list of available devices and exit", list_devices},
#else
        {{"-dev", "--device"}, {}, "LLAMA_ARG_DEVICE", "<dev1,dev2,..>", G::Common, "devices to offload to", note(kCpuOnly)},
        {{"--list-devices"}, {}, nullptr, nullptr, G::Common, "print list of available devices and exit",
         [](Options&, const Arg&) { printf("Available devices:\n  CPU (the only one in this build)\n"); exit(0); }},
#endif
        {{"-ot", "--override-tensor"}, {}, "LLAMA_ARG_OVERRIDE_TENSOR", "<pattern>=<buffer type>,...", G::Common, "override tensor buffer type", note(kCpuOnly)},
        {{"-cmoe", "--cpu-moe"}, {}, "LLAMA_ARG_CPU_MOE", nullptr, G::Common, "keep MoE weights in the CPU", note(kCpuOnly)},
        {{"-ncmoe", "--n-cpu-moe"}, {}, "LLAMA_ARG_N_CPU_MOE", "N", G::Common, "keep the MoE weights of N layers in the CPU", note(kCpuOnly)},
#ifdef LLM_OFFLOAD
        {{"-ngl", "--gpu-layers", "--n-gpu-layers"}, {}, "LLAMA_ARG_N_GPU_LAYERS", "N", G::Common,
         "layers to store in VRAM: the last N repeating layers, the output too when N > layers (all, auto: everything)", set_gpu_layers},
        {{"-sm", "--split-mode"}, {}, "LLAMA_ARG_SPLIT_MODE", "{none,layer,row}", G::Common,
         "how to split across GPUs: none (only --main-gpu), layer (default; row splits by layers too)", set_split_mode},
        {{"-ts", "--tensor-split"}, {}, "LLAMA_ARG_TENSOR_SPLIT", "N0,N1,...", G::Common,
         "each GPU's share of the offloaded layers, e.g. 3,1 (default: in proportion to free memory)", set_tensor_split},
        {{"-mg", "--main-gpu"}, {}, "LLAMA_ARG_MAIN_GPU", "INDEX", G::Common, "the GPU to use with --split-mode none (default 0)",
         [](Options& o, const Arg& a) { o.main_gpu = a.to_int(); }},
#else
        {{"-ngl", "--gpu-layers", "--n-gpu-layers"}, {}, "LLAMA_ARG_N_GPU_LAYERS", "N", G::Common, "layers to store in VRAM", note(kCpuOnly)},
        {{"-sm", "--split-mode"}, {}, "LLAMA_ARG_SPLIT_MODE", "{none,layer,row}", G::Common, "how to split across GPUs", note(kCpuOnly)},
        {{"-ts", "--tensor-split"}, {}, "LLAMA_ARG_TENSOR_SPLIT", "N0,N1,...", G::Common, "fraction of the model per GPU", note(kCpuOnly)},
        {{"-mg", "--main-gpu"}, {}, "LLAMA_ARG_MAIN_GPU", "INDEX", G::Common, "the GPU to use", note(kCpuOnly)},
#endif
        {{"-fit", "--fit"}, {}, "LLAMA_ARG_FIT", "[on|off]", G::Common, "fit unset arguments in device memory", note("use --plan to see what a deployment needs (ignored)")},
        {{"-fitt", "--fit-target"}, {}, "LLAMA_ARG_FIT_TARGET", "MiB0,...", G::Common, "target margin per device for --fit", note(kCpuOnly)},
        {{"-fitc", "--fit-ctx"}, {}, "LLAMA_ARG_FIT_CTX", "N", G::Common, "minimum ctx size for --fit", note(kCpuOnly)},
        {{"--check-tensors"}, {}, nullptr, nullptr, G::Common, "check tensor data for invalid values", note("tensor sizes and offsets are always checked at load (ignored)")},
        {{"--override-kv"}, {}, nullptr, "KEY=TYPE:VALUE,...", G::Common, "override model metadata", note("metadata overrides are not supported (ignored)", 'W')},
        {{"--op-offload"}, {"--no-op-offload"}, nullptr, nullptr, G::Common, "offload host tensor operations", note(kCpuOnly)},
        {{"--lora"}, {}, nullptr, "FNAME", G::Common, "LoRA adapter", note("LoRA adapters are not supported: the base model is served", 'W')},
        {{"--lora-scaled"}, {}, nullptr, "FNAME:SCALE,...", G::Common, "LoRA adapter with scale", note("LoRA adapters are not supported: the base model is served", 'W')},
        {{"--control-vector"}, {}, nullptr, "FNAME", G::Common, "control vector", note("control vectors are not supported (ignored)", 'W')},
        {{"--control-vector-scaled"}, {}, nullptr, "FNAME:SCALE,...", G::Common, "control vector with scale", note("control vectors are not supported (ignored)", 'W')},
        {{"--control-vector-layer-range"}, {}, nullptr, "START END", G::Common, "layer range of the control vectors", note("control vectors are not supported (ignored)")},
        {{"-m", "--model"}, {}, "LLAMA_ARG_MODEL", "FNAME", G::Common, "model path (GGUF)", [](Options& o, const Arg& a) { o.model = a.value; }},
        {{"-mu", "--model-url"}, {}, "LLAMA_ARG_MODEL_URL", "MODEL_URL", G::Common, "model download url", note(kNoDownload)},
        {{"-dr", "--docker-repo"}, {}, "LLAMA_ARG_DOCKER_REPO", "[<repo>/]<model>[:quant]", G::Common, "Docker Hub model repository", note(kNoDownload)},
        {{"-hf", "-hfr", "--hf-repo"}, {}, "LLAMA_ARG_HF_REPO", "<user>/<model>[:quant]", G::Common, "Hugging Face model repository", note(kNoDownload)},
        {{"-hff", "--hf-file"}, {}, "LLAMA_ARG_HF_FILE", "FILE", G::Common, "Hugging Face model file", note(kNoDownload)},
        {{"-hft", "--hf-token"}, {}, "HF_TOKEN", "TOKEN", G::Common, "Hugging Face access token", note(kNoDownload)},
        {{"--log-disable"}, {}, nullptr, nullptr, G::Common, "log nothing", [](Options& o, const Arg&) { o.log_verbosity = -1; }},
        {{"--log-file"}, {}, "LLAMA_ARG_LOG_FILE", "FNAME", G::Common, "also write the log to FNAME", [](Options& o, const Arg& a) { o.log_file = a.value; }},
        {{"--log-jsonl"}, {"--no-log-jsonl"}, "LLAMA_ARG_LOG_JSONL", nullptr, G::Common, "log as JSON lines", note("the log is text lines with timestamps (ignored)")},
        {{"--log-colors"}, {}, "LLAMA_ARG_LOG_COLORS", "[on|off|auto]", G::Common, "colored logging", note("the log is never colored (ignored)")},
        {{"-v", "--verbose", "--log-verbose"}, {}, nullptr, nullptr, G::Common, "log everything, request bodies included",
         [](Options& o, const Arg&) { o.log_verbosity = 99; }},
        {{"--offline"}, {}, "LLAMA_ARG_OFFLINE", nullptr, G::Common, "offline mode", note("always offline: nothing is ever downloaded")},
        {{"-lv", "--verbosity", "--log-verbosity"}, {}, "LLAMA_ARG_LOG_VERBOSITY", "N", G::Common,
         "log threshold: 0 generic, 1 error, 2 warning, 3 info (default), 4 trace, 5 debug", [](Options& o, const Arg& a) { o.log_verbosity = a.to_int(); }},
        {{"--log-prefix"}, {"--no-log-prefix"}, "LLAMA_ARG_LOG_PREFIX", nullptr, G::Common, "prefix in log messages", note("every line has its level letter (ignored)")},
        {{"--log-timestamps"}, {"--no-log-timestamps"}, "LLAMA_ARG_LOG_TIMESTAMPS", nullptr, G::Common, "timestamps in log messages",
         note("every line has its UTC timestamp (ignored)")},
        {{"-ctkd", "--cache-type-k-draft", "--spec-draft-type-k"}, {}, "LLAMA_ARG_CACHE_TYPE_K_DRAFT", "TYPE", G::Common, "K cache type of the draft model (default f16)",
         [](Options& o, const Arg& a) { o.spec.type_k = a.to_type(); }},
        {{"-ctvd", "--cache-type-v-draft", "--spec-draft-type-v"}, {}, "LLAMA_ARG_CACHE_TYPE_V_DRAFT", "TYPE", G::Common, "V cache type of the draft model (default f16)",
         [](Options& o, const Arg& a) { o.spec.type_v = a.to_type(); }},
        {{"--verbose-prompt"}, {}, nullptr, nullptr, G::Common, "print the prompt's tokens before generating (-p mode)",
         [](Options& o, const Arg&) { o.verbose_prompt = true; }},

        // ---- sampling params
        {{"--samplers"}, {}, nullptr, "SAMPLERS", G::Sampling, "sampler order, ';'-separated", [](Options& o, const Arg& a) { o.sampling.samplers = llm::sampler_stages_from_names(split(a.value, ';')); }},
        {{"-s", "--seed"}, {}, nullptr, "SEED", G::Sampling, "RNG seed (default: -1 = random)",
         [](Options& o, const Arg& a) { o.sampling.seed = (uint64_t)(uint32_t)a.to_int(); }},
        {{"--sampler-seq", "--sampling-seq"}, {}, nullptr, "SEQUENCE", G::Sampling, "simplified sampler sequence", [](Options& o, const Arg& a) { o.sampling.samplers = llm::sampler_stages_from_chars(a.value); }},
        {{"--ignore-eos"}, {}, nullptr, nullptr, G::Sampling, "ignore end of stream token and continue generating",
         [](Options& o, const Arg&) { o.ignore_eos = true; }},
        {{"--temp", "--temperature"}, {}, "LLAMA_ARG_TEMPERATURE", "N", G::Sampling, "temperature (default 0.8; <= 0 greedy)",
         [](Options& o, const Arg& a) { o.sampling.temperature = a.to_float(); }},
        {{"--top-k"}, {}, "LLAMA_ARG_TOP_K", "N", G::Sampling, "top-k sampling (default 40, 0 = disabled)",
         [](Options& o, const Arg& a) { o.sampling.top_k = a.to_int(); }},
        {{"--top-p"}, {}, "LLAMA_ARG_TOP_P", "N", G::Sampling, "top-p sampling (default 0.95, 1.0 = disabled)",
         [](Options& o, const Arg& a) { o.sampling.top_p = a.to_float(); }},
        {{"--min-p"}, {}, "LLAMA_ARG_MIN_P", "N", G::Sampling, "min-p sampling (default 0.05, 0.0 = disabled)",
         [](Options& o, const Arg& a) { o.sampling.min_p = a.to_float(); }},
        {{"--top-nsigma", "--top-n-sigma"}, {}, nullptr, "N", G::Sampling, "top-n-sigma sampling", [](Options& o, const Arg& a) { o.sampling.top_n_sigma = a.to_float(); }},
        {{"--xtc-probability"}, {}, nullptr, "N", G::Sampling, "xtc probability", [](Options& o, const Arg& a) { o.sampling.xtc_probability = a.to_float(); }},
        {{"--xtc-threshold"}, {}, nullptr, "N", G::Sampling, "xtc threshold", [](Options& o, const Arg& a) { o.sampling.xtc_threshold = a.to_float(); }},
        {{"--typical", "--typical-p"}, {}, nullptr, "N", G::Sampling, "locally typical sampling", [](Options& o, const Arg& a) { o.sampling.typical_p = a.to_float(); }},
        {{"--repeat-last-n"}, {}, nullptr, "N", G::Sampling, "last n tokens the penalties look at (default 64, 0 = off, -1 = context)",
         [](Options& o, const Arg& a) { o.sampling.penalty_last_n = a.to_int(); }},
        {{"--repeat-penalty"}, {}, "LLAMA_ARG_REPEAT_PENALTY", "N", G::Sampling, "repeat penalty (default 1.0 = off)",
         [](Options& o, const Arg& a) { o.sampling.repeat_penalty = a.to_float(); }},
        {{"--presence-penalty"}, {}, "LLAMA_ARG_PRESENCE_PENALTY", "N", G::Sampling, "presence penalty (default 0.0 = off)",
         [](Options& o, const Arg& a) { o.sampling.presence_penalty = a.to_float(); }},
        {{"--frequency-penalty"}, {}, "LLAMA_ARG_FREQUENCY_PENALTY", "N", G::Sampling, "frequency penalty (default 0.0 = off)",
         [](Options& o, const Arg& a) { o.sampling.frequency_penalty = a.to_float(); }},
        {{"--dry-multiplier"}, {}, nullptr, "N", G::Sampling, "DRY sampling multiplier", [](Options& o, const Arg& a) { o.sampling.dry_multiplier = a.to_float(); }},
        {{"--dry-base"}, {}, nullptr, "N", G::Sampling, "DRY sampling base", [](Options& o, const Arg& a) { o.sampling.dry_base = a.to_float(); }},
        {{"--dry-allowed-length"}, {}, nullptr, "N", G::Sampling, "DRY allowed length", [](Options& o, const Arg& a) { o.sampling.dry_allowed_length = a.to_int(); }},
        {{"--dry-penalty-last-n"}, {}, nullptr, "N", G::Sampling, "DRY penalty window (default -1 = context)", [](Options& o, const Arg& a) { o.sampling.dry_penalty_last_n = a.to_int(); }},
        {{"--dry-sequence-breaker"}, {}, nullptr, "STRING", G::Sampling, "DRY sequence breaker", add_dry_breaker},
        {{"--adaptive-target"}, {}, nullptr, "N", G::Sampling, "adaptive-p target", note(kLater)},
        {{"--adaptive-decay"}, {}, nullptr, "N", G::Sampling, "adaptive-p decay", note(kLater)},
        {{"--dynatemp-range"}, {}, nullptr, "N", G::Sampling, "dynamic temperature range", [](Options& o, const Arg& a) { o.sampling.dynatemp_range = a.to_float(); }},
        {{"--dynatemp-exp"}, {}, nullptr, "N", G::Sampling, "dynamic temperature exponent", [](Options& o, const Arg& a) { o.sampling.dynatemp_exponent = a.to_float(); }},
        {{"--mirostat"}, {}, nullptr, "N", G::Sampling, "Mirostat sampling (0 off, 1, 2)", [](Options& o, const Arg& a) { o.sampling.mirostat = a.to_int(); }},
        {{"--mirostat-lr"}, {}, nullptr, "N", G::Sampling, "Mirostat learning rate", [](Options& o, const Arg& a) { o.sampling.mirostat_eta = a.to_float(); }},
        {{"--mirostat-ent"}, {}, nullptr, "N", G::Sampling, "Mirostat target entropy", [](Options& o, const Arg& a) { o.sampling.mirostat_tau = a.to_float(); }},
        {{"-l", "--logit-bias"}, {}, nullptr, "TOKEN_ID(+/-)BIAS", G::Sampling, "logit bias", add_logit_bias},
        {{"--grammar"}, {}, nullptr, "GRAMMAR", G::Sampling, "GBNF grammar", [](Options& o, const Arg& a) { o.sampling.grammar = checked_grammar(a, a.value); }},
        {{"--grammar-file"}, {}, nullptr, "FNAME", G::Sampling, "file to read the grammar from", [](Options& o, const Arg& a) { o.sampling.grammar = checked_grammar(a, read_text_file(a)); }},
        {{"-j", "--json-schema"}, {}, nullptr, "SCHEMA", G::Sampling, "JSON schema", [](Options& o, const Arg& a) { o.sampling.grammar = schema_grammar(a, a.value); }},
        {{"-jf", "--json-schema-file"}, {}, nullptr, "FILE", G::Sampling, "JSON schema file", [](Options& o, const Arg& a) { o.sampling.grammar = schema_grammar(a, read_text_file(a)); }},
        {{"-bs", "--backend-sampling"}, {}, "LLAMA_ARG_BACKEND_SAMPLING", nullptr, G::Sampling, "backend sampling", note(kCpuOnly)},

        // ---- example-specific params (llama-server)
        {{"-lcs", "--lookup-cache-static"}, {}, nullptr, "FNAME", G::Server, "static lookup cache", note(kNoLookupCache)},
        {{"-lcd", "--lookup-cache-dynamic"}, {}, nullptr, "FNAME", G::Server, "dynamic lookup cache", note(kNoLookupCache)},
        {{"-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"}, {}, "LLAMA_ARG_CTX_CHECKPOINTS", "N", G::Server, "context checkpoints per slot",
         note("slots keep their whole KV sequence; no checkpoints are needed (ignored)")},
        {{"-cram", "--cache-ram"}, {}, "LLAMA_ARG_CACHE_RAM", "N", G::Server, "host-RAM cache of evicted slot states in MiB (default 8192, 0 off, -1 no limit)",
         [](Options& o, const Arg& a) { o.srv.cache_ram_mib = a.to_int(); }},
        {{"-kvu", "--kv-unified"}, {"-no-kvu", "--no-kv-unified"}, "LLAMA_ARG_KV_UNIFIED", nullptr, G::Server,
         "one KV pool of -c cells shared by all slots (a request may use all of it)", [](Options& o, const Arg& a) { o.srv.kv_unified = a.on(); }},
        {{"--cache-idle-slots"}, {"--no-cache-idle-slots"}, "LLAMA_ARG_CACHE_IDLE_SLOTS", nullptr, G::Server, "save idle slots to the RAM cache",
         note("idle slots go to the RAM cache whenever their cells are needed (--cache-ram)")},
        {{"--context-shift"}, {"--no-context-shift"}, "LLAMA_ARG_CONTEXT_SHIFT", nullptr, G::Server,
         "when a slot fills up, drop the older half after --keep N tokens (default: off)", [](Options& o, const Arg& a) { o.srv.context_shift = a.on(); }},
        {{"-r", "--reverse-prompt"}, {}, nullptr, "PROMPT", G::Server, "stop generating at PROMPT (with --bench, -r N is the repetitions)",
         [](Options& o, const Arg& a) {
             if (a.flag == "-r") o.short_r = a.value;
             else o.reverse_prompts.push_back(a.value);
         }},
        {{"-sp", "--special"}, {}, nullptr, nullptr, G::Server, "special tokens output enabled (default: off)",
         [](Options& o, const Arg&) { o.special = true; }},
        {{"--warmup"}, {"--no-warmup"}, nullptr, nullptr, G::Server, "warm-up decode before reporting healthy (default: on)",
         [](Options& o, const Arg& a) { o.srv.warmup = a.on(); }},
        {{"--spm-infill"}, {}, nullptr, nullptr, G::Server, "Suffix/Prefix/Middle pattern for infill (default: Prefix/Suffix/Middle)",
         [](Options& o, const Arg&) { o.srv.spm_infill = true; }},
        {{"--pooling"}, {}, "LLAMA_ARG_POOLING", "{none,mean,cls,last,rank}", G::Server, "pooling type for embeddings (default: the model's own)",
         [](Options& o, const Arg& a) {
             try {
                 o.pooling = llm::pooling_from_name(a.value);
             } catch (const llm::Error& e) {
                 usage_error(e.what());
             }
         }},
        {{"-np", "--parallel"}, {}, "LLAMA_ARG_N_PARALLEL", "N", G::Server, "slots: requests served at once, -c split across them (default 1; -1 = 4 slots in one pool)",
         [](Options& o, const Arg& a) {
             o.n_parallel = a.to_int() == -1 ? 4 : a.to_int();
             if (a.to_int() == -1) o.srv.kv_unified = true;
         }},
        {{"-cb", "--cont-batching"}, {"-nocb", "--no-cont-batching"}, "LLAMA_ARG_CONT_BATCHING", nullptr, G::Server, "continuous batching",
         note("continuous batching is always on")},
        {{"-mm", "--mmproj"}, {}, "LLAMA_ARG_MMPROJ", "FILE", G::Server, "multimodal projector", note(kNoMedia, 'W')},
        {{"-mmu", "--mmproj-url"}, {}, "LLAMA_ARG_MMPROJ_URL", "URL", G::Server, "multimodal projector URL", note(kNoMedia)},
        {{"--mmproj-auto"}, {"--no-mmproj", "--no-mmproj-auto"}, "LLAMA_ARG_MMPROJ_AUTO", nullptr, G::Server, "use a multimodal projector if available", note(kNoMedia)},
        {{"--mmproj-offload"}, {"--no-mmproj-offload"}, "LLAMA_ARG_MMPROJ_OFFLOAD", nullptr, G::Server, "offload the multimodal projector", note(kNoMedia)},
        {{"-mmdev", "--mmproj-device"}, {}, "MTMD_BACKEND_DEVICE", "DEVICE", G::Server, "device of the multimodal projector", note(kNoMedia)},
        {{"--image-min-tokens"}, {}, "LLAMA_ARG_IMAGE_MIN_TOKENS", "N", G::Server, "minimum tokens per image", note(kNoMedia)},
        {{"--image-max-tokens"}, {}, "LLAMA_ARG_IMAGE_MAX_TOKENS", "N", G::Server, "maximum tokens per image", note(kNoMedia)},
        {{"-a", "--alias"}, {}, "LLAMA_ARG_ALIAS", "STRING", G::Server, "model name aliases, comma-separated (the first is reported; default: the model path)",
         [](Options& o, const Arg& a) { o.srv.aliases = a.list(); }},
        {{"--tags"}, {}, "LLAMA_ARG_TAGS", "STRING", G::Server, "model tags, comma-separated (informational, in /v1/models)",
         [](Options& o, const Arg& a) { o.srv.tags = a.list(); }},
        {{"--embd-normalize"}, {}, nullptr, "N", G::Server,
         "normalisation for embeddings: -1 none, 0 max absolute int16, 1 taxicab, 2 euclidean (default), >2 p-norm",
         [](Options& o, const Arg& a) { o.srv.embd_normalize = a.to_int(); }},
        {{"--host"}, {}, "LLAMA_ARG_HOST", "HOST", G::Server, "address to listen on, numeric IPv4/IPv6 (default 127.0.0.1)",
         [](Options& o, const Arg& a) { o.srv.host = a.value; }},
        {{"--port"}, {}, "LLAMA_ARG_PORT", "PORT", G::Server, "port (default 8080; 0 = any free one, logged as 'listening on H:P')",
         [](Options& o, const Arg& a) { o.srv.port = a.to_int(); }},
        {{"--reuse-port"}, {}, "LLAMA_ARG_REUSE_PORT", nullptr, G::Server, "share the port with other sockets", note("the port is bound once, with SO_REUSEADDR (ignored)")},
        {{"--path"}, {}, "LLAMA_ARG_STATIC_PATH", "PATH", G::Server, "static files to serve", note("no static files are served from disk (ignored)", 'W')},
        {{"--api-prefix"}, {}, "LLAMA_ARG_API_PREFIX", "PREFIX", G::Server, "path prefix of every endpoint, without the trailing slash (default: none)",
         [](Options& o, const Arg& a) {
             if (!a.value.empty() && (a.value[0] != '/' || a.value.back() == '/')) usage_error("--api-prefix must start with '/' and not end with one");
             o.srv.api_prefix = a.value;
         }},
        {{"--webui-config", "--ui-config"}, {}, "LLAMA_ARG_UI_CONFIG", "JSON", G::Server, "default web UI settings", note("the web page has no settings (ignored)")},
        {{"--webui-config-file", "--ui-config-file"}, {}, "LLAMA_ARG_UI_CONFIG_FILE", "PATH", G::Server, "default web UI settings file",
         note("the web page has no settings (ignored)")},
        {{"--webui", "--ui"}, {"--no-webui", "--no-ui"}, "LLAMA_ARG_UI", nullptr, G::Server, "serve the web page at / (default: on)",
         [](Options& o, const Arg& a) { o.srv.webui = a.on(); }},
        {{"--embedding", "--embeddings"}, {}, "LLAMA_ARG_EMBEDDINGS", nullptr, G::Server,
         "embedding-only mode: /embedding(s) and /v1/embeddings, no completions", [](Options& o, const Arg& a) { o.embedding = a.on(); }},
        {{"--rerank", "--reranking"}, {}, "LLAMA_ARG_RERANKING", nullptr, G::Server,
         "reranking endpoint /rerank (embeddings with rank pooling: the model's classification head)",
         [](Options& o, const Arg& a) { o.srv.reranking = o.embedding = a.on(); }},
        {{"--api-key"}, {}, "LLAMA_API_KEY", "KEY", G::Server, "API keys, comma-separated: requests need 'Authorization: Bearer KEY' (/health stays open)",
         [](Options& o, const Arg& a) {
             for (const std::string& k : a.list()) o.srv.api_keys.push_back(k);
         }},
        {{"--api-key-file"}, {}, "LLAMA_ARG_API_KEY_FILE", "FNAME", G::Server, "file of API keys, one per line ('#' lines are comments)", read_api_key_file},
        {{"--ssl-key-file"}, {}, "LLAMA_ARG_SSL_KEY_FILE", "FNAME", G::Server,
         "TLS private key: this build has no TLS, so the server refuses to start (put a TLS proxy in front)",
         [](Options& o, const Arg& a) { o.srv.ssl_key_file = a.value; }},
        {{"--ssl-cert-file"}, {}, "LLAMA_ARG_SSL_CERT_FILE", "FNAME", G::Server,
         "TLS certificate: this build has no TLS, so the server refuses to start (put a TLS proxy in front)",
         [](Options& o, const Arg& a) { o.srv.ssl_cert_file = a.value; }},
        {{"--chat-template-kwargs"}, {}, "LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "STRING", G::Server, "default chat_template_kwargs, a JSON object",
         [](Options& o, const Arg& a) { o.srv.chat_template_kwargs = a.value; }},
        {{"-to", "--timeout"}, {}, "LLAMA_ARG_TIMEOUT", "N", G::Server, "write timeout for slow clients in seconds (default 600)",
         [](Options& o, const Arg& a) { o.srv.timeout_s = a.to_int(); }},
        {{"--sse-ping-interval"}, {}, "LLAMA_ARG_SSE_PING_INTERVAL", "N", G::Server, "SSE ping interval", note("streams send no pings (ignored)")},
        {{"--threads-http"}, {}, "LLAMA_ARG_THREADS_HTTP", "N", G::Server, "HTTP threads",
         note("one thread per connection, bounded by --max-connections (ignored)")},
        {{"--cache-prompt"}, {"--no-cache-prompt"}, "LLAMA_ARG_CACHE_PROMPT", nullptr, G::Server, "reuse a slot's cached prompt prefix (default: on)",
         [](Options& o, const Arg& a) { o.srv.cache_prompt = a.on(); }},
        {{"--cache-reuse"}, {}, "LLAMA_ARG_CACHE_REUSE", "N", G::Server,
         "least chunk of a slot's cached prompt reused at a new position via KV shifting, with prompt caching (default: 0 = off)",
         [](Options& o, const Arg& a) { o.srv.cache_reuse = a.to_int(); }},
        {{"--metrics"}, {}, "LLAMA_ARG_ENDPOINT_METRICS", nullptr, G::Server, "serve Prometheus metrics at /metrics (default: off)",
         [](Options& o, const Arg& a) { o.srv.metrics = a.on(); }},
        {{"--props"}, {}, "LLAMA_ARG_ENDPOINT_PROPS", nullptr, G::Server, "allow POST /props (default: off)",
         [](Options& o, const Arg& a) { o.srv.props_post = a.on(); }},
        {{"--slots"}, {"--no-slots"}, "LLAMA_ARG_ENDPOINT_SLOTS", nullptr, G::Server, "serve /slots (default: on)",
         [](Options& o, const Arg& a) { o.srv.slots = a.on(); }},
        {{"--slot-save-path"}, {}, "LLAMA_ARG_SLOT_SAVE_PATH", "PATH", G::Server, "folder of /slots/{id}?action=save|restore files (default: off)",
         [](Options& o, const Arg& a) { o.srv.slot_save_path = a.value; }},
        {{"--media-path"}, {}, nullptr, "PATH", G::Server, "local media files", note(kNoMedia)},
        {{"--models-dir"}, {}, "LLAMA_ARG_MODELS_DIR", "PATH", G::Server, "router mode (no -m): serve every *.gguf in PATH, one child process each",
         [](Options& o, const Arg& a) { o.srv.models_dir = a.value; }},
        {{"--models-preset"}, {}, "LLAMA_ARG_MODELS_PRESET", "PATH", G::Server, "router mode: models from an INI file (a section per model, keys are long flags, [*] defaults)",
         [](Options& o, const Arg& a) { o.srv.models_preset = a.value; }},
        {{"--models-max"}, {}, "LLAMA_ARG_MODELS_MAX", "N", G::Server, "router mode: models running at once, least recently used stopped first (default 4, 0 = no limit)",
         [](Options& o, const Arg& a) { o.srv.models_max = a.to_int(); }},
        {{"--models-autoload"}, {"--no-models-autoload"}, "LLAMA_ARG_MODELS_AUTOLOAD", nullptr, G::Server, "router mode: start a model on its first request (default: on)",
         [](Options& o, const Arg& a) { o.srv.models_autoload = a.on(); }},
        {{"--jinja"}, {"--no-jinja"}, "LLAMA_ARG_JINJA", nullptr, G::Server,
         "render the chat template's Jinja as is (default: on; --no-jinja: the recognized family's built-in renderer)",
         [](Options& o, const Arg& a) { o.srv.jinja = a.on(); }},
        {{"--reasoning-format"}, {}, "LLAMA_ARG_THINK", "FORMAT", G::Server,
         "none: thinking stays in message.content; deepseek or auto (default): it goes to reasoning_content",
         [](Options& o, const Arg& a) {
             if (a.value != "none" && a.value != "deepseek" && a.value != "auto" && a.value != "deepseek-legacy")
                 usage_error("--reasoning-format must be none, deepseek or auto");
             o.srv.reasoning_format = a.value;
         }},
        {{"-rea", "--reasoning"}, {}, "LLAMA_ARG_REASONING", "[on|off|auto]", G::Server,
         "thinking of reasoning models: on / off set the default chat_template_kwargs.enable_thinking, auto (default) leaves it to the template",
         [](Options& o, const Arg& a) {
             if (a.value != "on" && a.value != "off" && a.value != "auto") usage_error("--reasoning must be on, off or auto");
             o.srv.reasoning = a.value;
         }},
        {{"--reasoning-effort"}, {}, "LLAMA_ARG_REASONING_EFFORT", "LEVEL", G::Server, "reasoning effort", note("ignored")},
        {{"--reasoning-budget"}, {}, "LLAMA_ARG_THINK_BUDGET", "N", G::Server,
         "thinking tokens before the template's end-of-thinking tag is forced (-1: unlimited (default), 0: no thinking)",
         [](Options& o, const Arg& a) {
             o.srv.reasoning_budget = a.to_int();
             if (o.srv.reasoning_budget < -1) usage_error("--reasoning-budget must be -1 or more");
         }},
        {{"--reasoning-budget-message"}, {}, "LLAMA_ARG_THINK_BUDGET_MESSAGE", "MESSAGE", G::Server, "message at the end of the budget", note("no thinking budget (ignored)")},
        {{"--reasoning-preserve"}, {"--no-reasoning-preserve"}, "LLAMA_ARG_REASONING_PRESERVE", nullptr, G::Server, "preserve reasoning in the history", note("ignored")},
        {{"--chat-template"}, {}, "LLAMA_ARG_CHAT_TEMPLATE", "JINJA_TEMPLATE", G::Server,
         "a built-in template name (chatml, llama3, gemma, command-r, ... as llama-server), or a Jinja template (default: the model's)",
         [](Options& o, const Arg& a) { o.srv.chat_template = a.value; }},
        {{"--chat-template-file"}, {}, "LLAMA_ARG_CHAT_TEMPLATE_FILE", "JINJA_TEMPLATE_FILE", G::Server, "a Jinja template file",
         [](Options& o, const Arg& a) { o.srv.chat_template_file = a.value; }},
        {{"--skip-chat-parsing"}, {"--no-skip-chat-parsing"}, "LLAMA_ARG_SKIP_CHAT_PARSING", nullptr, G::Server, "pure content parser",
         note("the output is never parsed: everything is content")},
        {{"--prefill-assistant"}, {"--no-prefill-assistant"}, "LLAMA_ARG_PREFILL_ASSISTANT", nullptr, G::Server, "prefill a last assistant message",
         note("ignored")},
        {{"-sps", "--slot-prompt-similarity"}, {}, nullptr, "SIMILARITY", G::Server, "prompt similarity to reuse a slot",
         note("a request goes to the idle slot with the longest common prefix (ignored)")},
        {{"--lora-init-without-apply"}, {}, nullptr, nullptr, G::Server, "load LoRA adapters without applying them", note("LoRA adapters are not supported (ignored)")},
        {{"--sleep-idle-seconds"}, {}, nullptr, "SECONDS", G::Server, "sleep when idle", note("the server never unloads its model (ignored)")},
        {{"--log-prompts-dir"}, {}, nullptr, "PATH", G::Server, "log prompts to a folder", note("use -v to log request bodies (ignored)")},
        {{"-md", "--model-draft", "--spec-draft-model"}, {}, "LLAMA_ARG_MODEL_DRAFT", "FNAME", G::Server,
         "draft model for speculative decoding (its vocabulary must be the target's)", [](Options& o, const Arg& a) { o.spec.model = a.value; }},
        {{"-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"}, {}, "LLAMA_ARG_HFD_REPO", "<user>/<model>[:quant]", G::Server, "draft model repository", note(kNoDownload)},
        {{"-td", "--threads-draft", "--spec-draft-threads"}, {}, nullptr, "N", G::Server, "threads of the draft model (default: as -t; they are the target's workers)",
         [](Options& o, const Arg& a) { o.spec.n_threads = std::max(0, a.to_int()); }},
        {{"-tbd", "--threads-batch-draft", "--spec-draft-threads-batch"}, {}, nullptr, "N", G::Server, "batch threads of the draft model (default: as -td)",
         [](Options& o, const Arg& a) { o.spec.n_threads_batch = std::max(0, a.to_int()); }},
        {{"-Cd", "--cpu-mask-draft"}, {}, nullptr, "M", G::Server, "draft CPU mask", note(kThreadsOwn)},
        {{"-Crd", "--cpu-range-draft"}, {}, nullptr, "lo-hi", G::Server, "draft CPU range", note(kThreadsOwn)},
        {{"-cd", "--ctx-size-draft", "--spec-draft-ctx-size"}, {}, "LLAMA_ARG_CTX_SIZE_DRAFT", "N", G::Server, "context size of the draft model (default: the target's)",
         [](Options& o, const Arg& a) { o.spec.n_ctx = std::max(0, a.to_int()); }},
        {{"-devd", "--device-draft", "--spec-draft-device"}, {}, nullptr, "<dev1,dev2,..>", G::Server, "devices of the draft model",
         note("the draft model runs where -ngld places it, on the one device (ignored)")},
#ifdef LLM_OFFLOAD
        {{"-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"}, {}, "LLAMA_ARG_N_GPU_LAYERS_DRAFT", "N", G::Server,
         "draft model layers to store in VRAM (as -ngl)", [](Options& o, const Arg& a) { o.spec.n_gpu_layers = gpu_layer_count(a); }},
#else
        {{"-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"}, {}, "LLAMA_ARG_N_GPU_LAYERS_DRAFT", "N", G::Server, "draft model layers in VRAM", note(kCpuOnly)},
#endif
        {{"--draft", "--draft-n", "--draft-max", "--spec-draft-n-max"}, {}, "LLAMA_ARG_DRAFT_MAX", "N", G::Server, "most tokens to draft per step (default 16)",
         [](Options& o, const Arg& a) { o.spec.draft.n_max = a.to_int(); }},
        {{"--draft-min", "--draft-n-min", "--spec-draft-n-min"}, {}, "LLAMA_ARG_DRAFT_MIN", "N", G::Server, "fewest drafted tokens worth verifying (default 0)",
         [](Options& o, const Arg& a) { o.spec.draft.n_min = a.to_int(); }},
        {{"--draft-p-min", "--spec-draft-p-min"}, {}, "LLAMA_ARG_DRAFT_P_MIN", "P", G::Server, "the draft model stops before a token it gives less (default 0.75)",
         [](Options& o, const Arg& a) { o.spec.draft.p_min = a.to_float(); }},
        {{"--draft-p-split", "--spec-draft-p-split"}, {}, "LLAMA_ARG_DRAFT_P_SPLIT", "P", G::Server, "draft split probability", note("drafts are one sequence, never a tree (ignored)")},
        {{"--spec-type"}, {}, "LLAMA_ARG_SPEC_TYPE", "TYPES", G::Server,
         "speculative decoding: none, draft-simple (with -md), ngram-simple (drafts from earlier occurrences of the last tokens); comma-separated", set_spec_type},
        {{"--spec-ngram-size-n", "--spec-ngram-simple-size-n"}, {}, nullptr, "N", G::Server, "n-gram speculation: the longest suffix looked up (default 3)",
         [](Options& o, const Arg& a) { o.spec.ngram_n = a.to_int(); }},
        {{"--spec-backoff"}, {}, nullptr, "MODE", G::Server,
         "cost (default): drafts sized by the measured cost of verifying them and their acceptance, the draft model skipped while it does not pay; "
         "none: every step drafts as far as --draft-max and --draft-p-min allow (not in llama-server)",
         [](Options& o, const Arg& a) {
             if (a.value != "cost" && a.value != "none") usage_error(a.flag + ": expected cost or none, got '" + a.value + "'");
             o.spec.backoff = a.value == "cost";
         }},
        {{"--spec-draft-vocab"}, {}, nullptr, "N", G::Server,
         "the draft model's LM head computes the logits of the first N token ids only (BPE ids come roughly by frequency), "
         "so it never proposes a later one; 0: the whole vocabulary (default 32768; not in llama-server)",
         [](Options& o, const Arg& a) { o.spec.draft_vocab = a.to_int(); }},
        {{"--spec-default"}, {}, nullptr, nullptr, G::Server, "default speculative decoding config",
         [](Options& o, const Arg&) { o.spec.ngram = true; }},
        {{"--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default", "--fim-qwen-7b-default", "--fim-qwen-7b-spec",
          "--fim-qwen-14b-spec", "--fim-qwen-30b-default", "--gpt-oss-20b-default", "--gpt-oss-120b-default", "--vision-gemma-4b-default",
          "--vision-gemma-12b-default"},
         {}, nullptr, nullptr, G::Server, "presets that download a model", note(kNoDownload)},
        // Not in llama-server: limits of this server.
        {{"--max-queue"}, {}, nullptr, "N", G::Server, "requests that may wait for a slot; beyond, 503 at once (default 64)",
         [](Options& o, const Arg& a) { o.srv.max_queue = a.to_int(); }},
        {{"--max-connections"}, {}, nullptr, "N", G::Server, "concurrent connections (default 64)",
         [](Options& o, const Arg& a) { o.srv.max_connections = a.to_int(); }},
        {{"--max-connections-per-client"}, {}, nullptr, "N", G::Server,
         "of those, from one client address (default: half of --max-connections; behind a proxy, raise it)",
         [](Options& o, const Arg& a) { o.srv.max_connections_per_client = a.to_int(); }},
        {{"--shutdown-grace"}, {}, nullptr, "S", G::Server, "on SIGTERM/SIGINT, time in-flight requests get to finish (default 10)",
         [](Options& o, const Arg& a) { o.srv.shutdown_grace_s = a.to_int(); }},

        // ---- command-line modes
        {{"-p", "--prompt"}, {}, nullptr, "TEXT", G::Modes, "complete TEXT and print timings (with --bench: the prompt length)",
         [](Options& o, const Arg& a) { o.prompt = a.value; o.has_prompt = true; }},
        {{"-f", "--file"}, {}, nullptr, "FILE", G::Modes, "read the prompt from FILE (its bytes exactly)", [](Options& o, const Arg& a) { o.prompt_file = a.value; }},
        {{"--prompt-ids"}, {}, nullptr, "1,2,3", G::Modes, "give the prompt as token ids",
         [](Options& o, const Arg& a) { o.prompt_ids = parse_ids(a); o.has_prompt_ids = true; }},
        {{"--dump-logits"}, {}, nullptr, "FILE", G::Modes, "write float32 logits of every prompt position (n_tokens x n_vocab) and exit",
         [](Options& o, const Arg& a) { o.dump_logits = a.value; }},
        {{"--tokenize"}, {}, nullptr, nullptr, G::Modes, "print the prompt's token ids and exit", [](Options& o, const Arg&) { o.tokenize = true; }},
        {{"--add-special"}, {}, nullptr, nullptr, G::Modes, "with --tokenize: add BOS/EOS as the model's metadata says",
         [](Options& o, const Arg&) { o.add_special = true; }},
        {{"--parse-special"}, {}, nullptr, nullptr, G::Modes, "with --tokenize: parse special-token text into special tokens",
         [](Options& o, const Arg&) { o.parse_special = true; }},
        {{"--bench"}, {}, nullptr, nullptr, G::Modes, "measure pp (-p N tokens) and tg (-n N tokens), -r repetitions, median",
         [](Options& o, const Arg&) { o.bench = true; }},
        {{"--repetitions"}, {}, nullptr, "N", G::Modes, "--bench repetitions (default 5; also -r N with --bench)",
         [](Options& o, const Arg& a) { o.bench_reps = a.to_int(); }},
        {{"--perplexity"}, {}, nullptr, "FILE", G::Modes, "perplexity of FILE in chunks of -c tokens (default 512), second halves scored",
         [](Options& o, const Arg& a) { o.perplexity_file = a.value; }},
        {{"--kl-base"}, {}, nullptr, "BASE.gguf", G::Modes, "with --perplexity: also KL divergence and top-1 agreement against BASE",
         [](Options& o, const Arg& a) { o.kl_base = a.value; }},
        {{"--chunks"}, {}, nullptr, "N", G::Modes, "with --perplexity: at most N chunks", [](Options& o, const Arg& a) { o.n_chunks = a.to_int(); }},
        {{"--plan"}, {}, nullptr, nullptr, G::Modes, "print the memory a deployment needs for -c N tokens per slot and -np N slots, without loading weights",
         [](Options& o, const Arg&) { o.plan = true; }},
        {{"--render-chat"}, {}, nullptr, "REQUEST.json", G::Modes,
         "print the prompt --chat-template-file renders for REQUEST ({\"messages\", \"tools\", \"add_generation_prompt\", "
         "\"chat_template_kwargs\", \"bos_token\", \"eos_token\"}) byte for byte, without a model; an error: one line, exit status 1",
         [](Options& o, const Arg& a) { o.render_chat = a.value; }},
        {{"--moe-per-token"}, {}, nullptr, nullptr, G::Modes, "run MoE experts token by token instead of grouped by expert (benchmarks)",
         [](Options& o, const Arg&) { o.moe_per_token = true; }},
    };
    return table;
}

std::string spellings(const Flag& f) {
    std::string s;
    for (const auto* names : {&f.names, &f.negations}) {
        for (const std::string& n : *names) s += (s.empty() ? "" : ", ") + n;
    }
    return f.value ? s + " " + f.value : s;
}

void print_usage() {
    printf("usage: llm-server -m MODEL [options]\n\n"
           "Without a command-line mode (below) it serves llama-server's HTTP API. Flags that cannot apply to\n"
           "this CPU build are accepted and logged with what they mean here.\n");
    for (Group g : {Group::Common, Group::Sampling, Group::Server, Group::Modes}) {
        printf("\n----- %s -----\n\n", group_title(g));
        for (const Flag& f : flags()) {
            if (f.group != g) continue;
            std::string names = spellings(f);
            std::string help = f.help + (f.env ? std::string(" (env: ") + f.env + ")" : "");
            printf("%-40s %s\n", names.c_str(), names.size() > 40 ? ("\n" + std::string(41, ' ') + help).c_str() : help.c_str());
        }
    }
    exit(0);
}

void print_completion_bash() {
    std::string words;
    for (const Flag& f : flags()) {
        for (const auto* names : {&f.names, &f.negations}) {
            for (const std::string& n : *names) words += (words.empty() ? "" : " ") + n;
        }
    }
    printf("complete -o default -W \"%s\" llm-server\n", words.c_str());
    exit(0);
}

// Values an optional-value flag ("[on|off|auto]") may take from the next argument.
std::vector<std::string> optional_values(const char* value) {
    std::vector<std::string> out;
    std::string v(value);
    if (v.size() < 2 || v.front() != '[') return out;
    std::stringstream ss(v.substr(1, v.size() - 2));
    std::string item;
    while (std::getline(ss, item, '|')) out.push_back(item);
    return out;
}

// Applies the LLAMA_ARG_* variables that are set.
void apply_environment(Options& o) {
    for (const Flag& f : flags()) {
        const char* v = f.env ? getenv(f.env) : nullptr;
        if (v) f.apply(o, Arg{f.env, v});
    }
}

}  // namespace

int flag_arity(const std::string& spelling) {
    for (const Flag& f : flags()) {
        const bool named = std::find(f.names.begin(), f.names.end(), spelling) != f.names.end() ||
                           std::find(f.negations.begin(), f.negations.end(), spelling) != f.negations.end();
        if (!named) continue;
        if (!f.value || f.value[0] == '[') return 0;
        return 1 + (int)std::count(f.value, f.value + strlen(f.value), ' ');
    }
    return -1;
}

namespace {

void apply_argv(Options& o, int argc, char** argv) {
    std::map<std::string, std::pair<const Flag*, bool>> by_name;  // spelling -> flag, negation
    for (const Flag& f : flags()) {
        for (const std::string& n : f.names) by_name[n] = {&f, false};
        for (const std::string& n : f.negations) by_name[n] = {&f, true};
    }
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto it = by_name.find(a);
        if (it == by_name.end()) usage_error("unknown argument '" + a + "'");
        const Flag& f = *it->second.first;
        std::string value;
        if (!f.value) {
            value = it->second.second ? "false" : "true";
        } else if (f.value[0] == '[') {
            std::vector<std::string> allowed = optional_values(f.value);
            if (i + 1 < argc && std::find(allowed.begin(), allowed.end(), argv[i + 1]) != allowed.end()) value = argv[++i];
        } else {
            const int arity = 1 + (int)std::count(f.value, f.value + strlen(f.value), ' ');
            if (i + arity >= argc) usage_error("missing value after " + a);
            for (int k = 0; k < arity; k++) value += (k ? " " : "") + std::string(argv[++i]);
        }
        f.apply(o, Arg{a, value});
    }
}

}  // namespace

Options parse_args(int argc, char** argv) {
    Options o;
    apply_environment(o);
    apply_argv(o, argc, argv);
    if (!o.short_r.empty()) {  // llama-bench's -r N, or llama-server's -r PROMPT
        if (o.bench) o.bench_reps = Arg{"-r", o.short_r}.to_int();
        else o.reverse_prompts.push_back(o.short_r);
    }
    if (o.escape) o.prompt = unescape(o.prompt);
    if (o.model.empty() && o.render_chat.empty() && o.srv.models_dir.empty() && o.srv.models_preset.empty())
        usage_error("no model given (-m MODEL, or --models-dir / --models-preset for router mode)");
    if (o.n_batch <= 0) usage_error("--batch-size must be positive");
    if (o.n_threads < 0) usage_error("--threads must not be negative");
    if (o.n_threads_batch < 0) usage_error("--threads-batch must not be negative");
    if (o.poll < 0 || o.poll > 100) usage_error("--poll must be in 0..100");
    if (o.n_parallel <= 0 || o.n_parallel > 256) usage_error("--parallel must be in 1..256");
    if (o.spec.draft.n_max < 0 || o.spec.draft.n_max > 256) usage_error("--draft-max must be in 0..256");
    if (o.spec.draft.n_min < 0 || o.spec.draft.n_min > o.spec.draft.n_max) usage_error("--draft-min must be in 0..--draft-max");
    if (o.spec.ngram_n < 2 || o.spec.ngram_n > 64) usage_error("--spec-ngram-size-n must be in 2..64");
    if (o.spec.draft_vocab < 0) usage_error("--spec-draft-vocab must be 0 (all) or more");
    if (o.srv.reranking) {
        if (o.pooling != llm::Pooling::Unspecified && o.pooling != llm::Pooling::Rank) usage_error("--reranking needs --pooling rank");
        o.pooling = llm::Pooling::Rank;
    }
    return o;
}

std::string model_id(const Options& o) { return o.srv.aliases.empty() ? o.model : o.srv.aliases[0]; }

llm::ModelOptions model_options(const Options& o) {
    llm::ModelOptions mo;
    mo.use_mmap = o.use_mmap;
    mo.mlock = o.mlock;
    mo.interleave = o.repack;
    mo.n_gpu_layers = o.n_gpu_layers;
    mo.tensor_split = o.tensor_split;
    mo.main_gpu = o.main_gpu;
    mo.split_layers = o.split_layers;
    mo.devices = o.devices;
    return mo;
}

llm::ContextParams context_params(const Options& o, int n_ctx) {
    llm::ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_threads = o.n_threads;
    cp.n_threads_batch = o.n_threads_batch;
    cp.poll = o.poll;
    cp.type_k = o.type_k;
    cp.type_v = o.type_v;
    cp.flash_attn = o.flash_attn;
    cp.n_batch = o.n_batch;
    cp.moe_grouped = !o.moe_per_token;
    cp.embeddings = o.embedding;
    cp.pooling = o.pooling;
    return cp;
}

bool wants_server(const Options& o) {
    return !o.tokenize && !o.plan && !o.bench && o.render_chat.empty() && o.dump_logits.empty() && o.perplexity_file.empty() && !o.has_prompt &&
           !o.has_prompt_ids && o.prompt_file.empty();
}

}  // namespace srv
