/* Unknown dimensions through the C API: an input completed by setInput's type, an output
 * whose shape is only known after computing; a too-small output buffer gives
 * OUTPUT_INSUFFICIENT_SIZE and getOutputOperandDimensions reports the shape needed. */
#include "capi_test.h"

int main(void) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0;
    uint32_t in_dims[2] = {0, 3}, row_dims[2] = {1, 3}, out_dims[2] = {0, 0};
    uint32_t a = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, in_dims));
    uint32_t row = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, row_dims));
    float row_value[3] = {100.0f, 200.0f, 300.0f};
    CHECK(ANeuralNetworksModel_setOperandValue(model, row, row_value, sizeof row_value));
    uint32_t act = add_int32(model, &n, ANEURALNETWORKS_FUSED_NONE);
    uint32_t out = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, out_dims));
    uint32_t add_in[3] = {a, row, act};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, add_in, 1, &out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 1, &a, 1, &out));
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));

    float input[12];
    for (int i = 0; i < 12; i++) input[i] = (float)i;
    uint32_t actual_dims[2] = {4, 3};
    ANeuralNetworksOperandType actual = tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, actual_dims);

    /* Without the input's real shape the execution cannot run. */
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    EXPECT_CODE(ANEURALNETWORKS_BAD_DATA, ANeuralNetworksExecution_setInput(execution, 0, NULL, input, sizeof input));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, &actual, input, sizeof input));
    float small[6];
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, small, sizeof small));
    EXPECT_CODE(ANEURALNETWORKS_OUTPUT_INSUFFICIENT_SIZE, ANeuralNetworksExecution_compute(execution));
    uint32_t rank = 0, dims[2] = {0, 0};
    /* The NDK: OUTPUT_INSUFFICIENT_SIZE for that output, the needed shape written anyway. */
    EXPECT_CODE(ANEURALNETWORKS_OUTPUT_INSUFFICIENT_SIZE,
                ANeuralNetworksExecution_getOutputOperandRank(execution, 0, &rank));
    EXPECT_CODE(ANEURALNETWORKS_OUTPUT_INSUFFICIENT_SIZE,
                ANeuralNetworksExecution_getOutputOperandDimensions(execution, 0, dims));
    EXPECT(rank == 2 && dims[0] == 4 && dims[1] == 3);
    ANeuralNetworksExecution_free(execution);

    float output[12], expected[12];
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, &actual, input, sizeof input));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, output, sizeof output));
    CHECK(ANeuralNetworksExecution_compute(execution));
    dims[0] = dims[1] = 0;
    CHECK(ANeuralNetworksExecution_getOutputOperandDimensions(execution, 0, dims));
    EXPECT(dims[0] == 4 && dims[1] == 3);
    for (int i = 0; i < 12; i++) expected[i] = input[i] + row_value[i % 3];
    expect_close("output", output, expected, 12, 0.0f);
    ANeuralNetworksExecution_free(execution);

    /* A different batch on the same compilation. */
    uint32_t two_rows[2] = {2, 3};
    ANeuralNetworksOperandType two = tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, two_rows);
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, &two, input, 6 * sizeof(float)));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, &two, output, 6 * sizeof(float)));
    CHECK(ANeuralNetworksExecution_compute(execution));
    expect_close("output", output, expected, 6, 0.0f);
    ANeuralNetworksExecution_free(execution);

    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
    done("dynamic_shape");
    return 0;
}
