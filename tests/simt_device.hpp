// simt_device.hpp - the GPU backend's Device on the SIMT emulator: "device memory" is host memory, and
// a launch by name runs the kernel of cuda/*.cuh compiled into this program on simt.hpp. Include it in
// one translation unit; register_emulator_driver() makes -ngl run the GPU code here.
#pragma once
#include "simt.hpp"
#include "../cuda/kernels.cuh"
#include "../cuda/backend.hpp"

#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <utility>

namespace simt_gpu {

using Launcher = std::function<void(llm_gpu::Grid, llm_gpu::Grid, void**)>;

// A launcher that unpacks cuLaunchKernel-style argument pointers into the kernel's own parameters.
template <class... Params, size_t... I>
void call_kernel(void (*kernel)(Params...), llm_gpu::Grid g, llm_gpu::Grid b, void** args, std::index_sequence<I...>) {
    simt::launch(dim3(g.x, g.y, g.z), dim3(b.x, b.y, b.z), kernel, *static_cast<std::decay_t<Params>*>(args[I])...);
}
template <class... Params> Launcher launcher(void (*kernel)(Params...)) {
    return [kernel](llm_gpu::Grid g, llm_gpu::Grid b, void** args) { call_kernel(kernel, g, b, args, std::index_sequence_for<Params...>{}); };
}

// Every kernel by its extern "C" name.
inline const std::map<std::string, Launcher>& kernels() {
    static const std::map<std::string, Launcher> table = [] {
        std::map<std::string, Launcher> t;
#define LLM_REGISTER(name) t[#name] = launcher(name);
#define LLM_REGISTER_FLOAT(name, T) LLM_REGISTER(matvec_##name) LLM_REGISTER(matmul_##name) LLM_REGISTER(matvec_id_##name) LLM_REGISTER(matmul_id_##name)
#define LLM_REGISTER_INT(act, name) \
    LLM_REGISTER(matvec_##act##_##name) LLM_REGISTER(matvec_##act##_id_##name) LLM_REGISTER(matmul_##act##_##name) LLM_REGISTER(matmul_##act##_id_##name)
#define LLM_REGISTER_DP4A(name, T) LLM_REGISTER_INT(q8_1, name)
#define LLM_REGISTER_Q8_K(name, T) LLM_REGISTER_INT(q8_K, name)
#define LLM_REGISTER_ROWS(name, T) LLM_REGISTER(get_rows_##name)
#define LLM_REGISTER_KV(name, T) LLM_REGISTER(store_rows_##name)
#define LLM_REGISTER_KV_PAIR(kname, KT, vname, VT) LLM_REGISTER(flash_attn_##kname##_##vname)
        LLM_FOR_EACH_WEIGHT_TYPE(LLM_REGISTER_ROWS)
        LLM_FOR_EACH_FLOAT_TYPE(LLM_REGISTER_FLOAT)
        LLM_FOR_EACH_DP4A_TYPE(LLM_REGISTER_DP4A)
        LLM_FOR_EACH_Q8_K_TYPE(LLM_REGISTER_Q8_K)
        LLM_FOR_EACH_KV_TYPE(LLM_REGISTER_KV)
        LLM_FOR_EACH_KV_PAIR(LLM_REGISTER_KV_PAIR)
        LLM_FOR_EACH_KERNEL(LLM_REGISTER)
#undef LLM_REGISTER_KV_PAIR
#undef LLM_REGISTER_KV
#undef LLM_REGISTER_Q8_K
#undef LLM_REGISTER_DP4A
#undef LLM_REGISTER_ROWS
#undef LLM_REGISTER_INT
#undef LLM_REGISTER_FLOAT
#undef LLM_REGISTER
        return t;
    }();
    return table;
}

class EmulatedDevice : public llm_gpu::Device {
public:
    std::string name() const override { return "SIMT emulator"; }
    void* alloc(size_t bytes) override {
        void* p = std::malloc(bytes);
        if (!p) throw llm::Error("emulated device: out of memory for " + std::to_string(bytes) + " bytes");
        return p;
    }
    void release(void* p) override { std::free(p); }
    void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void launch(const char* kernel, llm_gpu::Grid grid, llm_gpu::Grid block, void** args) override {
        auto it = kernels().find(kernel);
        if (it == kernels().end()) throw llm::Error(std::string("emulated device: no kernel ") + kernel);
        try {
            it->second(grid, block, args);
        } catch (const simt::Error& e) {
            throw llm::Error(std::string("kernel ") + kernel + ": " + e.what());
        }
    }
};

// -ngl runs on the emulator from now on (one emulated device shared by all contexts).
inline void register_emulator_driver() {
    static EmulatedDevice device;
    llm::OffloadDriver d;
    d.name = device.name();
    d.probe = [](std::string&) { return true; };
    d.create = [](const llm::Model& m, const llm::ContextParams& cp, int n_cells) -> std::unique_ptr<llm::OffloadBackend> {
        return std::make_unique<llm_gpu::Forward>(device, m, cp, n_cells);
    };
    llm::set_offload_driver(d);
}

} // namespace simt_gpu
