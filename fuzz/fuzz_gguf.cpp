// libFuzzer target for the GGUF parser: any byte string must parse or throw llm::Error, never crash,
// hang or allocate more than the input's size allows. Run with scripts/fuzz.
#define LLM_IMPLEMENTATION
#include "../llm.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        auto g = llm::gguf_parse_memory(data, size);
        // Touch what a loader would: metadata lookups and every tensor's bytes.
        (void)g->get_str("general.architecture", "");
        (void)g->get_int("general.alignment", 0);
        volatile uint8_t sink = 0;
        for (const auto& t : g->tensors) {
            if (t.nbytes) sink ^= t.data[0] ^ t.data[t.nbytes - 1];
        }
        (void)sink;
    } catch (const llm::Error&) {
    }
    return 0;
}
