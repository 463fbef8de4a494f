// simt_device.hpp - the GPU backend's Device on the SIMT emulator: "device memory" is host memory, and
// a launch by name runs the kernel of cuda/*.cuh compiled into this program on simt.hpp. Include it in
// one translation unit; register_emulator_driver() makes -ngl run the GPU code here.
#pragma once
#include "simt.hpp"
#include "../cuda/kernels.cuh"
#include "../cuda/backend.hpp"

#include <cstdlib>
#include <functional>
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

namespace simt_gpu {

// A launch with its arguments copied out of cuLaunchKernel-style pointers (as CUDA copies them when
// the launch is made or recorded into a graph): run it now, or keep it in a graph.
using BoundLaunch = std::function<void()>;
using Launcher = std::function<BoundLaunch(llm_gpu::Grid, llm_gpu::Grid, void**)>;

// kernel's launch with its parameters read from cuLaunchKernel-style pointers.
template <class... Params, size_t... I>
BoundLaunch bind_kernel(void (*kernel)(Params...), llm_gpu::Grid g, llm_gpu::Grid b, void** args, std::index_sequence<I...>) {
    return [kernel, g, b, values = std::make_tuple(*static_cast<std::decay_t<Params>*>(args[I])...)] {
        std::apply([&](const auto&... value) { simt::launch(dim3(g.x, g.y, g.z), dim3(b.x, b.y, b.z), kernel, value...); }, values);
    };
}
template <class... Params> Launcher launcher(void (*kernel)(Params...)) {
    return [kernel](llm_gpu::Grid g, llm_gpu::Grid b, void** args) { return bind_kernel(kernel, g, b, args, std::index_sequence_for<Params...>{}); };
}

// Every kernel by its extern "C" name.
inline const std::map<std::string, Launcher>& kernels() {
    static const std::map<std::string, Launcher> table = [] {
        std::map<std::string, Launcher> t;
#define LLM_REGISTER(name) t[#name] = launcher(name);
#define LLM_REGISTER_FLOAT(name, T) LLM_REGISTER(matvec_##name) LLM_REGISTER(matmul_##name) LLM_REGISTER(matvec_id_##name) LLM_REGISTER(matmul_id_##name)
#define LLM_REGISTER_INT(act, name) \
    LLM_REGISTER(matvec_##act##_##name) LLM_REGISTER(matvec_##act##_id_##name) LLM_REGISTER(matmul_##act##_##name) LLM_REGISTER(matmul_##act##_id_##name) \
    LLM_REGISTER(matmul_mma_##act##_##name) LLM_REGISTER(matmul_mma_##act##_id_##name)
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

// Launches recorded by EmulatedDevice::capture, each with its kernel's name.
struct EmulatedGraph : llm_gpu::Graph {
    const void* device = nullptr;
    std::vector<std::pair<const char*, BoundLaunch>> launches;
};

// What an emulated device has run: launch calls from the host, graphs recorded and replayed, and the
// kernels that ran (launched one by one or replayed).
struct LaunchCounts {
    size_t launches = 0, captures = 0, replays = 0, kernels = 0;
};

// One emulated GPU: "device memory" is host memory, limited to `total` bytes (alloc beyond that throws
// llm::DeviceMemoryError, as cuMemAlloc's out of memory does in the CUDA driver); it reports compute
// capability `cc`, which picks the kernels the backend launches (80 and up: the tensor-core products).
// A capture records the calling thread's launches as the CUDA driver's stream capture does; replay runs
// them in order.
class EmulatedDevice : public llm_gpu::Device {
public:
    EmulatedDevice(int ordinal, size_t total, int cc) : name_("CUDA" + std::to_string(ordinal)), total_(total), cc_(cc) {}
    int compute_capability() const override { return cc_; }
    std::string name() const override { return name_; }
    std::string description() const override { return "SIMT emulator"; }
    size_t total_bytes() const override { return total_; }
    size_t free_bytes() const override {
        std::lock_guard<std::mutex> lock(mu_);
        return total_ - used_;
    }
    void* alloc(size_t bytes) override {
        std::lock_guard<std::mutex> lock(mu_);
        if (bytes > total_ - used_)
            throw llm::DeviceMemoryError("emulated device " + name_ + ": out of memory for " + std::to_string(bytes >> 20) + " MiB (" +
                                         std::to_string((total_ - used_) >> 20) + " MiB free)");
        void* p = std::malloc(std::max<size_t>(1, bytes));
        if (!p) throw llm::DeviceMemoryError("emulated device " + name_ + ": the host is out of memory");
        sizes_[p] = bytes;
        used_ += bytes;
        return p;
    }
    void release(void* p) override {
        std::lock_guard<std::mutex> lock(mu_);
        used_ -= sizes_.at(p);
        sizes_.erase(p);
        std::free(p);
    }
    void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void launch(const char* kernel, llm_gpu::Grid grid, llm_gpu::Grid block, void** args) override {
        auto it = kernels().find(kernel);
        if (it == kernels().end()) throw llm::Error(std::string("emulated device: no kernel ") + kernel);
        BoundLaunch bound = it->second(grid, block, args);
        EmulatedGraph* graph = recording();
        if (graph && graph->device == this) {
            graph->launches.emplace_back(it->first.c_str(), std::move(bound));
            return;
        }
        launches_++;
        run(it->first.c_str(), bound);
    }
    std::unique_ptr<llm_gpu::Graph> capture(const std::function<void()>& launches, std::string&) override {
        auto graph = std::make_unique<EmulatedGraph>();
        graph->device = this;
        recording() = graph.get();
        try {
            launches();
        } catch (...) {
            recording() = nullptr;
            throw;
        }
        recording() = nullptr;
        captures_++;
        return graph;
    }
    void replay(llm_gpu::Graph& graph) override {
        replays_++;
        for (const auto& [kernel, bound] : dynamic_cast<EmulatedGraph&>(graph).launches) run(kernel, bound);
    }
    LaunchCounts counts() const { return {launches_, captures_, replays_, kernels_run_}; }
    // Runs so far (launched or replayed) of the kernels whose names start with `prefix` (what tests
    // check a path by).
    size_t launches(const std::string& prefix) const {
        std::lock_guard<std::mutex> lock(mu_);
        size_t n = 0;
        for (const auto& [name, count] : runs_by_kernel_) n += name.compare(0, prefix.size(), prefix) == 0 ? count : 0;
        return n;
    }

private:
    // The graph this thread's launches go to while a capture runs.
    static EmulatedGraph*& recording() {
        static thread_local EmulatedGraph* graph = nullptr;
        return graph;
    }
    void run(const char* kernel, const BoundLaunch& bound) {
        kernels_run_++;
        {
            std::lock_guard<std::mutex> lock(mu_);
            runs_by_kernel_[kernel]++;
        }
        try {
            bound();
        } catch (const simt::Error& e) {
            throw llm::Error(std::string("kernel ") + kernel + ": " + e.what());
        }
    }

    std::string name_;
    size_t total_;
    int cc_;
    mutable std::mutex mu_;
    std::map<std::string, size_t> runs_by_kernel_;
    size_t used_ = 0;
    std::map<void*, size_t> sizes_;
    std::atomic<size_t> launches_{0}, captures_{0}, replays_{0}, kernels_run_{0};
};

// The emulated ordinals CUDA_VISIBLE_DEVICES leaves visible, in its order (as the driver reads it: a
// comma list of indices, ending at the first that is not a valid one); unset: all of them.
inline std::vector<int> visible_ordinals(int n_devices) {
    std::vector<int> out;
    const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!env) {
        for (int i = 0; i < n_devices; i++) out.push_back(i);
        return out;
    }
    std::stringstream list(env);
    std::string item;
    while (std::getline(list, item, ',')) {
        char* end = nullptr;
        const long i = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || i < 0 || i >= n_devices || std::find(out.begin(), out.end(), int(i)) != out.end()) break;
        out.push_back(int(i));
    }
    return out;
}

// A positive count from the environment, with an optional K, M or G suffix (powers of 1024), else `fallback`.
inline size_t env_count(const char* name, size_t fallback) {
    const char* v = std::getenv(name);
    char* end = nullptr;
    const unsigned long long n = v ? std::strtoull(v, &end, 10) : 0;
    if (!n || !end) return fallback;
    const std::string suffix = end;
    const int shift = suffix == "K" ? 10 : suffix == "M" ? 20 : suffix == "G" ? 30 : suffix.empty() ? 0 : -1;
    return shift < 0 || n > (~0ull >> 34) ? fallback : size_t(n) << shift;
}

// -ngl runs on the emulator from now on, over n_devices emulated GPUs of memory_bytes each (0: from
// $LLM_EMU_DEVICES, default 1, and $LLM_EMU_MEMORY, bytes or 512M / 8G, default 64G), those CUDA_VISIBLE_DEVICES
// shows, of compute capability cc (0: $LLM_EMU_CC, default 70, a V100: the dp4a products; 80 and up
// runs prefill on the emulated tensor cores). The devices live as long as the program (contexts may
// outlive a later registration). Returns the new devices.
inline std::vector<EmulatedDevice*> register_emulator_driver(int n_devices = 0, size_t memory_bytes = 0, int cc = 0) {
    static std::mutex mu;
    static std::vector<std::unique_ptr<EmulatedDevice>> all;
    if (n_devices <= 0) n_devices = int(std::min<size_t>(16, env_count("LLM_EMU_DEVICES", 1)));
    if (memory_bytes == 0) memory_bytes = env_count("LLM_EMU_MEMORY", size_t(64) << 30);
    if (cc <= 0) cc = int(std::min<size_t>(1000, env_count("LLM_EMU_CC", 70)));
    std::vector<llm_gpu::Device*> devices;
    std::vector<EmulatedDevice*> emulated;
    {
        std::lock_guard<std::mutex> lock(mu);
        const std::vector<int> visible = visible_ordinals(n_devices);
        for (size_t i = 0; i < visible.size(); i++) {
            all.push_back(std::make_unique<EmulatedDevice>(int(i), memory_bytes, cc));
            devices.push_back(all.back().get());
            emulated.push_back(all.back().get());
        }
    }
    llm::set_offload_driver(llm_gpu::make_driver(
        "SIMT emulator",
        [n = devices.size()](std::string& why_not) {
            if (n == 0) why_not = "no CUDA device";
            return n > 0;
        },
        [devices] { return devices; }));
    return emulated;
}

} // namespace simt_gpu
