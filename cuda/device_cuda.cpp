// device_cuda.cpp - the GPU backend's Device on a real GPU through CUDA's driver API, loaded at run time
// with dlopen("libcuda.so.1"): the binary links no CUDA library, and on a host without the driver (or
// without a GPU) the probe says so in one line and everything runs on the CPU. --device none never
// gets here: no context is created.
//
// The kernels come from the fatbin nvcc built from cuda/kernels.cu (device code per architecture, PTX
// for newer ones), embedded below with .incbin and loaded with cuModuleLoadData; launches look the
// kernels up by their extern "C" names. Linking this file into a program registers the CUDA driver.
#include "backend.hpp"

#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include <functional>
#include <map>
#include <mutex>
#include <string>

// The fatbin's bytes (LLM_CUDA_FATBIN: its path at build time).
#ifndef LLM_CUDA_FATBIN
#error "define LLM_CUDA_FATBIN as the path of the kernels' fatbin"
#endif
#define LLM_STR2(x) #x
#define LLM_STR(x) LLM_STR2(x)
asm(".section .rodata\n"
    ".balign 64\n"
    ".global llm_cuda_fatbin\n"
    "llm_cuda_fatbin:\n"
    ".incbin \"" LLM_STR(LLM_CUDA_FATBIN) "\"\n"
    ".byte 0\n"
    ".previous\n");
extern "C" const unsigned char llm_cuda_fatbin[];

namespace {

// The few driver API entry points we use, with their C types spelled out (no cuda.h needed).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUgraph = void*;
using CUgraphExec = void*;

struct DriverApi {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int*);
    CUresult (*cuDeviceGet)(CUdevice*, int);
    CUresult (*cuDeviceGetName)(char*, int, CUdevice);
    CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxSynchronize)();
    CUresult (*cuModuleLoadData)(CUmodule*, const void*);
    CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
    CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemGetInfo)(size_t*, size_t*);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**);
    CUresult (*cuGetErrorString)(CUresult, const char**);
    CUresult (*cuStreamCreate)(CUstream*, unsigned);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
    CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
    // CUDA graphs (decode): optional, nullptr when the driver lacks them (kernels are then launched one by one).
    CUresult (*cuStreamBeginCapture)(CUstream, int mode);
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
    CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*cuGraphExecDestroy)(CUgraphExec);
    CUresult (*cuGraphDestroy)(CUgraph);
    bool has_graphs() const {
        return cuStreamBeginCapture && cuStreamEndCapture && cuGraphInstantiateWithFlags && cuGraphLaunch && cuGraphExecDestroy && cuGraphDestroy;
    }
};

// Loads libcuda.so.1 and its symbols once; nullptr (and why) when the host has no usable driver.
const DriverApi* driver_api(std::string& why_not) {
    static DriverApi api;
    static std::string failure;
    static bool loaded = [] {
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            failure = "no CUDA driver (libcuda.so.1 not found)";
            return false;
        }
        bool ok = true;
        auto sym = [&](auto& fn, const char* name) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            if (!fn) failure = std::string("CUDA driver lacks ") + name, ok = false;
        };
        sym(api.cuInit, "cuInit");
        sym(api.cuDeviceGetCount, "cuDeviceGetCount");
        sym(api.cuDeviceGet, "cuDeviceGet");
        sym(api.cuDeviceGetName, "cuDeviceGetName");
        sym(api.cuDeviceTotalMem, "cuDeviceTotalMem_v2");
        sym(api.cuDeviceGetAttribute, "cuDeviceGetAttribute");
        sym(api.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
        sym(api.cuCtxSetCurrent, "cuCtxSetCurrent");
        sym(api.cuCtxSynchronize, "cuCtxSynchronize");
        sym(api.cuModuleLoadData, "cuModuleLoadData");
        sym(api.cuModuleGetFunction, "cuModuleGetFunction");
        sym(api.cuMemAlloc, "cuMemAlloc_v2");
        sym(api.cuMemFree, "cuMemFree_v2");
        sym(api.cuMemGetInfo, "cuMemGetInfo_v2");
        sym(api.cuLaunchKernel, "cuLaunchKernel");
        sym(api.cuGetErrorString, "cuGetErrorString");
        sym(api.cuStreamCreate, "cuStreamCreate");
        sym(api.cuStreamSynchronize, "cuStreamSynchronize");
        sym(api.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
        sym(api.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
        auto optional = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name)); };
        optional(api.cuStreamBeginCapture, "cuStreamBeginCapture_v2");
        optional(api.cuStreamEndCapture, "cuStreamEndCapture");
        optional(api.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
        optional(api.cuGraphLaunch, "cuGraphLaunch");
        optional(api.cuGraphExecDestroy, "cuGraphExecDestroy");
        optional(api.cuGraphDestroy, "cuGraphDestroy");
        if (!ok) return false;
        int count = 0;
        if (api.cuInit(0) != 0 || api.cuDeviceGetCount(&count) != 0 || count == 0) {
            failure = "no CUDA device";
            return false;
        }
        return true;
    }();
    if (!loaded) why_not = failure;
    return loaded ? &api : nullptr;
}

constexpr CUresult kOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY
constexpr int kComputeCapabilityMajor = 75, kComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr int kCaptureModeRelaxed = 2;      // CU_STREAM_CAPTURE_MODE_RELAXED

// An instantiated CUDA graph, destroyed on its device.
class CudaGraph : public llm_gpu::Graph {
public:
    CudaGraph(std::function<void(CUgraphExec)> destroy, CUgraphExec exec, size_t n_kernels)
        : destroy_(std::move(destroy)), exec_(exec), n_kernels_(n_kernels) {}
    ~CudaGraph() override { destroy_(exec_); }
    CUgraphExec exec() const { return exec_; }
    size_t n_kernels() const { return n_kernels_; }

private:
    std::function<void(CUgraphExec)> destroy_;
    CUgraphExec exec_;
    size_t n_kernels_;
};

// One GPU (a driver ordinal: CUDA_VISIBLE_DEVICES renumbers them) with its primary context, made
// current on whichever thread uses the device (the server decodes on its own thread). Copies and
// launches go in order on one stream of the device (non-blocking: no implicit synchronization with
// the legacy stream, which a stream capture forbids); a capture holds the stream for the thread that
// records, so no other thread's work lands in its graph.
class CudaDevice : public llm_gpu::Device {
public:
    explicit CudaDevice(const DriverApi& api, int ordinal) : api_(api), name_("CUDA" + std::to_string(ordinal)) {
        check(api_.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
        char name[256] = {};
        check(api_.cuDeviceGetName(name, sizeof name, device_), "cuDeviceGetName");
        description_ = name;
        check(api_.cuDeviceTotalMem(&total_, device_), "cuDeviceTotalMem");
        int major = 0, minor = 0;
        check(api_.cuDeviceGetAttribute(&major, kComputeCapabilityMajor, device_), "cuDeviceGetAttribute");
        check(api_.cuDeviceGetAttribute(&minor, kComputeCapabilityMinor, device_), "cuDeviceGetAttribute");
        compute_capability_ = major * 10 + minor;
        check(api_.cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
        bind();
        check(api_.cuModuleLoadData(&module_, llm_cuda_fatbin), "cuModuleLoadData (no kernels for this GPU's architecture?)");
        check(api_.cuStreamCreate(&stream_, kStreamNonBlocking), "cuStreamCreate");
    }
    std::string name() const override { return name_; }
    std::string description() const override { return description_; }
    size_t total_bytes() const override { return total_; }
    int compute_capability() const override { return compute_capability_; }
    size_t free_bytes() const override {
        bind();
        size_t free_bytes = 0, total = 0;
        check(api_.cuMemGetInfo(&free_bytes, &total), "cuMemGetInfo");
        return free_bytes;
    }
    void* alloc(size_t bytes) override {
        bind();
        CUdeviceptr p = 0;
        const CUresult r = api_.cuMemAlloc(&p, bytes);
        if (r == kOutOfMemory)
            throw llm::DeviceMemoryError("CUDA: cannot allocate " + std::to_string(bytes >> 20) + " MiB on " + name_ + " (" + description_ + ", " +
                                         std::to_string(free_bytes() >> 20) + " MiB free)");
        check(r, "cuMemAlloc");
        return reinterpret_cast<void*>(p);
    }
    void release(void* p) override {
        bind();
        api_.cuMemFree(reinterpret_cast<CUdeviceptr>(p));
    }
    // Ordered on the stream before the launches that read it (from pageable memory the driver stages
    // the bytes before it returns, so src may change right after).
    void upload(void* dst, const void* src, size_t bytes) override {
        std::lock_guard<std::recursive_mutex> lock(stream_mutex_);
        bind();
        check(api_.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), src, bytes, stream_), "cuMemcpyHtoDAsync");
    }
    // After everything launched before it; returns with the bytes in dst.
    void download(void* dst, const void* src, size_t bytes) override {
        std::lock_guard<std::recursive_mutex> lock(stream_mutex_);
        bind();
        check(api_.cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(src), bytes, stream_), "cuMemcpyDtoHAsync");
        check(api_.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    }
    void launch(const char* kernel, llm_gpu::Grid grid, llm_gpu::Grid block, void** args) override {
        std::lock_guard<std::recursive_mutex> lock(stream_mutex_);
        bind();
        CUfunction& fn = functions_[kernel];
        if (!fn) check(api_.cuModuleGetFunction(&fn, module_, kernel), (std::string("cuModuleGetFunction ") + kernel).c_str());
        last_launch_ = std::string("kernel ") + kernel;
        check(api_.cuLaunchKernel(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0, stream_, args, nullptr), last_launch_.c_str());
        captured_kernels_++;
    }
    // Stream capture of `launches` (llama.cpp's relaxed mode), instantiated as one graph. Any failure
    // ends the capture and returns nullptr with the driver's reason: nothing ran.
    std::unique_ptr<llm_gpu::Graph> capture(const std::function<void()>& launches, std::string& why_not) override {
        if (!api_.has_graphs()) {
            why_not = "the CUDA driver lacks the graph API";
            return nullptr;
        }
        std::lock_guard<std::recursive_mutex> lock(stream_mutex_);
        bind();
        CUresult r = api_.cuStreamBeginCapture(stream_, kCaptureModeRelaxed);
        if (r != 0) {
            why_not = "cuStreamBeginCapture: " + error_string(r);
            return nullptr;
        }
        captured_kernels_ = 0;
        try {
            launches();
        } catch (const llm::Error& e) {
            why_not = e.what();
        } catch (...) {  // not the device's failure: the stream leaves capture mode, the error goes on
            CUgraph discarded = nullptr;
            if (api_.cuStreamEndCapture(stream_, &discarded) == 0 && discarded) api_.cuGraphDestroy(discarded);
            throw;
        }
        CUgraph graph = nullptr;
        r = api_.cuStreamEndCapture(stream_, &graph);
        if (r != 0 && why_not.empty()) why_not = "cuStreamEndCapture: " + error_string(r);
        CUgraphExec exec = nullptr;
        if (why_not.empty() && (r = api_.cuGraphInstantiateWithFlags(&exec, graph, 0)) != 0) why_not = "cuGraphInstantiate: " + error_string(r);
        if (graph) api_.cuGraphDestroy(graph);  // the instance keeps what it needs
        if (!why_not.empty()) return nullptr;
        return std::make_unique<CudaGraph>([this](CUgraphExec e) { bind(), api_.cuGraphExecDestroy(e); }, exec, captured_kernels_);
    }
    void replay(llm_gpu::Graph& graph) override {
        const CudaGraph& g = dynamic_cast<const CudaGraph&>(graph);
        std::lock_guard<std::recursive_mutex> lock(stream_mutex_);
        bind();
        last_launch_ = "a decode graph of " + std::to_string(g.n_kernels()) + " kernels";
        check(api_.cuGraphLaunch(g.exec(), stream_), "cuGraphLaunch");
    }

private:
    const DriverApi& api_;
    std::string name_, description_;
    size_t total_ = 0;
    int compute_capability_ = 0;
    CUdevice device_ = 0;
    CUcontext ctx_ = nullptr;
    CUmodule module_ = nullptr;
    CUstream stream_ = nullptr;
    std::recursive_mutex stream_mutex_;  // held by a capture for its thread's launches
    size_t captured_kernels_ = 0;        // launches since the capture began
    std::map<std::string, CUfunction> functions_;
    std::string last_launch_;  // launches are asynchronous: a kernel's fault shows at the next copy

    void bind() const {
        static thread_local CUcontext current = nullptr;
        if (current != ctx_) check(api_.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent"), current = ctx_;
    }
    std::string error_string(CUresult r) const {
        const char* s = nullptr;
        api_.cuGetErrorString(r, &s);
        return s ? s : "CUDA error " + std::to_string(r);
    }
    void check(CUresult r, const char* what) const {
        if (r == 0) return;
        std::string msg = std::string("CUDA: ") + name_ + ": " + what + ": " + error_string(r);
        if (!last_launch_.empty() && last_launch_ != what)
            msg += " (after " + last_launch_ + "; CUDA_LAUNCH_BLOCKING=1 GGML_CUDA_DISABLE_GRAPHS=1 names the failing one)";
        throw llm::Error(msg);
    }
};

// Every visible GPU (CUDA_VISIBLE_DEVICES applies), each created once, on first use after the probe.
std::vector<llm_gpu::Device*> devices() {
    static std::vector<std::unique_ptr<CudaDevice>> all = [] {
        std::vector<std::unique_ptr<CudaDevice>> out;
        std::string why;
        const DriverApi* api = driver_api(why);
        int count = 0;
        if (api && api->cuDeviceGetCount(&count) == 0)
            for (int i = 0; i < count; i++) out.push_back(std::make_unique<CudaDevice>(*api, i));
        return out;
    }();
    std::vector<llm_gpu::Device*> out;
    for (auto& d : all) out.push_back(d.get());
    return out;
}

const bool registered = [] {
    llm::set_offload_driver(llm_gpu::make_driver("CUDA", [](std::string& why_not) { return driver_api(why_not) != nullptr; }, devices));
    return true;
}();

} // namespace
