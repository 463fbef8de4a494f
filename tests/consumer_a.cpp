// Header-only consumer check, part A: this translation unit holds the implementation; consumer_b.cpp
// includes the header plainly. Linking both into one program fails if the header defines anything
// non-inline outside the implementation section, or the implementation misses something declared.
#define LLM_IMPLEMENTATION
#include "../llm.hpp"
#include "../llm.hpp"  // the include guard must make a second inclusion harmless

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

std::string consumer_b_type_name(llm::Type t);  // consumer_b.cpp
bool consumer_b_rejects_garbage();                // consumer_b.cpp

// The engine as a plain user builds it (on the portable build: the scalar kernels every other
// architecture gets) against the reference logits of tiny-llama-F16: mean KL <= 5e-5, top-1 >= 0.98.
static bool golden_forward_pass(std::string& why) {
    const char* env = std::getenv("LLM_SHARED");
    const std::string dir = std::string(env ? env : "../shared") + "/golden/";
    auto slurp = [](const std::string& path) {
        std::ifstream f(path, std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    };
    const std::string js = slurp(dir + "logits/tiny-llama-F16-kvf16.json"), raw = slurp(dir + "logits/tiny-llama-F16-kvf16.logits.f32");
    const size_t at = js.find("\"tokens\"");
    if (at == std::string::npos) return why = "no reference tokens in " + dir, false;
    std::vector<int32_t> toks;
    std::stringstream list(js.substr(js.find('[', at) + 1, js.find(']', at) - js.find('[', at) - 1));
    for (std::string x; std::getline(list, x, ',');) toks.push_back(std::atoi(x.c_str()));
    auto m = llm::Model::load(dir + "models/tiny-llama-F16.gguf");
    const int nv = m->hp.n_vocab;
    if (raw.size() != toks.size() * nv * sizeof(float)) return why = "reference logits have the wrong size", false;
    llm::ContextParams cp;
    cp.n_ctx = 256;
    llm::Context ctx(*m, cp);
    llm::Batch b;
    for (size_t i = 0; i < toks.size(); i++) b.add(toks[i], (int)i, 0, true);
    ctx.decode(b);
    double mean_kl = 0, top1 = 0;
    for (size_t i = 0; i < toks.size(); i++) {
        const float* ref = (const float*)raw.data() + i * nv;
        const float* ours = ctx.logits((int)i);
        auto lse = [nv](const float* v) {
            double mx = v[0], s = 0;
            for (int j = 1; j < nv; j++) mx = std::max(mx, (double)v[j]);
            for (int j = 0; j < nv; j++) s += std::exp(v[j] - mx);
            return mx + std::log(s);
        };
        const double lr = lse(ref), lo = lse(ours);
        int ar = 0, ao = 0;
        for (int j = 0; j < nv; j++) {
            mean_kl += std::exp(ref[j] - lr) * ((ref[j] - lr) - (ours[j] - lo)) / toks.size();
            if (ref[j] > ref[ar]) ar = j;
            if (ours[j] > ours[ao]) ao = j;
        }
        top1 += (ar == ao) / (double)toks.size();
    }
    std::printf("consumer: %s engine, tiny-llama-F16 vs reference: mean KL %.3g, top-1 %.3f\n",
                llm::isa_name(llm::isa_best()).c_str(), mean_kl, top1);
    if (mean_kl > 5e-5 || top1 < 0.98) return why = "forward pass disagrees with the reference", false;
    return true;
}

int main() {
    if (consumer_b_type_name(llm::Type::Q4_K) != llm::type_info(llm::Type::Q4_K).name) {
        std::puts("consumer: type names differ between translation units");
        return 1;
    }
    if (!consumer_b_rejects_garbage()) {
        std::puts("consumer: a bad GGUF image did not throw llm::Error");
        return 1;
    }
    std::string why;
    if (!golden_forward_pass(why)) {
        std::printf("consumer: %s\n", why.c_str());
        return 1;
    }
    std::puts("consumer ok");
    return 0;
}
