/* out = a + b on TENSOR_FLOAT32 [COUNT], the model several test programs share. */
#ifndef NNAPI_CAPI_ADD_MODEL_H
#define NNAPI_CAPI_ADD_MODEL_H
#include "capi_test.h"

#define COUNT 16

static ANeuralNetworksCompilation* add_compilation(ANeuralNetworksModel** model_out) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0, dims[1] = {COUNT};
    uint32_t a = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims));
    uint32_t b = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims));
    uint32_t act = add_int32(model, &n, ANEURALNETWORKS_FUSED_NONE);
    uint32_t out = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims));
    uint32_t in[3] = {a, b, act}, io[2] = {a, b};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, in, 1, &out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, io, 1, &out));
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    *model_out = model;
    return compilation;
}

static ANeuralNetworksExecution* add_execution(ANeuralNetworksCompilation* compilation, const float* a,
                                               const float* b, float* out) {
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, a, COUNT * sizeof(float)));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, b, COUNT * sizeof(float)));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, out, COUNT * sizeof(float)));
    return execution;
}
#endif
