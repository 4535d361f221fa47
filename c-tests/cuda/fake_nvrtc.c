/*
 * fake_nvrtc.c - a test library that stands in for NVRTC (libnvrtc.so).
 *
 * No CUDA toolkit is installed on the build and CI machines, so kcache's NVRTC tests load this
 * library instead. It exports the NVRTC entry points kcache resolves and "compiles" CUDA C++ to
 * PTX that the test driver library (fake_cuda.c) accepts: one `.entry` per `__global__ void
 * NAME(` in the source, for the architecture named by --gpu-architecture / -arch. As NVRTC
 * documents:
 *
 *   - the PTX's `.version` is the PTX ISA of NVRTC's CUDA release (approximated as
 *     major - 4 . minor: 12.4 writes 8.4, 13.0 writes 9.0), which an older driver refuses;
 *   - a real architecture (sm_XY) also gives a cubin (nvrtcGetCUBIN), in fake_cuda.c's cubin
 *     layout; a virtual one (compute_XY) gives none, and neither does -dlto (LTO IR only):
 *     nvrtcGetCUBINSize then sets 0, as nvrtc.h says, and nvrtcGetCUBIN writes nothing;
 *   - an option and its value may be one string or two: "--gpu-architecture=compute_60" or
 *     "--gpu-architecture" "compute_60" (also -arch); any other string not starting with '-'
 *     is NVRTC_ERROR_INVALID_OPTION;
 *   - an architecture outside nvrtcGetSupportedArchs is NVRTC_ERROR_INVALID_OPTION.
 *
 * A source containing `#error` fails with NVRTC_ERROR_COMPILATION and a log.
 *
 * Controls and observations for tests: fakenvrtc_set_version(major, minor) (default 12.4, or
 * FAKENVRTC_VERSION=major.minor), fakenvrtc_set_max_arch(n) (the newest supported
 * architecture, default 90, or FAKENVRTC_MAX_ARCH=n; the variables are read when the library
 * is loaded, for runs of the cuda_check example),
 * fakenvrtc_compiles() (number of successful and failed compiles), fakenvrtc_last_arch() (the
 * architecture option of the last compile, "" if none).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvrtcResult;
enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
};

struct program {
    char *source;
    char *ptx;
    char *log;
    unsigned char *cubin;
    size_t cubin_size;
};

static int version_major = 12, version_minor = 4;
static int max_arch = 90;
static const int ARCHS[] = {50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90};
#define NUM_ARCHS ((int)(sizeof ARCHS / sizeof ARCHS[0]))
static unsigned long long compiles;
static char last_arch[64];

EXPORT void fakenvrtc_set_version(int major, int minor) {
    version_major = major;
    version_minor = minor;
}

EXPORT void fakenvrtc_set_max_arch(int arch) { max_arch = arch; }

__attribute__((constructor)) static void configure(void) {
    const char *version = getenv("FAKENVRTC_VERSION");
    if (version && *version)
        sscanf(version, "%d.%d", &version_major, &version_minor);
    const char *arch = getenv("FAKENVRTC_MAX_ARCH");
    if (arch && *arch)
        max_arch = atoi(arch);
}

static int supported(int arch) {
    for (int i = 0; i < NUM_ARCHS; i++)
        if (ARCHS[i] == arch && arch <= max_arch)
            return 1;
    return 0;
}

EXPORT nvrtcResult nvrtcGetNumSupportedArchs(int *n) {
    if (!n)
        return NVRTC_ERROR_INVALID_INPUT;
    *n = 0;
    for (int i = 0; i < NUM_ARCHS; i++)
        *n += ARCHS[i] <= max_arch;
    return NVRTC_SUCCESS;
}

EXPORT nvrtcResult nvrtcGetSupportedArchs(int *archs) {
    if (!archs)
        return NVRTC_ERROR_INVALID_INPUT;
    for (int i = 0, n = 0; i < NUM_ARCHS; i++)
        if (ARCHS[i] <= max_arch)
            archs[n++] = ARCHS[i];
    return NVRTC_SUCCESS;
}

EXPORT unsigned long long fakenvrtc_compiles(void) {
    return __atomic_load_n(&compiles, __ATOMIC_SEQ_CST);
}

EXPORT const char *fakenvrtc_last_arch(void) { return last_arch; }

EXPORT const char *nvrtcGetErrorString(nvrtcResult result) {
    switch (result) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR unknown";
    }
}

EXPORT nvrtcResult nvrtcVersion(int *major, int *minor) {
    if (!major || !minor)
        return NVRTC_ERROR_INVALID_INPUT;
    *major = version_major;
    *minor = version_minor;
    return NVRTC_SUCCESS;
}

EXPORT nvrtcResult nvrtcCreateProgram(struct program **out, const char *source, const char *name,
                                      int nheaders, const char *const *headers,
                                      const char *const *include_names) {
    (void)name, (void)headers, (void)include_names;
    if (!out || !source || nheaders != 0)
        return NVRTC_ERROR_INVALID_INPUT;
    struct program *p = calloc(1, sizeof *p);
    if (!p || !(p->source = strdup(source))) {
        free(p);
        return NVRTC_ERROR_OUT_OF_MEMORY;
    }
    *out = p;
    return NVRTC_SUCCESS;
}

EXPORT nvrtcResult nvrtcDestroyProgram(struct program **p) {
    if (!p || !*p)
        return NVRTC_ERROR_INVALID_PROGRAM;
    free((*p)->source);
    free((*p)->ptx);
    free((*p)->log);
    free((*p)->cubin);
    free(*p);
    *p = NULL;
    return NVRTC_SUCCESS;
}

/* Appends to a heap string; returns 0 when out of memory. */
static int append(char **s, size_t *len, const char *text, size_t n) {
    char *grown = realloc(*s, *len + n + 1);
    if (!grown)
        return 0;
    memcpy(grown + *len, text, n);
    *len += n;
    grown[*len] = '\0';
    *s = grown;
    return 1;
}

/* fake_cuda.c's cubin layout: magic[8], u32 total size, u32 target, u64 hash, u32 entry
 * count, then per entry a NUL-padded name of 64 bytes; the entries are the PTX's. */
#define CUBIN_HEADER 28
#define MAX_NAME 64

static int make_cubin(struct program *p, int target) {
    uint32_t count = 0;
    for (const char *s = strstr(p->ptx, ".entry "); s; s = strstr(s + 1, ".entry "))
        count++;
    size_t total = CUBIN_HEADER + (size_t)count * MAX_NAME;
    unsigned char *b = calloc(1, total);
    if (!b)
        return 0;
    uint64_t hash = 0xcbf29ce484222325ull;
    for (const char *c = p->ptx; *c; c++)
        hash = (hash ^ (unsigned char)*c) * 0x100000001b3ull;
    uint32_t total32 = (uint32_t)total, target32 = (uint32_t)target;
    memcpy(b, "KCFAKECB", 8);
    memcpy(b + 8, &total32, 4);
    memcpy(b + 12, &target32, 4);
    memcpy(b + 16, &hash, 8);
    memcpy(b + 24, &count, 4);
    unsigned char *slot = b + CUBIN_HEADER;
    for (const char *s = strstr(p->ptx, ".entry "); s; s = strstr(s + 1, ".entry ")) {
        size_t len = strcspn(s + 7, "(");
        memcpy(slot, s + 7, len < MAX_NAME ? len : MAX_NAME - 1);
        slot += MAX_NAME;
    }
    p->cubin = b;
    p->cubin_size = total;
    return 1;
}

EXPORT nvrtcResult nvrtcCompileProgram(struct program *p, int noptions, const char *const *options) {
    if (!p || noptions < 0 || (noptions > 0 && !options))
        return NVRTC_ERROR_INVALID_INPUT;
    __atomic_add_fetch(&compiles, 1, __ATOMIC_SEQ_CST);
    const char *sm = "52";
    int real = 0, dlto = 0;
    last_arch[0] = '\0';
    for (int i = 0; i < noptions; i++) {
        const char *o = options[i];
        const char *value = NULL;
        if (strncmp(o, "--gpu-architecture=", 19) == 0)
            value = o + 19;
        else if (strncmp(o, "-arch=", 6) == 0)
            value = o + 6;
        else if (strcmp(o, "--gpu-architecture") == 0 || strcmp(o, "-arch") == 0) {
            if (i + 1 == noptions)
                return NVRTC_ERROR_INVALID_OPTION;
            value = options[++i];
        } else if (strcmp(o, "-dlto") == 0 || strcmp(o, "--dlink-time-opt") == 0)
            dlto = 1;
        else if (o[0] != '-')
            return NVRTC_ERROR_INVALID_OPTION;
        if (value) {
            snprintf(last_arch, sizeof last_arch, "%s", value);
            const char *digits = strchr(value, '_');
            if (!digits || !supported(atoi(digits + 1)))
                return NVRTC_ERROR_INVALID_OPTION;
            sm = digits + 1;
            real = strncmp(value, "sm_", 3) == 0;
        }
    }
    if (strstr(p->source, "#error")) {
        free(p->log);
        p->log = strdup("kcache.cu(1): error: #error directive\n1 error detected in the "
                        "compilation of \"kcache.cu\".\n");
        return NVRTC_ERROR_COMPILATION;
    }
    char *ptx = NULL;
    size_t len = 0;
    char header[128];
    int n = snprintf(header, sizeof header, ".version %d.%d\n.target sm_%s\n.address_size 64\n",
                     version_major - 4, version_minor, sm);
    if (!append(&ptx, &len, header, (size_t)n))
        return NVRTC_ERROR_OUT_OF_MEMORY;
    for (const char *s = strstr(p->source, "__global__ void "); s;
         s = strstr(s + 1, "__global__ void ")) {
        const char *name = s + 16;
        size_t nlen = strcspn(name, "( \t\n");
        if (!append(&ptx, &len, ".visible .entry ", 16) || !append(&ptx, &len, name, nlen) ||
            !append(&ptx, &len, "()\n{\n\tret;\n}\n", 13)) {
            free(ptx);
            return NVRTC_ERROR_OUT_OF_MEMORY;
        }
    }
    free(p->ptx);
    p->ptx = ptx;
    free(p->cubin);
    p->cubin = NULL;
    if (real && !dlto && !make_cubin(p, atoi(sm)))
        return NVRTC_ERROR_OUT_OF_MEMORY;
    return NVRTC_SUCCESS;
}

static nvrtcResult size_of(const char *s, size_t *out) {
    if (!out)
        return NVRTC_ERROR_INVALID_INPUT;
    *out = (s ? strlen(s) : 0) + 1;
    return NVRTC_SUCCESS;
}

static nvrtcResult copy_out(const char *s, char *out) {
    if (!out)
        return NVRTC_ERROR_INVALID_INPUT;
    strcpy(out, s ? s : "");
    return NVRTC_SUCCESS;
}

EXPORT nvrtcResult nvrtcGetPTXSize(struct program *p, size_t *size) {
    return p && p->ptx ? size_of(p->ptx, size) : NVRTC_ERROR_INVALID_PROGRAM;
}

EXPORT nvrtcResult nvrtcGetPTX(struct program *p, char *out) {
    return p && p->ptx ? copy_out(p->ptx, out) : NVRTC_ERROR_INVALID_PROGRAM;
}

EXPORT nvrtcResult nvrtcGetProgramLogSize(struct program *p, size_t *size) {
    return p ? size_of(p->log, size) : NVRTC_ERROR_INVALID_PROGRAM;
}

EXPORT nvrtcResult nvrtcGetProgramLog(struct program *p, char *out) {
    return p ? copy_out(p->log, out) : NVRTC_ERROR_INVALID_PROGRAM;
}

EXPORT nvrtcResult nvrtcGetCUBINSize(struct program *p, size_t *size) {
    if (!p || !size)
        return NVRTC_ERROR_INVALID_INPUT;
    *size = p->cubin ? p->cubin_size : 0; /* 0: a virtual architecture, or -dlto */
    return NVRTC_SUCCESS;
}

EXPORT nvrtcResult nvrtcGetCUBIN(struct program *p, char *out) {
    if (!p || !out)
        return NVRTC_ERROR_INVALID_INPUT;
    if (p->cubin)
        memcpy(out, p->cubin, p->cubin_size);
    return NVRTC_SUCCESS;
}
