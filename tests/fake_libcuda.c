/* fake_libcuda.c: a stand-in libcuda.so.1 for CPU tests of the GPU host code (tests/fake_cuda.py
 * builds it with the system gcc against the real cuda.h of the nvidia-cuda-runtime wheel, so
 * every struct the bindings pass - CUDA_KERNEL_NODE_PARAMS_v2, CUgraphNodeParams and its
 * conditional part - is read with the driver's own layout).
 *
 * The real cuda-bindings resolve every driver entry point through cuGetProcAddress_v2; this
 * library answers from its own table (FK below), so the Python code runs unchanged: argument
 * packing, graph building, error paths. NVRTC calls cuInit and cuGetExportTable (answered
 * "not supported", which NVRTC accepts) so kernels still compile inside a faked process.
 *
 * Device memory is host memory (a device pointer is the malloc address, checked against the
 * live allocations on every copy); kernels do not run (launches are checked and logged).
 * Device: "NVIDIA H200", compute capability 9.0, driver 13000, 141 GiB.
 *
 * Environment:
 *   FAKE_CUDA_LOG=path            append one line per call (name, key arguments)
 *   FAKE_CUDA_FAIL_LAUNCH=N       the N-th kernel launch (cuLaunchKernel or a graph launch,
 *                                 counted from 1) faults: from then on every call returns
 *                                 CUDA_ERROR_ILLEGAL_ADDRESS (700), as a sticky error does
 *   FAKE_CUDA_WHILE_FOREVER=1     a launched graph holding a WHILE node never completes:
 *                                 stream/event queries say NOT_READY, and every call that waits
 *                                 for the device (synchronous copies, memset, free, syncs,
 *                                 unload, context release) blocks forever, as on hardware
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ALLOCS 65536

static FILE* g_log;
static int g_sticky;           /* a fault happened: every call fails from now on */
static int g_hung;             /* a never-ending graph is "running" */
static long g_launches, g_fail_at = -1;
static int g_forever;
static struct { char* p; size_t n; } g_allocs[MAX_ALLOCS];
static size_t g_allocated;

struct fk_fn { char name[256]; };
struct fk_graph { int has_while; CUgraph body[1]; int nodes; };
struct fk_exec { int has_while; };
struct fk_event { int recorded; };

static void logf_(const char* fmt, ...) {
    if (!g_log) {
        const char* path = getenv("FAKE_CUDA_LOG");
        if (!path) return;
        g_log = fopen(path, "a");
        if (!g_log) return;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(g_log, fmt, ap);
    va_end(ap);
    fputc('\n', g_log);
    fflush(g_log);
}

static void block_forever(const char* call) {
    logf_("%s: blocked (the device never finishes a WHILE graph)", call);
    for (;;) sleep(1);
}

/* Common prologue: the sticky error, then the wait a hung device imposes on blocking calls. */
#define ENTER(call, blocking)                              \
    do {                                                   \
        if (g_sticky) { logf_("%s -> 700", call); return CUDA_ERROR_ILLEGAL_ADDRESS; } \
        if ((blocking) && g_hung) block_forever(call);     \
    } while (0)

static int find_alloc(CUdeviceptr p, size_t n) {
    for (int i = 0; i < MAX_ALLOCS; ++i) {
        char* b = g_allocs[i].p;
        if (b && (char*)p >= b && (char*)p + n <= b + g_allocs[i].n) return i;
    }
    return -1;
}

/* ---- init, device, context ---- */
CUresult CUDAAPI cuInit(unsigned int flags) {
    const char* f = getenv("FAKE_CUDA_FAIL_LAUNCH");
    g_fail_at = f ? atol(f) : -1;
    g_forever = getenv("FAKE_CUDA_WHILE_FOREVER") != NULL;
    logf_("cuInit %u", flags);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGetExportTable(const void** table, const CUuuid* id) {
    *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}
static CUresult fk_cuDriverGetVersion(int* v) { *v = 13000; return CUDA_SUCCESS; }
static CUresult fk_cuDeviceGetCount(int* n) { ENTER("cuDeviceGetCount", 0); *n = 1; return CUDA_SUCCESS; }
static CUresult fk_cuDeviceGet(CUdevice* d, int ordinal) {
    ENTER("cuDeviceGet", 0);
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
static CUresult fk_cuDeviceGetName(char* name, int len, CUdevice d) {
    ENTER("cuDeviceGetName", 0);
    snprintf(name, len, "NVIDIA H200");
    return CUDA_SUCCESS;
}
static CUresult fk_cuDeviceTotalMem(size_t* bytes, CUdevice d) { *bytes = 141ull << 30; return CUDA_SUCCESS; }
static CUresult fk_cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
    ENTER("cuDeviceGetAttribute", 0);
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}
static int g_ctx_obj;
static CUresult fk_cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
    ENTER("cuDevicePrimaryCtxRetain", 0);
    *c = (CUcontext)&g_ctx_obj;
    logf_("cuDevicePrimaryCtxRetain");
    return CUDA_SUCCESS;
}
static CUresult fk_cuDevicePrimaryCtxRelease(CUdevice d) {
    ENTER("cuDevicePrimaryCtxRelease", 1);
    logf_("cuDevicePrimaryCtxRelease");
    return CUDA_SUCCESS;
}
static CUresult fk_cuCtxSetCurrent(CUcontext c) { ENTER("cuCtxSetCurrent", 0); return CUDA_SUCCESS; }
static CUresult fk_cuCtxGetCurrent(CUcontext* c) { *c = (CUcontext)&g_ctx_obj; return CUDA_SUCCESS; }
static CUresult fk_cuCtxGetDevice(CUdevice* d) { *d = 0; return CUDA_SUCCESS; }
static CUresult fk_cuCtxSynchronize(void) { ENTER("cuCtxSynchronize", 1); return CUDA_SUCCESS; }
static CUresult fk_cuMemGetInfo(size_t* free_b, size_t* total) {
    ENTER("cuMemGetInfo", 0);
    *total = 141ull << 30;
    *free_b = *total - (1ull << 29) - g_allocated;
    return CUDA_SUCCESS;
}

/* ---- modules ---- */
static int g_module_obj;
static CUresult fk_cuModuleLoadData(CUmodule* m, const void* image) {
    ENTER("cuModuleLoadData", 0);
    if (!image) return CUDA_ERROR_INVALID_VALUE;
    *m = (CUmodule)&g_module_obj;
    logf_("cuModuleLoadData");
    return CUDA_SUCCESS;
}
static CUresult fk_cuModuleUnload(CUmodule m) { ENTER("cuModuleUnload", 1); return CUDA_SUCCESS; }
static CUresult fk_cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    ENTER("cuModuleGetFunction", 0);
    struct fk_fn* fn = calloc(1, sizeof *fn);
    snprintf(fn->name, sizeof fn->name, "%s", name);
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}

/* ---- memory ---- */
static CUresult fk_cuMemAlloc(CUdeviceptr* p, size_t n) {
    ENTER("cuMemAlloc", 0);
    for (int i = 0; i < MAX_ALLOCS; ++i) {
        if (!g_allocs[i].p) {
            g_allocs[i].p = calloc(1, n ? n : 1);
            if (!g_allocs[i].p) return CUDA_ERROR_OUT_OF_MEMORY;
            g_allocs[i].n = n;
            g_allocated += n;
            *p = (CUdeviceptr)g_allocs[i].p;
            logf_("cuMemAlloc %zu", n);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult fk_cuMemFree(CUdeviceptr p) {
    ENTER("cuMemFree", 1);
    for (int i = 0; i < MAX_ALLOCS; ++i) {
        if (g_allocs[i].p == (char*)p) {
            free(g_allocs[i].p);
            g_allocated -= g_allocs[i].n;
            g_allocs[i].p = NULL;
            return CUDA_SUCCESS;
        }
    }
    logf_("cuMemFree %p: not an allocation", (void*)p);
    return CUDA_ERROR_INVALID_VALUE;
}
static CUresult copy_check(const char* call, CUdeviceptr p, size_t n) {
    if (find_alloc(p, n) < 0) {
        logf_("%s: %zu bytes at %p outside every allocation", call, n, (void*)p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
static CUresult fk_cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
    ENTER("cuMemcpyHtoD", 1);
    CUresult r = copy_check("cuMemcpyHtoD", dst, n);
    if (r == CUDA_SUCCESS) memcpy((void*)dst, src, n);
    return r;
}
static CUresult fk_cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
    ENTER("cuMemcpyDtoH", 1);
    CUresult r = copy_check("cuMemcpyDtoH", src, n);
    if (r == CUDA_SUCCESS) memcpy(dst, (void*)src, n);
    return r;
}
/* from and to pageable host memory: a stream sync first, then the copy (blocking, as the driver's) */
static CUresult fk_cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
    ENTER("cuMemcpyHtoDAsync", 1);
    CUresult r = copy_check("cuMemcpyHtoDAsync", dst, n);
    if (r == CUDA_SUCCESS) memcpy((void*)dst, src, n);
    return r;
}
static CUresult fk_cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) {
    ENTER("cuMemcpyDtoHAsync", 1);
    CUresult r = copy_check("cuMemcpyDtoHAsync", src, n);
    if (r == CUDA_SUCCESS) memcpy(dst, (void*)src, n);
    return r;
}
static CUresult fk_cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    ENTER("cuMemcpyDtoD", 1);
    CUresult r = copy_check("cuMemcpyDtoD", dst, n);
    if (r == CUDA_SUCCESS) r = copy_check("cuMemcpyDtoD", src, n);
    if (r == CUDA_SUCCESS) memmove((void*)dst, (void*)src, n);
    return r;
}
static CUresult fk_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    ENTER("cuMemcpyDtoDAsync", 0);
    CUresult r = copy_check("cuMemcpyDtoDAsync", dst, n);
    if (r == CUDA_SUCCESS) r = copy_check("cuMemcpyDtoDAsync", src, n);
    if (r == CUDA_SUCCESS) memmove((void*)dst, (void*)src, n);
    return r;
}
static CUresult fk_cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n) {
    ENTER("cuMemsetD8", 1);
    CUresult r = copy_check("cuMemsetD8", p, n);
    if (r == CUDA_SUCCESS) memset((void*)p, v, n);
    return r;
}

/* ---- streams, events ---- */
static int g_stream_obj;
static CUresult fk_cuStreamCreate(CUstream* s, unsigned int flags) {
    ENTER("cuStreamCreate", 0);
    *s = (CUstream)&g_stream_obj;
    return CUDA_SUCCESS;
}
static CUresult fk_cuStreamDestroy(CUstream s) { ENTER("cuStreamDestroy", 0); return CUDA_SUCCESS; }
static CUresult fk_cuStreamQuery(CUstream s) {
    ENTER("cuStreamQuery", 0);
    return g_hung ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
static CUresult fk_cuStreamSynchronize(CUstream s) { ENTER("cuStreamSynchronize", 1); return CUDA_SUCCESS; }
static CUresult fk_cuEventCreate(CUevent* e, unsigned int flags) {
    ENTER("cuEventCreate", 0);
    *e = (CUevent)calloc(1, sizeof(struct fk_event));
    return CUDA_SUCCESS;
}
static CUresult fk_cuEventDestroy(CUevent e) { ENTER("cuEventDestroy", 0); free(e); return CUDA_SUCCESS; }
static CUresult fk_cuEventRecord(CUevent e, CUstream s) {
    ENTER("cuEventRecord", 0);
    ((struct fk_event*)e)->recorded = 1;
    return CUDA_SUCCESS;
}
static CUresult fk_cuEventQuery(CUevent e) {
    ENTER("cuEventQuery", 0);
    return g_hung ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
static CUresult fk_cuEventSynchronize(CUevent e) { ENTER("cuEventSynchronize", 1); return CUDA_SUCCESS; }
static CUresult fk_cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
    ENTER("cuEventElapsedTime", 0);
    *ms = 0.5f;
    return CUDA_SUCCESS;
}

/* ---- launches ---- */
static void count_launch(const char* what) {
    ++g_launches;
    if (g_launches == g_fail_at) {
        g_sticky = 1;
        logf_("%s: launch %ld faults (CUDA_ERROR_ILLEGAL_ADDRESS from now on)", what, g_launches);
    }
}
static CUresult fk_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                  unsigned by, unsigned bz, unsigned shmem, CUstream s,
                                  void** params, void** extra) {
    ENTER("cuLaunchKernel", 0);
    if (!f || !params || !gx || !gy || !gz || !bx || bx * by * bz > 1024) {
        logf_("cuLaunchKernel: bad arguments");
        return CUDA_ERROR_INVALID_VALUE;
    }
    logf_("cuLaunchKernel %s %ux%ux%u %u", ((struct fk_fn*)f)->name, gx, gy, gz, bx);
    count_launch(((struct fk_fn*)f)->name);
    return CUDA_SUCCESS;  /* a fault surfaces at the next call, as an asynchronous error does */
}

/* ---- graphs ---- */
static CUresult fk_cuGraphCreate(CUgraph* g, unsigned int flags) {
    ENTER("cuGraphCreate", 0);
    *g = (CUgraph)calloc(1, sizeof(struct fk_graph));
    return CUDA_SUCCESS;
}
static CUresult fk_cuGraphDestroy(CUgraph g) { ENTER("cuGraphDestroy", 0); return CUDA_SUCCESS; }
static CUresult fk_cuGraphAddKernelNode(CUgraphNode* n, CUgraph g, const CUgraphNode* deps, size_t ndeps,
                                        const CUDA_KERNEL_NODE_PARAMS* p) {
    ENTER("cuGraphAddKernelNode", 0);
    if (!p || !p->func || !p->kernelParams || !p->gridDimX || !p->blockDimX || (ndeps && !deps)) {
        logf_("cuGraphAddKernelNode: bad parameters");
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fk_graph* fg = (struct fk_graph*)g;
    logf_("cuGraphAddKernelNode %s %ux%ux%u deps %zu", ((struct fk_fn*)p->func)->name, p->gridDimX,
          p->gridDimY, p->gridDimZ, ndeps);
    *n = (CUgraphNode)(size_t)(++fg->nodes);
    return CUDA_SUCCESS;
}
static CUresult fk_cuGraphAddDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                         const CUgraphEdgeData* edges, size_t n) {
    ENTER("cuGraphAddDependencies", 0);
    for (size_t i = 0; i < n; ++i) {
        if (!from || !to || !from[i] || !to[i]) return CUDA_ERROR_INVALID_VALUE;
        const int programmatic = edges && edges[i].type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC &&
                                 edges[i].from_port == CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
        if (edges && edges[i].type && !programmatic) {
            logf_("cuGraphAddDependencies: unexpected edge data");
            return CUDA_ERROR_INVALID_VALUE;
        }
        logf_("cuGraphAddDependencies %zu -> %zu%s", (size_t)from[i], (size_t)to[i],
              programmatic ? " programmatic" : "");
    }
    return CUDA_SUCCESS;
}
static CUresult fk_cuGraphConditionalHandleCreate(CUgraphConditionalHandle* h, CUgraph g, CUcontext c,
                                                  unsigned int dflt, unsigned int flags) {
    ENTER("cuGraphConditionalHandleCreate", 0);
    *h = 0x5EED;
    logf_("cuGraphConditionalHandleCreate default %u flags %u", dflt, flags);
    return CUDA_SUCCESS;
}
static CUresult fk_cuGraphAddNode(CUgraphNode* n, CUgraph g, const CUgraphNode* deps,
                                  const CUgraphEdgeData* edges, size_t ndeps, CUgraphNodeParams* p) {
    ENTER("cuGraphAddNode", 0);
    struct fk_graph* fg = (struct fk_graph*)g;
    if (!p || p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL || p->conditional.type != CU_GRAPH_COND_TYPE_WHILE ||
        p->conditional.size != 1 || p->conditional.handle != 0x5EED) {
        logf_("cuGraphAddNode: not the expected WHILE node");
        return CUDA_ERROR_INVALID_VALUE;
    }
    fk_cuGraphCreate(&fg->body[0], 0);
    p->conditional.phGraph_out = fg->body;  /* driver-owned array of the body graph */
    fg->has_while = 1;
    logf_("cuGraphAddNode WHILE deps %zu", ndeps);
    *n = (CUgraphNode)(size_t)(++fg->nodes);
    return CUDA_SUCCESS;
}
static CUresult fk_cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long flags) {
    ENTER("cuGraphInstantiate", 0);
    struct fk_exec* x = calloc(1, sizeof *x);
    x->has_while = ((struct fk_graph*)g)->has_while;
    *e = (CUgraphExec)x;
    return CUDA_SUCCESS;
}
static CUresult fk_cuGraphUpload(CUgraphExec e, CUstream s) { ENTER("cuGraphUpload", 0); return CUDA_SUCCESS; }
static CUresult fk_cuGraphLaunch(CUgraphExec e, CUstream s) {
    ENTER("cuGraphLaunch", 0);
    struct fk_exec* x = (struct fk_exec*)e;
    logf_("cuGraphLaunch%s", x->has_while ? " (WHILE)" : "");
    count_launch("cuGraphLaunch");
    if (x->has_while && g_forever) g_hung = 1;
    return CUDA_SUCCESS;
}
static CUresult fk_cuGraphExecDestroy(CUgraphExec e) { ENTER("cuGraphExecDestroy", 0); return CUDA_SUCCESS; }

/* ---- errors ---- */
static CUresult fk_cuGetErrorName(CUresult r, const char** s) {
    switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    default: *s = "CUDA_ERROR_UNKNOWN";
    }
    return CUDA_SUCCESS;
}
static CUresult fk_cuGetErrorString(CUresult r, const char** s) { return fk_cuGetErrorName(r, s); }

/* ---- entry-point table ---- */
static const struct { const char* name; void* fn; } FK[] = {
#define E(n) {#n, (void*)fk_##n}
    E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGet), E(cuDeviceGetName), E(cuDeviceTotalMem),
    E(cuDeviceGetAttribute), E(cuDevicePrimaryCtxRetain), E(cuDevicePrimaryCtxRelease), E(cuCtxSetCurrent),
    E(cuCtxGetCurrent), E(cuCtxGetDevice), E(cuCtxSynchronize), E(cuMemGetInfo), E(cuModuleLoadData),
    E(cuModuleUnload), E(cuModuleGetFunction), E(cuMemAlloc), E(cuMemFree), E(cuMemcpyHtoD), E(cuMemcpyDtoH),
    E(cuMemcpyDtoD), E(cuMemcpyDtoDAsync), E(cuMemcpyHtoDAsync), E(cuMemcpyDtoHAsync), E(cuMemsetD8), E(cuStreamCreate), E(cuStreamDestroy), E(cuStreamQuery),
    E(cuStreamSynchronize), E(cuEventCreate), E(cuEventDestroy), E(cuEventRecord), E(cuEventQuery),
    E(cuEventSynchronize), E(cuEventElapsedTime), E(cuLaunchKernel), E(cuGraphCreate), E(cuGraphDestroy),
    E(cuGraphAddKernelNode), E(cuGraphAddDependencies), E(cuGraphConditionalHandleCreate), E(cuGraphAddNode),
    E(cuGraphInstantiateWithFlags), E(cuGraphUpload), E(cuGraphLaunch), E(cuGraphExecDestroy),
    E(cuGetErrorName), E(cuGetErrorString),
#undef E
    {"cuInit", (void*)cuInit}, {"cuGetExportTable", (void*)cuGetExportTable},
};

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult* status) {
    for (size_t i = 0; i < sizeof FK / sizeof FK[0]; ++i) {
        if (strcmp(FK[i].name, symbol) == 0) {
            *pfn = FK[i].fn;
            if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}
