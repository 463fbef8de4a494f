// libFuzzer target for the GGUF parser: any byte string must parse or throw llm::Error, never crash,
// hang or allocate more than the input's size allows; the hyperparameter check and the quantizer's plan
// must then also only throw llm::Error. Run with scripts/fuzz.
#define LLM_IMPLEMENTATION
#include "../llm.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto g = llm::gguf_parse_memory(data, size);
        // Touch what a loader would: metadata lookups and every tensor's bytes.
        (void)g->get_str("general.architecture", "");
        (void)g->get_int("general.alignment", 0);
        volatile uint8_t sink = 0;
        volatile int64_t shape_sink = 0;
        for (const auto& t : g->tensors) {
            if (t.nbytes) sink ^= t.data[0] ^ t.data[t.nbytes - 1];
            shape_sink = shape_sink + t.nelements() + t.n_rows();   // UBSan: no shape product may overflow
        }
        (void)sink;
        (void)shape_sink;
        // What llm-quantize does before writing: the loader's hyperparameter check, then the per-tensor plan
        // (sizes from the shapes: a zero dimension must not divide).
        try {
            (void)llm::read_hparams(*g);
        } catch (const llm::Error&) {
        }
        llm::QuantizeOptions opt;
        opt.ftype = llm::FileType::Q4_K_M;
        opt.verbose = false;
        (void)llm::quantize_plan(*g, opt);
    } catch (const llm::Error&) {
    }
    return 0;
}
