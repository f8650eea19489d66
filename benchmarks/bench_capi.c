/* Timing loop for bench_capi.py: a trivial model (ADD of two TENSOR_FLOAT32 [16]) run
 * through the C API. usage: bench_capi ITERATIONS; prints "name microseconds" lines. */
#include <android/NeuralNetworks.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call) do { if ((call) != ANEURALNETWORKS_NO_ERROR) { fprintf(stderr, "%s failed\n", #call); exit(1); } } while (0)

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

#define ROUNDS 5 /* each figure is the best round: the machine may be shared */

int main(int argc, char** argv) {
    int iterations = (argc > 1 ? atoi(argv[1]) : 2000) / ROUNDS;
    double best, start;
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t dims[1] = {16};
    ANeuralNetworksOperandType tensor = {ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims, 0.0f, 0};
    ANeuralNetworksOperandType scalar = {ANEURALNETWORKS_INT32, 0, NULL, 0.0f, 0};
    CHECK(ANeuralNetworksModel_addOperand(model, &tensor));
    CHECK(ANeuralNetworksModel_addOperand(model, &tensor));
    CHECK(ANeuralNetworksModel_addOperand(model, &scalar));
    CHECK(ANeuralNetworksModel_addOperand(model, &tensor));
    int32_t none = ANEURALNETWORKS_FUSED_NONE;
    CHECK(ANeuralNetworksModel_setOperandValue(model, 2, &none, sizeof none));
    uint32_t in[3] = {0, 1, 2}, out[1] = {3};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, in, 1, out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, in, 1, out));
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    float a[16], b[16], y[16];
    for (int i = 0; i < 16; i++) a[i] = b[i] = (float)i;

    /* one library call that does nothing but cross into the runtime */
    uint32_t count = 0;
    best = 1e30;
    for (int round = 0; round < ROUNDS; round++) {
        start = now_us();
        for (int i = 0; i < iterations; i++) CHECK(ANeuralNetworks_getDeviceCount(&count));
        double elapsed = (now_us() - start) / iterations;
        best = elapsed < best ? elapsed : best;
    }
    printf("call %.3f\n", best);

    /* a new execution per inference: create, 2 x setInput, setOutput, compute, free */
    best = 1e30;
    for (int round = 0; round < ROUNDS; round++) {
        start = now_us();
        for (int i = 0; i < iterations; i++) {
            ANeuralNetworksExecution* execution = NULL;
            CHECK(ANeuralNetworksExecution_create(compilation, &execution));
            CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a));
            CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, b, sizeof b));
            CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, y, sizeof y));
            CHECK(ANeuralNetworksExecution_compute(execution));
            ANeuralNetworksExecution_free(execution);
        }
        double elapsed = (now_us() - start) / iterations;
        best = elapsed < best ? elapsed : best;
    }
    printf("execution %.3f\n", best);

    /* a reusable execution: compute only */
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setReusable(execution, true));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, b, sizeof b));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, y, sizeof y));
    best = 1e30;
    for (int round = 0; round < ROUNDS; round++) {
        start = now_us();
        for (int i = 0; i < iterations; i++) CHECK(ANeuralNetworksExecution_compute(execution));
        double elapsed = (now_us() - start) / iterations;
        best = elapsed < best ? elapsed : best;
    }
    printf("compute %.3f\n", best);
    if (y[3] != 6.0f) { fprintf(stderr, "wrong result %g\n", y[3]); return 1; }
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
    return 0;
}
