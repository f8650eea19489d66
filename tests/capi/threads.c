/* Thread safety through the C API: several threads, each with its own executions on one
 * shared compilation, all computing at once; and while one thread runs a long computation,
 * other threads' calls into the library keep completing (the computation does not hold
 * the interpreter for its whole duration). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "add_model.h"

#define THREADS 4
#define RUNS 25

static ANeuralNetworksCompilation* shared;

static void* worker(void* arg) {
    int id = (int)(intptr_t)arg;
    for (int run = 0; run < RUNS; run++) {
        float a[COUNT], b[COUNT], out[COUNT];
        for (int i = 0; i < COUNT; i++) {
            a[i] = (float)(id * 1000 + run);
            b[i] = (float)i;
        }
        ANeuralNetworksExecution* execution = add_execution(shared, a, b, out);
        CHECK(ANeuralNetworksExecution_compute(execution));
        ANeuralNetworksExecution_free(execution);
        for (int i = 0; i < COUNT; i++)
            if (out[i] != a[i] + b[i]) {
                printf("FAIL thread %d run %d: out[%d] = %g, expected %g\n", id, run, i, out[i], a[i] + b[i]);
                exit(1);
            }
    }
    return NULL;
}

/* WHILE (x < limit) x = x + 1: a long computation made of many small steps. */
static ANeuralNetworksCompilation* counting_loop(void) {
    static const uint32_t one_dims[1] = {1};
    ANeuralNetworksModel *cond = NULL, *body = NULL, *loop = NULL;
    uint32_t n = 0;
    CHECK(ANeuralNetworksModel_create(&cond));
    uint32_t x = add_operand(cond, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    uint32_t limit = add_operand(cond, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    uint32_t less = add_operand(cond, &n, tensor_type(ANEURALNETWORKS_TENSOR_BOOL8, 1, one_dims));
    uint32_t io[2] = {x, limit};
    CHECK(ANeuralNetworksModel_addOperation(cond, ANEURALNETWORKS_LESS, 2, io, 1, &less));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(cond, 2, io, 1, &less));
    CHECK(ANeuralNetworksModel_finish(cond));
    n = 0;
    CHECK(ANeuralNetworksModel_create(&body));
    x = add_operand(body, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    limit = add_operand(body, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    uint32_t step = add_operand(body, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    float one = 1.0f;
    CHECK(ANeuralNetworksModel_setOperandValue(body, step, &one, sizeof one));
    uint32_t act = add_int32(body, &n, ANEURALNETWORKS_FUSED_NONE);
    uint32_t next = add_operand(body, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    uint32_t add_in[3] = {x, step, act};
    CHECK(ANeuralNetworksModel_addOperation(body, ANEURALNETWORKS_ADD, 3, add_in, 1, &next));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(body, 2, io, 1, &next));
    CHECK(ANeuralNetworksModel_finish(body));
    n = 0;
    CHECK(ANeuralNetworksModel_create(&loop));
    uint32_t cond_ref = add_operand(loop, &n, scalar_type(ANEURALNETWORKS_MODEL));
    uint32_t body_ref = add_operand(loop, &n, scalar_type(ANEURALNETWORKS_MODEL));
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(loop, cond_ref, cond));
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(loop, body_ref, body));
    x = add_operand(loop, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    limit = add_operand(loop, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    uint32_t result = add_operand(loop, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, one_dims));
    uint32_t while_in[4] = {cond_ref, body_ref, x, limit}, loop_io[2] = {x, limit};
    CHECK(ANeuralNetworksModel_addOperation(loop, ANEURALNETWORKS_WHILE, 4, while_in, 1, &result));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(loop, 2, loop_io, 1, &result));
    CHECK(ANeuralNetworksModel_finish(loop));
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(loop, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    return compilation;  /* the models stay alive for the process */
}

static atomic_int polling = 1, computing = 0, calls = 0, calls_during = 0;

/* Calls into the library over and over; counts the calls that began and ended while the
 * main thread was inside ANeuralNetworksExecution_compute. */
static void* poller(void* arg) {
    (void)arg;
    while (atomic_load(&polling)) {
        int before = atomic_load(&computing);
        uint32_t count = 0;
        CHECK(ANeuralNetworks_getDeviceCount(&count));
        atomic_fetch_add(&calls, 1);
        if (before && atomic_load(&computing)) atomic_fetch_add(&calls_during, 1);
    }
    return NULL;
}

int main(void) {
    ANeuralNetworksModel* model = NULL;
    shared = add_compilation(&model);
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) EXPECT(pthread_create(&threads[t], NULL, worker, (void*)(intptr_t)t) == 0);
    for (int t = 0; t < THREADS; t++) EXPECT(pthread_join(threads[t], NULL) == 0);

    ANeuralNetworksCompilation* loop = counting_loop();
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksExecution_create(loop, &execution));
    float start = 0.0f, limit = 2000.0f, result = 0.0f;  /* long enough on a prepared loop body */
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, &start, sizeof start));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, &limit, sizeof limit));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, &result, sizeof result));
    CHECK(ANeuralNetworksExecution_setReusable(execution, true));
    pthread_t other;
    EXPECT(pthread_create(&other, NULL, poller, NULL) == 0);
    while (atomic_load(&calls) == 0) sched_yield();  /* the poller is running */
    /* A loaded machine may hardly schedule the poller during one computation: allow a few. */
    int computations = 0;
    while (computations < 10 && atomic_load(&calls_during) < 3) {
        result = 0.0f;
        atomic_store(&computing, 1);
        CHECK(ANeuralNetworksExecution_compute(execution));
        atomic_store(&computing, 0);
        computations++;
        EXPECT(result == 2000.0f);
    }
    atomic_store(&polling, 0);
    EXPECT(pthread_join(other, NULL) == 0);
    printf("calls completed by another thread during %d long computation(s): %d\n", computations,
           atomic_load(&calls_during));
    EXPECT(atomic_load(&calls_during) >= 3);
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksCompilation_free(loop);
    ANeuralNetworksCompilation_free(shared);
    ANeuralNetworksModel_free(model);
    done("threads");
    return 0;
}
