/* IF and WHILE through the C API: referenced models set with
 * ANeuralNetworksModel_setOperandValueFromModel. */
#include "capi_test.h"

static const uint32_t ONE[1] = {1};

/* (a, b) -> a OP b, every operand TENSOR_FLOAT32 [1]. */
static ANeuralNetworksModel* binary_model(int32_t operation) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0;
    uint32_t a = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t b = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t act = add_int32(model, &n, ANEURALNETWORKS_FUSED_NONE);
    uint32_t out = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t in[3] = {a, b, act}, io[2] = {a, b};
    CHECK(ANeuralNetworksModel_addOperation(model, operation, 3, in, 1, &out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, io, 1, &out));
    CHECK(ANeuralNetworksModel_finish(model));
    return model;
}

/* (x, limit) -> x < limit, a TENSOR_BOOL8 [1]. */
static ANeuralNetworksModel* less_model(void) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0;
    uint32_t x = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t limit = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t out = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_BOOL8, 1, ONE));
    uint32_t io[2] = {x, limit};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_LESS, 2, io, 1, &out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, io, 1, &out));
    CHECK(ANeuralNetworksModel_finish(model));
    return model;
}

/* (x, limit) -> x * 2 + 1: the WHILE body (x is carried, limit is input-only). */
static ANeuralNetworksModel* body_model(void) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0;
    uint32_t x = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t limit = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t two = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t one = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    float two_value = 2.0f, one_value = 1.0f;
    CHECK(ANeuralNetworksModel_setOperandValue(model, two, &two_value, sizeof two_value));
    CHECK(ANeuralNetworksModel_setOperandValue(model, one, &one_value, sizeof one_value));
    uint32_t act = add_int32(model, &n, ANEURALNETWORKS_FUSED_NONE);
    uint32_t doubled = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t out = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t mul_in[3] = {x, two, act}, add_in[3] = {doubled, one, act}, io[2] = {x, limit};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_MUL, 3, mul_in, 1, &doubled));
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, add_in, 1, &out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, io, 1, &out));
    CHECK(ANeuralNetworksModel_finish(model));
    return model;
}

static float run2(ANeuralNetworksModel* model, const void* in0, size_t size0, float in1, float in2) {
    ANeuralNetworksCompilation* compilation = NULL;
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    float out = -12345.0f;
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, in0, size0));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, &in1, sizeof in1));
    if (in2 == in2) CHECK(ANeuralNetworksExecution_setInput(execution, 2, NULL, &in2, sizeof in2));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, &out, sizeof out));
    CHECK(ANeuralNetworksExecution_compute(execution));
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksCompilation_free(compilation);
    return out;
}

int main(void) {
    ANeuralNetworksModel* add = binary_model(ANEURALNETWORKS_ADD);
    ANeuralNetworksModel* mul = binary_model(ANEURALNETWORKS_MUL);

    /* IF(condition, add, mul, a, b) */
    ANeuralNetworksModel* if_model = NULL;
    CHECK(ANeuralNetworksModel_create(&if_model));
    uint32_t n = 0;
    uint32_t condition = add_operand(if_model, &n, tensor_type(ANEURALNETWORKS_TENSOR_BOOL8, 1, ONE));
    uint32_t then_ref = add_operand(if_model, &n, scalar_type(ANEURALNETWORKS_MODEL));
    uint32_t else_ref = add_operand(if_model, &n, scalar_type(ANEURALNETWORKS_MODEL));
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(if_model, then_ref, add));
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(if_model, else_ref, mul));
    uint32_t a = add_operand(if_model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t b = add_operand(if_model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t out = add_operand(if_model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t if_in[5] = {condition, then_ref, else_ref, a, b}, if_io[3] = {condition, a, b};
    CHECK(ANeuralNetworksModel_addOperation(if_model, ANEURALNETWORKS_IF, 5, if_in, 1, &out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(if_model, 3, if_io, 1, &out));
    CHECK(ANeuralNetworksModel_finish(if_model));
    uint8_t yes = 1, no = 0;
    EXPECT(run2(if_model, &yes, 1, 3.0f, 4.0f) == 7.0f);
    EXPECT(run2(if_model, &no, 1, 3.0f, 4.0f) == 12.0f);

    /* WHILE(x < limit) x = 2x + 1, from x = 0 with limit 20: 0, 1, 3, 7, 15, 31. */
    ANeuralNetworksModel* cond = less_model();
    ANeuralNetworksModel* body = body_model();
    ANeuralNetworksModel* while_model = NULL;
    CHECK(ANeuralNetworksModel_create(&while_model));
    n = 0;
    uint32_t cond_ref = add_operand(while_model, &n, scalar_type(ANEURALNETWORKS_MODEL));
    uint32_t body_ref = add_operand(while_model, &n, scalar_type(ANEURALNETWORKS_MODEL));
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(while_model, cond_ref, cond));
    CHECK(ANeuralNetworksModel_setOperandValueFromModel(while_model, body_ref, body));
    uint32_t x = add_operand(while_model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t limit = add_operand(while_model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t result = add_operand(while_model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, ONE));
    uint32_t while_in[4] = {cond_ref, body_ref, x, limit}, while_io[2] = {x, limit};
    CHECK(ANeuralNetworksModel_addOperation(while_model, ANEURALNETWORKS_WHILE, 4, while_in, 1, &result));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(while_model, 2, while_io, 1, &result));
    CHECK(ANeuralNetworksModel_finish(while_model));
    float zero = 0.0f;
    EXPECT(run2(while_model, &zero, sizeof zero, 20.0f, NAN) == 31.0f);
    EXPECT(run2(while_model, &zero, sizeof zero, 0.0f, NAN) == 0.0f);

    /* -inf * 2 + 1 stays below +inf: a loop that never ends stops at the loop timeout with MISSED_DEADLINE_TRANSIENT. */
    ANeuralNetworksCompilation* compilation = NULL;
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksCompilation_create(while_model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    float start = -INFINITY, infinite = INFINITY, sink = 0.0f;
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, &start, sizeof start));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, &infinite, sizeof infinite));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, &sink, sizeof sink));
    CHECK(ANeuralNetworksExecution_setLoopTimeout(execution, 20 * 1000 * 1000));
    EXPECT_CODE(ANEURALNETWORKS_MISSED_DEADLINE_TRANSIENT, ANeuralNetworksExecution_compute(execution));
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksCompilation_free(compilation);
    EXPECT(ANeuralNetworks_getDefaultLoopTimeout() == 2000000000ull);
    EXPECT(ANeuralNetworks_getMaximumLoopTimeout() == 15000000000ull);

    ANeuralNetworksModel* models[6] = {add, mul, if_model, cond, body, while_model};
    for (int i = 0; i < 6; i++) ANeuralNetworksModel_free(models[i]);
    done("control_flow");
    return 0;
}
