/*
 * fake_nvrtc.c - a test library that stands in for NVRTC (libnvrtc.so).
 *
 * No CUDA toolkit is installed on the build and CI machines, so kcache's NVRTC tests load this
 * library instead. It exports the NVRTC entry points kcache resolves and "compiles" CUDA C++ to
 * PTX that the test driver library (fake_cuda.c) accepts: one `.entry` per `__global__ void
 * NAME(` in the source, for the architecture named by --gpu-architecture / -arch. A source
 * containing `#error` fails with NVRTC_ERROR_COMPILATION and a log.
 *
 * Controls and observations for tests: fakenvrtc_set_version(major, minor) (default 12.4),
 * fakenvrtc_compiles() (number of successful and failed compiles), fakenvrtc_last_arch() (the
 * architecture option of the last compile, "" if none).
 */
#define _GNU_SOURCE
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
};

static int version_major = 12, version_minor = 4;
static unsigned long long compiles;
static char last_arch[64];

EXPORT void fakenvrtc_set_version(int major, int minor) {
    version_major = major;
    version_minor = minor;
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

EXPORT nvrtcResult nvrtcCompileProgram(struct program *p, int noptions, const char *const *options) {
    if (!p || noptions < 0 || (noptions > 0 && !options))
        return NVRTC_ERROR_INVALID_INPUT;
    __atomic_add_fetch(&compiles, 1, __ATOMIC_SEQ_CST);
    const char *sm = "52";
    last_arch[0] = '\0';
    for (int i = 0; i < noptions; i++) {
        const char *o = options[i];
        const char *value = NULL;
        if (strncmp(o, "--gpu-architecture=", 19) == 0)
            value = o + 19;
        else if (strncmp(o, "-arch=", 6) == 0)
            value = o + 6;
        else if (o[0] != '-')
            return NVRTC_ERROR_INVALID_OPTION;
        if (value) {
            snprintf(last_arch, sizeof last_arch, "%s", value);
            const char *digits = strchr(value, '_');
            if (!digits)
                return NVRTC_ERROR_INVALID_OPTION;
            sm = digits + 1;
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
    int n = snprintf(header, sizeof header, ".version 7.0\n.target sm_%s\n.address_size 64\n", sm);
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
