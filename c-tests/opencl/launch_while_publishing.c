/* An unmodified OpenCL program, run under kcache's OpenCL layer: one thread launches a kernel
 * again and again, never waiting, while another builds and releases programs; each release
 * makes the layer publish the binaries it holds back, the launching thread's program's among
 * them. On PoCL a binary query that meets a launch's compile aborts the process; the layer's
 * gate must keep them apart. The results are checked, and the run reports how many launches it
 * made, so that the script can check that launches and releases did overlap.
 *
 * Usage: launch_while_publishing RELEASES */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define N 4096

static const char *const launched_source =
    "__kernel void add_one(__global float *a) { a[get_global_id(0)] += 1.0f; }\n";

typedef struct shared {
    cl_context context;
    cl_device_id device;
    cl_command_queue queue;
    cl_kernel kernel;
    volatile int stop;
    long launches;
    int failed;
} shared;

static cl_program built(cl_context context, cl_device_id device, const char *source) {
    cl_int err;
    cl_program program = clCreateProgramWithSource(context, 1, &source, NULL, &err);
    if (err != CL_SUCCESS) return NULL;
    if (clBuildProgram(program, 1, &device, "", NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(program);
        return NULL;
    }
    return program;
}

/* Launches add_one with each local size in turn (each a new compile on PoCL), never waiting. */
static void *launch(void *arg) {
    shared *s = arg;
    static const size_t locals[] = {1, 2, 4, 8, 16, 32, 64, 128};
    size_t global = N;
    while (!s->stop) {
        size_t local = locals[s->launches % 8];
        if (clEnqueueNDRangeKernel(s->queue, s->kernel, 1, NULL, &global, &local, 0, NULL, NULL) !=
            CL_SUCCESS) {
            s->failed = 1;
            break;
        }
        /* Bounds what waits in the queue; most of the time launches still run. */
        if (++s->launches % 256 == 0) clFinish(s->queue);
    }
    return NULL;
}

int main(int argc, char **argv) {
    shared s = {0};
    cl_platform_id platform;
    cl_int err;
    int releases = argc > 1 ? atoi(argv[1]) : 4;
    if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &s.device, NULL) != CL_SUCCESS) {
        fprintf(stderr, "no OpenCL device\n");
        return 1;
    }
    s.context = clCreateContext(NULL, 1, &s.device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return 1;
    s.queue = clCreateCommandQueue(s.context, s.device, 0, &err);
    if (err != CL_SUCCESS) return 1;
    cl_program program = built(s.context, s.device, launched_source);
    if (program == NULL) return 1;
    s.kernel = clCreateKernel(program, "add_one", &err);
    if (err != CL_SUCCESS) return 1;
    float zeros[N] = {0};
    cl_mem buffer =
        clCreateBuffer(s.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof zeros, zeros, &err);
    if (err != CL_SUCCESS || clSetKernelArg(s.kernel, 0, sizeof buffer, &buffer) != CL_SUCCESS)
        return 1;

    pthread_t launcher;
    if (pthread_create(&launcher, NULL, launch, &s) != 0) return 1;
    for (int i = 0; i < releases; i++) {
        char source[160];
        snprintf(source, sizeof source,
                 "__kernel void scale_%d(__global float *a) { a[get_global_id(0)] *= %d.0f; }\n",
                 i, i + 2);
        cl_program other = built(s.context, s.device, source);
        if (other == NULL) {
            fprintf(stderr, "build %d failed\n", i);
            s.failed = 1;
            break;
        }
        /* The last reference: the layer publishes what it holds back, now. */
        clReleaseProgram(other);
    }
    s.stop = 1;
    pthread_join(launcher, NULL);

    float out[N];
    if (clEnqueueReadBuffer(s.queue, buffer, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL) !=
        CL_SUCCESS)
        return 1;
    long wrong = 0;
    for (int i = 0; i < N; i++) wrong += out[i] != (float)s.launches;
    printf("launches: %ld, releases: %d, wrong values: %ld\n", s.launches, releases, wrong);
    clReleaseMemObject(buffer);
    clReleaseKernel(s.kernel);
    clReleaseProgram(program);
    clReleaseCommandQueue(s.queue);
    clReleaseContext(s.context);
    return s.failed || wrong != 0 || s.launches == 0;
}
