// libFuzzer target for the GBNF parser and matcher and the JSON-schema converter: any input must
// parse or throw llm::Error, never crash, hang or grow without bound. The first byte picks the mode:
// even, a grammar (up to the first NUL) and a text to match (the rest); odd, a JSON schema whose
// grammar must itself parse. Run with scripts/fuzz.
#define LLM_IMPLEMENTATION
#include "../llm.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const std::string in(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        if (data[0] % 2 == 0) {
            const size_t nul = in.find('\0');
            llm::Grammar g(in.substr(0, nul));
            (void)g.matches(nul == std::string::npos ? std::string() : in.substr(nul + 1));
        } else {
            llm::Grammar g(llm::json_schema_to_grammar(in));
            (void)g.matches("{}");
        }
    } catch (const llm::Error&) {
    }
    return 0;
}
