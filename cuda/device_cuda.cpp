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
#include <map>
#include <mutex>

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
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
    CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
    CUresult (*cuMemGetInfo)(size_t*, size_t*);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**);
    CUresult (*cuGetErrorString)(CUresult, const char**);
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
        sym(api.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
        sym(api.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
        sym(api.cuMemGetInfo, "cuMemGetInfo_v2");
        sym(api.cuLaunchKernel, "cuLaunchKernel");
        sym(api.cuGetErrorString, "cuGetErrorString");
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

// One GPU (a driver ordinal: CUDA_VISIBLE_DEVICES renumbers them) with its primary context, made
// current on whichever thread uses the device (the server decodes on its own thread).
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
    void upload(void* dst, const void* src, size_t bytes) override {
        bind();
        check(api_.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes), "cuMemcpyHtoD");
    }
    void download(void* dst, const void* src, size_t bytes) override {
        bind();
        check(api_.cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes), "cuMemcpyDtoH");
    }
    void launch(const char* kernel, llm_gpu::Grid grid, llm_gpu::Grid block, void** args) override {
        bind();
        CUfunction& fn = functions_[kernel];
        if (!fn) check(api_.cuModuleGetFunction(&fn, module_, kernel), (std::string("cuModuleGetFunction ") + kernel).c_str());
        last_kernel_ = kernel;
        check(api_.cuLaunchKernel(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0, nullptr, args, nullptr),
              (std::string("kernel ") + kernel).c_str());
    }

private:
    const DriverApi& api_;
    std::string name_, description_;
    size_t total_ = 0;
    int compute_capability_ = 0;
    CUdevice device_ = 0;
    CUcontext ctx_ = nullptr;
    CUmodule module_ = nullptr;
    std::map<std::string, CUfunction> functions_;
    std::string last_kernel_;  // launches are asynchronous: a kernel's fault shows at the next copy

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
        if (!last_kernel_.empty() && std::strncmp(what, "kernel ", 7) != 0)
            msg += " (after kernel " + last_kernel_ + "; CUDA_LAUNCH_BLOCKING=1 names the failing one)";
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
