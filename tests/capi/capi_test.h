/* Helpers shared by the C test programs of the C API (tests/test_capi.py builds them).
 * Every program prints "FAIL ..." lines and exits 1 on the first broken expectation. */
#ifndef NNAPI_CAPI_TEST_H
#define NNAPI_CAPI_TEST_H

#include <android/NeuralNetworks.h>
#include <math.h>
#include <nnapi/capi.h>
#include <stdio.h>
#include <stdlib.h>

/* A call that must succeed. */
#define CHECK(call)                                                                       \
    do {                                                                                  \
        int check_result_ = (call);                                                       \
        if (check_result_ != ANEURALNETWORKS_NO_ERROR) {                                  \
            printf("FAIL %s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call,        \
                   check_result_, nnapi_capi_last_error());                               \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

/* A call that must return a given result code. */
#define EXPECT_CODE(expected, call)                                                       \
    do {                                                                                  \
        int expect_result_ = (call);                                                      \
        if (expect_result_ != (expected)) {                                               \
            printf("FAIL %s:%d: %s returned %d, expected %s (%d); last error: %s\n",      \
                   __FILE__, __LINE__, #call, expect_result_, #expected, (int)(expected), \
                   nnapi_capi_last_error());                                              \
            exit(1);                                                                      \
        }                                                                                 \
        checks_passed++;                                                                  \
    } while (0)

#define EXPECT(condition)                                                                 \
    do {                                                                                  \
        if (!(condition)) {                                                               \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #condition);                   \
            exit(1);                                                                      \
        }                                                                                 \
        checks_passed++;                                                                  \
    } while (0)

static int checks_passed = 0;

static inline void expect_close(const char* what, const float* actual, const float* expected, int count,
                                float tolerance) {
    for (int i = 0; i < count; i++) {
        if (!(fabsf(actual[i] - expected[i]) <= tolerance * (1.0f + fabsf(expected[i])))) {
            printf("FAIL %s[%d] = %.7g, expected %.7g\n", what, i, actual[i], expected[i]);
            exit(1);
        }
    }
    checks_passed++;
}

static inline ANeuralNetworksOperandType tensor_type(int32_t code, uint32_t rank, const uint32_t* dims) {
    ANeuralNetworksOperandType type = {code, rank, dims, 0.0f, 0};
    return type;
}

static inline ANeuralNetworksOperandType scalar_type(int32_t code) {
    ANeuralNetworksOperandType type = {code, 0, NULL, 0.0f, 0};
    return type;
}

/* Adds an operand and returns its index (operands are numbered in order). */
static inline uint32_t add_operand(ANeuralNetworksModel* model, uint32_t* count, ANeuralNetworksOperandType type) {
    CHECK(ANeuralNetworksModel_addOperand(model, &type));
    return (*count)++;
}

static inline uint32_t add_int32(ANeuralNetworksModel* model, uint32_t* count, int32_t value) {
    uint32_t index = add_operand(model, count, scalar_type(ANEURALNETWORKS_INT32));
    CHECK(ANeuralNetworksModel_setOperandValue(model, (int32_t)index, &value, sizeof value));
    return index;
}

static inline uint32_t add_float32(ANeuralNetworksModel* model, uint32_t* count, float value) {
    uint32_t index = add_operand(model, count, scalar_type(ANEURALNETWORKS_FLOAT32));
    CHECK(ANeuralNetworksModel_setOperandValue(model, (int32_t)index, &value, sizeof value));
    return index;
}

static inline void done(const char* name) {
    printf("PASS %s (%d checks)\n", name, checks_passed);
}

#endif
