/* Vendor extensions through NeuralNetworksExtensions.h: with the example driver loaded
 * (NNAPI_DRIVERS=nnapi.drivers.catalog:fibonacci, Android's com.example.fibonacci
 * extension), a C program asks for the extension's types, builds
 * n -> EXAMPLE_FIBONACCI -> EXAMPLE_TENSOR_QUANT64_ASYMM (parameters in the operand's
 * extension data), runs it on the device that supports the extension and checks the
 * Fibonacci numbers; misuse of the four functions gets the NDK's result codes. */
#include <android/NeuralNetworksExtensions.h>
#include <string.h>

#include "capi_test.h"

enum { NUL = ANEURALNETWORKS_UNEXPECTED_NULL, BAD = ANEURALNETWORKS_BAD_DATA, STATE = ANEURALNETWORKS_BAD_STATE };

static const char* EXTENSION = "com.example.fibonacci";
enum { EXAMPLE_INT64 = 0, EXAMPLE_TENSOR_QUANT64_ASYMM = 1, EXAMPLE_FIBONACCI = 0 };

/* EXAMPLE_TENSOR_QUANT64_ASYMM's extension data: {double scale; int64 zero_point}. */
typedef struct {
    double scale;
    int64_t zero_point;
} Quant64Params;

static const ANeuralNetworksDevice* device_named(const char* wanted) {
    uint32_t count = 0;
    CHECK(ANeuralNetworks_getDeviceCount(&count));
    for (uint32_t i = 0; i < count; i++) {
        ANeuralNetworksDevice* device = NULL;
        const char* name = NULL;
        CHECK(ANeuralNetworks_getDevice(i, &device));
        CHECK(ANeuralNetworksDevice_getName(device, &name));
        if (strcmp(name, wanted) == 0) return device;
    }
    printf("FAIL no device %s (is NNAPI_DRIVERS set?)\n", wanted);
    exit(1);
}

static void extension_support(const ANeuralNetworksDevice* fibonacci, const ANeuralNetworksDevice* reference) {
    bool supported = false;
    CHECK(ANeuralNetworksDevice_getExtensionSupport(fibonacci, EXTENSION, &supported));
    EXPECT(supported);
    supported = true;
    CHECK(ANeuralNetworksDevice_getExtensionSupport(fibonacci, "com.example.unknown", &supported));
    EXPECT(!supported);
    supported = true;
    CHECK(ANeuralNetworksDevice_getExtensionSupport(reference, EXTENSION, &supported));
    EXPECT(!supported);
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getExtensionSupport(NULL, EXTENSION, &supported));
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getExtensionSupport(fibonacci, NULL, &supported));
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getExtensionSupport(fibonacci, EXTENSION, NULL));
}

/* n (EXAMPLE_INT64) -> EXAMPLE_FIBONACCI -> EXAMPLE_TENSOR_QUANT64_ASYMM [unknown length]. */
static ANeuralNetworksModel* fibonacci_model(void) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    int32_t int64_type = 0, quant64_type = 0;
    ANeuralNetworksOperationType fibonacci = 0;
    CHECK(ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, EXAMPLE_INT64, &int64_type));
    CHECK(ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, EXAMPLE_TENSOR_QUANT64_ASYMM,
                                                      &quant64_type));
    CHECK(ANeuralNetworksModel_getExtensionOperationType(model, EXTENSION, EXAMPLE_FIBONACCI, &fibonacci));
    /* prefix << 16 | code: the same prefix for the whole extension, never 0 */
    EXPECT((int64_type >> 16) != 0 && (int64_type & 0xFFFF) == EXAMPLE_INT64);
    EXPECT(quant64_type == (int64_type | EXAMPLE_TENSOR_QUANT64_ASYMM));
    EXPECT(fibonacci == (int64_type & ~0xFFFF));

    uint32_t n = 0;
    static const uint32_t unknown[1] = {0};
    add_operand(model, &n, scalar_type(int64_type));
    add_operand(model, &n, tensor_type(quant64_type, 1, unknown));
    Quant64Params params = {1.0, 0};
    CHECK(ANeuralNetworksModel_setOperandExtensionData(model, 1, &params, sizeof params));
    uint32_t in[1] = {0}, out[1] = {1};
    CHECK(ANeuralNetworksModel_addOperation(model, fibonacci, 1, in, 1, out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 1, in, 1, out));
    CHECK(ANeuralNetworksModel_finish(model));
    return model;
}

static void run_fibonacci(ANeuralNetworksCompilation* compilation) {
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    int64_t count = 12;
    uint64_t values[12] = {0};
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, &count, sizeof count));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, values, sizeof values));
    CHECK(ANeuralNetworksExecution_compute(execution));
    static const uint64_t expected[12] = {1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144};
    for (int i = 0; i < 12; i++) EXPECT(values[i] == expected[i]);
    uint32_t dims[1] = {0};
    CHECK(ANeuralNetworksExecution_getOutputOperandDimensions(execution, 0, dims));
    EXPECT(dims[0] == 12);
    ANeuralNetworksExecution_free(execution);

    /* More numbers than the output holds: the driver reports the size it needs. */
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    count = 20;
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, &count, sizeof count));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, values, sizeof values));
    EXPECT_CODE(ANEURALNETWORKS_OUTPUT_INSUFFICIENT_SIZE, ANeuralNetworksExecution_compute(execution));
    ANeuralNetworksExecution_free(execution);
}

static void extension_models(const ANeuralNetworksDevice* fibonacci, const ANeuralNetworksDevice* reference) {
    ANeuralNetworksModel* model = fibonacci_model();
    bool supported[1] = {true};
    CHECK(ANeuralNetworksModel_getSupportedOperationsForDevices(model, &reference, 1, supported));
    EXPECT(!supported[0]);
    CHECK(ANeuralNetworksModel_getSupportedOperationsForDevices(model, &fibonacci, 1, supported));
    EXPECT(supported[0]);

    /* The runtime's choice and an explicit device both run it ... */
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    run_fibonacci(compilation);
    ANeuralNetworksCompilation_free(compilation);
    CHECK(ANeuralNetworksCompilation_createForDevices(model, &fibonacci, 1, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    run_fibonacci(compilation);
    ANeuralNetworksCompilation_free(compilation);
    /* ... a device without the extension cannot (and there is no CPU fallback). */
    CHECK(ANeuralNetworksCompilation_createForDevices(model, &reference, 1, &compilation));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_finish(compilation));
    ANeuralNetworksCompilation_free(compilation);

    /* After finish: the types are still given, the data can no longer change. */
    int32_t type = 0;
    CHECK(ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, EXAMPLE_INT64, &type));
    Quant64Params params = {1.0, 0};
    EXPECT_CODE(STATE, ANeuralNetworksModel_setOperandExtensionData(model, 1, &params, sizeof params));
    ANeuralNetworksModel_free(model);
}

static void type_misuse(void) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    int32_t type = 0;
    ANeuralNetworksOperationType operation = 0;
    EXPECT_CODE(NUL, ANeuralNetworksModel_getExtensionOperandType(NULL, EXTENSION, 0, &type));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getExtensionOperandType(model, NULL, 0, &type));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, 0, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getExtensionOperationType(NULL, EXTENSION, 0, &operation));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getExtensionOperationType(model, NULL, 0, &operation));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getExtensionOperationType(model, EXTENSION, 0, NULL));
    /* an extension no device reports */
    EXPECT_CODE(BAD, ANeuralNetworksModel_getExtensionOperandType(model, "com.example.unknown", 0, &type));
    EXPECT_CODE(BAD, ANeuralNetworksModel_getExtensionOperationType(model, "com.example.unknown", 0, &operation));
    EXPECT_CODE(BAD, ANeuralNetworksModel_getExtensionOperandType(model, "", 0, &type));
    /* a type the extension does not declare is refused when an operand uses it */
    CHECK(ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, 7, &type));
    ANeuralNetworksOperandType undeclared = scalar_type(type);
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &undeclared));
    /* an extension operand takes no scale or zero point (they go in its extension data) */
    static const uint32_t dims[1] = {3};
    CHECK(ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, EXAMPLE_TENSOR_QUANT64_ASYMM, &type));
    ANeuralNetworksOperandType scaled = {type, 1, dims, 0.5f, 0};
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &scaled));
    ANeuralNetworksModel_free(model);
}

static void extension_data_misuse(void) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    int32_t quant64_type = 0;
    CHECK(ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, EXAMPLE_TENSOR_QUANT64_ASYMM,
                                                      &quant64_type));
    static const uint32_t dims[1] = {3};
    uint32_t n = 0;
    uint32_t standard = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims));
    uint32_t extension = add_operand(model, &n, tensor_type(quant64_type, 1, dims));
    Quant64Params params = {2.0, 1};
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandExtensionData(NULL, (int32_t)extension, &params,
                                                                 sizeof params));
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandExtensionData(model, (int32_t)extension, NULL, 16));
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandExtensionData(model, 99, &params, sizeof params));
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandExtensionData(model, -1, &params, sizeof params));
    /* only extension operands have extension data */
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandExtensionData(model, (int32_t)standard, &params,
                                                                 sizeof params));
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandExtensionData(model, (int32_t)extension, &params, 0));
    CHECK(ANeuralNetworksModel_setOperandExtensionData(model, (int32_t)extension, &params, sizeof params));
    CHECK(ANeuralNetworksModel_setOperandExtensionData(model, (int32_t)extension, NULL, 0)); /* removed */
    ANeuralNetworksModel_free(model);
    /* a freed model is BAD_STATE, as for every other model call */
    int32_t type = 0;
    EXPECT_CODE(STATE, ANeuralNetworksModel_getExtensionOperandType(model, EXTENSION, 0, &type));
    EXPECT_CODE(STATE, ANeuralNetworksModel_setOperandExtensionData(model, 1, &params, sizeof params));
}

int main(void) {
    const ANeuralNetworksDevice* fibonacci = device_named("example-fibonacci");
    const ANeuralNetworksDevice* reference = device_named("nnapi-reference");
    extension_support(fibonacci, reference);
    extension_models(fibonacci, reference);
    type_misuse();
    extension_data_misuse();
    done("extensions");
    return 0;
}
