/* Misuse battery: every kind of bad call gets the NDK's result code, and the library
 * never crashes (NULL arguments, bad indexes and sizes, calls in the wrong state, freed
 * and foreign handles, double frees). */
#define _GNU_SOURCE
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "capi_test.h"

enum { NUL = ANEURALNETWORKS_UNEXPECTED_NULL, BAD = ANEURALNETWORKS_BAD_DATA, STATE = ANEURALNETWORKS_BAD_STATE };

static const uint32_t DIMS[1] = {2};

/* a + b on TENSOR_FLOAT32 [2], not finished. */
static ANeuralNetworksModel* unfinished_add(void) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0;
    add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, DIMS));
    add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, DIMS));
    add_int32(model, &n, ANEURALNETWORKS_FUSED_NONE);
    add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, DIMS));
    uint32_t in[3] = {0, 1, 2}, out[1] = {3};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, in, 1, out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, in, 1, out));
    return model;
}

static void model_misuse(void) {
    EXPECT_CODE(NUL, ANeuralNetworksModel_create(NULL));
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    ANeuralNetworksOperandType f32 = tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, DIMS);
    EXPECT_CODE(NUL, ANeuralNetworksModel_addOperand(NULL, &f32));
    EXPECT_CODE(NUL, ANeuralNetworksModel_addOperand(model, NULL));
    ANeuralNetworksOperandType bad_code = tensor_type(12345, 1, DIMS);
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &bad_code));
    ANeuralNetworksOperandType scalar_with_dims = tensor_type(ANEURALNETWORKS_INT32, 1, DIMS);
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &scalar_with_dims));
    ANeuralNetworksOperandType quant_no_scale = tensor_type(ANEURALNETWORKS_TENSOR_QUANT8_ASYMM, 1, DIMS);
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &quant_no_scale));
    ANeuralNetworksOperandType quant_bad_zero = {ANEURALNETWORKS_TENSOR_QUANT8_ASYMM, 1, DIMS, 1.0f, 300};
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &quant_bad_zero));
    ANeuralNetworksOperandType null_dims = {ANEURALNETWORKS_TENSOR_FLOAT32, 2, NULL, 0.0f, 0};
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &null_dims));
    /* Android's size rule: the element size times the specified dimensions (an unspecified
     * one counts as 1) fits in uint32 -- 2**32 bytes does not, 2**32 - 1 does. */
    static const uint32_t too_large_dims[3] = {65536, 0, 16384};
    ANeuralNetworksOperandType too_large = tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 3, too_large_dims);
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperand(model, &too_large));
    static const uint32_t at_limit_dims[2] = {65535, 65537};
    ANeuralNetworksOperandType at_limit = tensor_type(ANEURALNETWORKS_TENSOR_BOOL8, 2, at_limit_dims);
    CHECK(ANeuralNetworksModel_addOperand(model, &at_limit));
    ANeuralNetworksModel_free(model);

    model = unfinished_add();
    float buffer[2] = {1, 2};
    int32_t fuse = 0;
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandValue(NULL, 2, &fuse, sizeof fuse));
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandValue(model, 2, NULL, sizeof fuse));
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandValue(model, 99, &fuse, sizeof fuse));
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandValue(model, -1, &fuse, sizeof fuse));
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandValue(model, 2, buffer, sizeof buffer)); /* wrong size */
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandValue(model, 0, buffer, sizeof buffer)); /* a model input */
    uint32_t in[3] = {0, 1, 2}, out[1] = {3}, too_far[1] = {42};
    EXPECT_CODE(NUL, ANeuralNetworksModel_addOperation(NULL, ANEURALNETWORKS_ADD, 3, in, 1, out));
    EXPECT_CODE(NUL, ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 0, NULL, 1, out));
    EXPECT_CODE(NUL, ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, in, 0, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperation(model, 9999, 3, in, 1, out));
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, in, 1, too_far));
    EXPECT_CODE(BAD, ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 2, in, 1, out)); /* 2 inputs */
    EXPECT_CODE(NUL, ANeuralNetworksModel_identifyInputsAndOutputs(NULL, 2, in, 1, out));
    EXPECT_CODE(NUL, ANeuralNetworksModel_identifyInputsAndOutputs(model, 0, NULL, 1, out));
    EXPECT_CODE(NUL, ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, in, 0, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksModel_identifyInputsAndOutputs(model, 1, too_far, 1, out));
    EXPECT_CODE(NUL, ANeuralNetworksModel_relaxComputationFloat32toFloat16(NULL, true));
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandValueFromModel(model, 0, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandValueFromMemory(model, 0, NULL, 0, 8));
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(model, 0, NULL));
    float scales[2] = {1.0f, 2.0f};
    ANeuralNetworksSymmPerChannelQuantParams params = {0, 2, scales};
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(model, 0, &params)); /* float */
    EXPECT_CODE(NUL, ANeuralNetworksModel_finish(NULL));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_create(model, NULL));
    ANeuralNetworksCompilation* compilation = (ANeuralNetworksCompilation*)1;
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_create(model, &compilation)); /* model not finished */
    EXPECT(compilation == NULL);  /* out-parameters are cleared on failure */
    CHECK(ANeuralNetworksModel_finish(model));
    EXPECT_CODE(STATE, ANeuralNetworksModel_finish(model));
    EXPECT_CODE(STATE, ANeuralNetworksModel_addOperand(model, &f32));
    EXPECT_CODE(STATE, ANeuralNetworksModel_setOperandValue(model, 2, &fuse, sizeof fuse));
    EXPECT_CODE(STATE, ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, in, 1, out));
    EXPECT_CODE(STATE, ANeuralNetworksModel_identifyInputsAndOutputs(model, 2, in, 1, out));
    EXPECT_CODE(STATE, ANeuralNetworksModel_relaxComputationFloat32toFloat16(model, true));
    EXPECT_CODE(STATE, ANeuralNetworksModel_setOperandValueFromModel(model, 0, model));
    ANeuralNetworksModel_free(model);

    /* A model with an operand nobody writes cannot be finished. */
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0;
    add_operand(model, &n, f32);
    add_operand(model, &n, f32);
    add_int32(model, &n, 0);
    add_operand(model, &n, f32);
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_ADD, 3, in, 1, out));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 1, in, 1, out));
    EXPECT_CODE(BAD, ANeuralNetworksModel_finish(model));
    ANeuralNetworksModel_free(model);
}

static void device_misuse(void) {
    uint32_t count = 0;
    EXPECT_CODE(NUL, ANeuralNetworks_getDeviceCount(NULL));
    CHECK(ANeuralNetworks_getDeviceCount(&count));
    EXPECT(count >= 1);
    ANeuralNetworksDevice* device = NULL;
    EXPECT_CODE(NUL, ANeuralNetworks_getDevice(0, NULL));
    EXPECT_CODE(BAD, ANeuralNetworks_getDevice(count, &device));
    EXPECT(device == NULL);
    CHECK(ANeuralNetworks_getDevice(0, &device));
    ANeuralNetworksDevice* again = NULL;
    CHECK(ANeuralNetworks_getDevice(0, &again));
    EXPECT(again == device);  /* one handle per device */
    const char* name = NULL;
    const char* version = NULL;
    int32_t type = -1;
    int64_t level = 0;
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getName(NULL, &name));
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getName(device, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getVersion(device, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getType(device, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksDevice_getFeatureLevel(device, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksDevice_wait(NULL));
    CHECK(ANeuralNetworksDevice_getName(device, &name));
    CHECK(ANeuralNetworksDevice_getVersion(device, &version));
    CHECK(ANeuralNetworksDevice_getType(device, &type));
    CHECK(ANeuralNetworksDevice_getFeatureLevel(device, &level));
    CHECK(ANeuralNetworksDevice_wait(device));
    EXPECT(name != NULL && strlen(name) > 0 && version != NULL);
    EXPECT(type >= ANEURALNETWORKS_DEVICE_UNKNOWN && type <= ANEURALNETWORKS_DEVICE_ACCELERATOR);
    EXPECT(level >= ANEURALNETWORKS_FEATURE_LEVEL_1);
    EXPECT(ANeuralNetworks_getRuntimeFeatureLevel() == ANEURALNETWORKS_FEATURE_LEVEL_8);

    ANeuralNetworksModel* model = unfinished_add();
    bool supported[1] = {false};
    const ANeuralNetworksDevice* devices[2] = {device, device};
    EXPECT_CODE(STATE, ANeuralNetworksModel_getSupportedOperationsForDevices(model, devices, 1, supported));
    CHECK(ANeuralNetworksModel_finish(model));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getSupportedOperationsForDevices(NULL, devices, 1, supported));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getSupportedOperationsForDevices(model, NULL, 1, supported));
    EXPECT_CODE(NUL, ANeuralNetworksModel_getSupportedOperationsForDevices(model, devices, 1, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksModel_getSupportedOperationsForDevices(model, devices, 0, supported));
    EXPECT_CODE(BAD, ANeuralNetworksModel_getSupportedOperationsForDevices(model, devices, 2, supported));
    CHECK(ANeuralNetworksModel_getSupportedOperationsForDevices(model, devices, 1, supported));
    EXPECT(supported[0]);

    ANeuralNetworksCompilation* compilation = NULL;
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_createForDevices(NULL, devices, 1, &compilation));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_createForDevices(model, NULL, 1, &compilation));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_createForDevices(model, devices, 1, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_createForDevices(model, devices, 0, &compilation));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_createForDevices(model, devices, 2, &compilation));
    const ANeuralNetworksDevice* with_null[1] = {NULL};
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_createForDevices(model, with_null, 1, &compilation));
    /* One explicit device: timing and timeouts are allowed. */
    CHECK(ANeuralNetworksCompilation_createForDevices(model, devices, 1, &compilation));
    CHECK(ANeuralNetworksCompilation_setTimeout(compilation, 1000000000ull));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setMeasureTiming(execution, true));
    CHECK(ANeuralNetworksExecution_setTimeout(execution, 1000000000ull));
    float a[2] = {1, 2}, y[2];
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, y, sizeof y));
    uint64_t duration = 0;
    EXPECT_CODE(STATE, ANeuralNetworksExecution_getDuration(execution, ANEURALNETWORKS_DURATION_ON_HARDWARE, &duration));
    CHECK(ANeuralNetworksExecution_compute(execution));
    EXPECT(y[0] == 2.0f && y[1] == 4.0f);
    EXPECT_CODE(NUL, ANeuralNetworksExecution_getDuration(execution, ANEURALNETWORKS_DURATION_ON_HARDWARE, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_getDuration(execution, 77, &duration));
    CHECK(ANeuralNetworksExecution_getDuration(execution, ANEURALNETWORKS_DURATION_IN_DRIVER, &duration));
    EXPECT(duration > 0);
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
}

static void compilation_and_execution_misuse(void) {
    ANeuralNetworksModel* model = unfinished_add();
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_setPreference(NULL, ANEURALNETWORKS_PREFER_LOW_POWER));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_setPreference(compilation, 40));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_setPriority(NULL, ANEURALNETWORKS_PRIORITY_DEFAULT));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_setPriority(compilation, 42));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_setTimeout(NULL, 1));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_setTimeout(compilation, 1)); /* not for one explicit device */
    uint8_t token[ANEURALNETWORKS_BYTE_SIZE_OF_CACHE_TOKEN] = {0};
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_setCaching(NULL, "/tmp", token));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_setCaching(compilation, NULL, token));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_setCaching(compilation, "/tmp", NULL));
    uint32_t alignment = 0;
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(compilation, 0, &alignment));
    ANeuralNetworksExecution* execution = (ANeuralNetworksExecution*)1;
    EXPECT_CODE(STATE, ANeuralNetworksExecution_create(compilation, &execution)); /* not finished */
    EXPECT(execution == NULL);
    ANeuralNetworksBurst* burst = NULL;
    EXPECT_CODE(STATE, ANeuralNetworksBurst_create(compilation, &burst));
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_finish(NULL));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_finish(compilation));
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_setPreference(compilation, ANEURALNETWORKS_PREFER_LOW_POWER));
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_setPriority(compilation, ANEURALNETWORKS_PRIORITY_HIGH));
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_setCaching(compilation, "/tmp", token));
    uint32_t padding = 0;
    EXPECT_CODE(NUL, ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(compilation, 0, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(compilation, 2, &alignment));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput(compilation, 1, &padding));
    CHECK(ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(compilation, 1, &alignment));
    CHECK(ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput(compilation, 1, &padding));
    EXPECT(alignment >= 1 && (alignment & (alignment - 1)) == 0 && padding >= 1);
    CHECK(ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput(compilation, 0, &alignment));
    CHECK(ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput(compilation, 0, &padding));

    EXPECT_CODE(NUL, ANeuralNetworksExecution_create(NULL, &execution));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_create(compilation, NULL));
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    float a[2] = {1, 2}, y[2] = {0, 0};
    char big[20];
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setInput(NULL, 0, NULL, a, sizeof a));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setInput(execution, 0, NULL, NULL, sizeof a));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setInput(execution, 0, NULL, big, sizeof big));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setInput(execution, 999, NULL, a, sizeof a));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setInput(execution, -1, NULL, a, sizeof a));
    ANeuralNetworksOperandType wrong_type = tensor_type(ANEURALNETWORKS_TENSOR_INT32, 1, DIMS);
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setInput(execution, 0, &wrong_type, a, sizeof a));
    uint32_t three[1] = {3};
    ANeuralNetworksOperandType wrong_dims = tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, three);
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setInput(execution, 0, &wrong_dims, a, sizeof a));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setOutput(NULL, 0, NULL, y, sizeof y));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setOutput(execution, 0, NULL, NULL, sizeof y));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setOutput(execution, 0, NULL, big, sizeof big));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setOutput(execution, 1, NULL, y, sizeof y));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setInputFromMemory(execution, 0, NULL, NULL, 0, 8));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setOutputFromMemory(execution, 0, NULL, NULL, 0, 8));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setMeasureTiming(NULL, true));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setMeasureTiming(execution, true)); /* not one explicit device */
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setTimeout(NULL, 1));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_setTimeout(execution, 1));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setLoopTimeout(NULL, 1));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_setReusable(NULL, true));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_enableInputAndOutputPadding(NULL, true));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a));
    EXPECT_CODE(STATE, ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a)); /* set once */
    EXPECT_CODE(STATE, ANeuralNetworksExecution_enableInputAndOutputPadding(execution, true));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_compute(NULL));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_compute(execution)); /* input 1 and output 0 not set */
    ANeuralNetworksExecution_free(execution);

    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, y, sizeof y));
    uint32_t rank = 0, dims[1] = {0};
    EXPECT_CODE(STATE, ANeuralNetworksExecution_getOutputOperandRank(execution, 0, &rank));
    EXPECT_CODE(STATE, ANeuralNetworksExecution_getOutputOperandDimensions(execution, 0, dims));
    CHECK(ANeuralNetworksExecution_compute(execution));
    EXPECT(y[0] == 2.0f && y[1] == 4.0f);
    EXPECT_CODE(NUL, ANeuralNetworksExecution_getOutputOperandRank(execution, 0, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_getOutputOperandDimensions(execution, 0, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_getOutputOperandRank(execution, 1, &rank));
    EXPECT_CODE(STATE, ANeuralNetworksExecution_compute(execution));  /* not reusable */
    ANeuralNetworksEvent* event = (ANeuralNetworksEvent*)1;
    EXPECT_CODE(STATE, ANeuralNetworksExecution_startCompute(execution, &event));
    EXPECT(event == NULL);
    EXPECT_CODE(NUL, ANeuralNetworksExecution_startCompute(execution, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_startComputeWithDependencies(execution, NULL, 1, 0, &event));
    EXPECT_CODE(STATE, ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a));
    EXPECT_CODE(STATE, ANeuralNetworksExecution_setOutput(execution, 0, NULL, y, sizeof y));
    EXPECT_CODE(STATE, ANeuralNetworksExecution_setLoopTimeout(execution, 1));
    EXPECT_CODE(STATE, ANeuralNetworksExecution_setReusable(execution, true));
    ANeuralNetworksExecution_free(execution);

    /* Bursts belong to their compilation. */
    ANeuralNetworksModel* other_model = unfinished_add();
    CHECK(ANeuralNetworksModel_finish(other_model));
    ANeuralNetworksCompilation* other = NULL;
    CHECK(ANeuralNetworksCompilation_create(other_model, &other));
    CHECK(ANeuralNetworksCompilation_finish(other));
    EXPECT_CODE(NUL, ANeuralNetworksBurst_create(NULL, &burst));
    EXPECT_CODE(NUL, ANeuralNetworksBurst_create(other, NULL));
    CHECK(ANeuralNetworksBurst_create(other, &burst));
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, y, sizeof y));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_burstCompute(NULL, burst));
    EXPECT_CODE(NUL, ANeuralNetworksExecution_burstCompute(execution, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_burstCompute(execution, burst));
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksBurst_free(burst);
    ANeuralNetworksCompilation_free(other);
    ANeuralNetworksModel_free(other_model);

    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
}

static void memory_and_event_misuse(void) {
    ANeuralNetworksMemory* memory = (ANeuralNetworksMemory*)1;
    EXPECT_CODE(NUL, ANeuralNetworksMemory_createFromFd(64, PROT_READ, 0, 0, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksMemory_createFromFd(64, PROT_READ, -1, 0, &memory));
    EXPECT(memory == NULL);
    int fd = memfd_create("misuse", 0);
    EXPECT(fd >= 0 && ftruncate(fd, 4096) == 0);
    EXPECT_CODE(BAD, ANeuralNetworksMemory_createFromFd(0, PROT_READ, fd, 0, &memory));
    EXPECT_CODE(BAD, ANeuralNetworksMemory_createFromFd(64, 12345, fd, 0, &memory));
    EXPECT_CODE(BAD, ANeuralNetworksMemory_createFromFd(64, PROT_READ, fd, 1 << 20, &memory)); /* past the end */
    CHECK(ANeuralNetworksMemory_createFromFd(4096, PROT_READ | PROT_WRITE, fd, 0, &memory));
    EXPECT_CODE(NUL, ANeuralNetworksMemory_copy(NULL, memory));
    EXPECT_CODE(NUL, ANeuralNetworksMemory_copy(memory, NULL));
    ANeuralNetworksMemory* hw = NULL;
    EXPECT_CODE(NUL, ANeuralNetworksMemory_createFromAHardwareBuffer(NULL, &hw));
    EXPECT_CODE(BAD, ANeuralNetworksMemory_createFromAHardwareBuffer((const AHardwareBuffer*)&fd, &hw));
    EXPECT(hw == NULL);

    ANeuralNetworksModel* model = unfinished_add();
    EXPECT_CODE(NUL, ANeuralNetworksModel_setOperandValueFromMemory(NULL, 2, memory, 0, 4));
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandValueFromMemory(model, 2, memory, 4094, 4));  /* past the end */
    EXPECT_CODE(BAD, ANeuralNetworksModel_setOperandValueFromMemory(model, 2, memory, 0, 8));     /* wrong size */
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));

    ANeuralNetworksMemoryDesc* desc = (ANeuralNetworksMemoryDesc*)1;
    EXPECT_CODE(NUL, ANeuralNetworksMemoryDesc_create(NULL));
    CHECK(ANeuralNetworksMemoryDesc_create(&desc));
    EXPECT_CODE(NUL, ANeuralNetworksMemoryDesc_addInputRole(NULL, compilation, 0, 1.0f));
    EXPECT_CODE(NUL, ANeuralNetworksMemoryDesc_addInputRole(desc, NULL, 0, 1.0f));
    EXPECT_CODE(BAD, ANeuralNetworksMemoryDesc_addInputRole(desc, compilation, 5, 1.0f));
    EXPECT_CODE(BAD, ANeuralNetworksMemoryDesc_addInputRole(desc, compilation, 0, 0.0f));
    EXPECT_CODE(BAD, ANeuralNetworksMemoryDesc_addOutputRole(desc, compilation, 0, 1.5f));
    EXPECT_CODE(NUL, ANeuralNetworksMemoryDesc_setDimensions(desc, 1, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksMemoryDesc_finish(desc));  /* no role */
    ANeuralNetworksMemory* device_memory = NULL;
    EXPECT_CODE(STATE, ANeuralNetworksMemory_createFromDesc(desc, &device_memory));
    CHECK(ANeuralNetworksMemoryDesc_addInputRole(desc, compilation, 0, 1.0f));
    EXPECT_CODE(BAD, ANeuralNetworksMemoryDesc_addInputRole(desc, compilation, 0, 1.0f));  /* twice */
    CHECK(ANeuralNetworksMemoryDesc_finish(desc));
    EXPECT_CODE(STATE, ANeuralNetworksMemoryDesc_finish(desc));
    EXPECT_CODE(STATE, ANeuralNetworksMemoryDesc_addOutputRole(desc, compilation, 0, 1.0f));
    EXPECT_CODE(NUL, ANeuralNetworksMemory_createFromDesc(NULL, &device_memory));
    EXPECT_CODE(NUL, ANeuralNetworksMemory_createFromDesc(desc, NULL));
    CHECK(ANeuralNetworksMemory_createFromDesc(desc, &device_memory));
    /* Device memory that was never written cannot be read (OP_FAILED at compute, as Android). */
    ANeuralNetworksExecution* execution = NULL;
    float a[2] = {1, 2}, y[2];
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInputFromMemory(execution, 0, NULL, device_memory, 0, 0));
    CHECK(ANeuralNetworksExecution_setInput(execution, 1, NULL, a, sizeof a));
    CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, y, sizeof y));
    EXPECT_CODE(ANEURALNETWORKS_OP_FAILED, ANeuralNetworksExecution_compute(execution));
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksMemory_free(device_memory);
    ANeuralNetworksMemoryDesc_free(desc);

    ANeuralNetworksEvent* event = (ANeuralNetworksEvent*)1;
    EXPECT_CODE(NUL, ANeuralNetworksEvent_createFromSyncFenceFd(fd, NULL));
    EXPECT_CODE(BAD, ANeuralNetworksEvent_createFromSyncFenceFd(-1, &event));
    EXPECT(event == NULL);
    int fence = 123;
    EXPECT_CODE(NUL, ANeuralNetworksEvent_getSyncFenceFd(NULL, &fence));
    EXPECT(fence == -1);
    EXPECT_CODE(NUL, ANeuralNetworksEvent_getSyncFenceFd((ANeuralNetworksEvent*)&fence, NULL));
    EXPECT_CODE(NUL, ANeuralNetworksEvent_wait(NULL));

    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
    ANeuralNetworksMemory_free(memory);
    close(fd);
}

static void handle_misuse(void) {
    /* Freed handles give BAD_STATE; handles of another type or not from this library BAD_DATA. */
    ANeuralNetworksModel* model = unfinished_add();
    CHECK(ANeuralNetworksModel_finish(model));
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    EXPECT_CODE(BAD, ANeuralNetworksCompilation_finish((ANeuralNetworksCompilation*)model));
    EXPECT_CODE(BAD, ANeuralNetworksModel_finish((ANeuralNetworksModel*)compilation));
    int on_stack = 0;
    EXPECT_CODE(BAD, ANeuralNetworksModel_finish((ANeuralNetworksModel*)&on_stack));
    EXPECT_CODE(BAD, ANeuralNetworksExecution_compute((ANeuralNetworksExecution*)(uintptr_t)0xdeadbeef));
    ANeuralNetworksCompilation_free(compilation);
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_finish(compilation));
    ANeuralNetworksExecution* execution = NULL;
    EXPECT_CODE(STATE, ANeuralNetworksExecution_create(compilation, &execution));
    ANeuralNetworksCompilation_free(compilation);  /* double free: reported, harmless */
    ANeuralNetworksModel_free(model);
    EXPECT_CODE(STATE, ANeuralNetworksCompilation_create(model, &compilation));
    ANeuralNetworksModel_free(model);
    /* Freeing NULL is a no-op for every type; freeing a foreign pointer does not crash. */
    ANeuralNetworksModel_free(NULL);
    ANeuralNetworksCompilation_free(NULL);
    ANeuralNetworksExecution_free(NULL);
    ANeuralNetworksBurst_free(NULL);
    ANeuralNetworksMemory_free(NULL);
    ANeuralNetworksMemoryDesc_free(NULL);
    ANeuralNetworksEvent_free(NULL);
    ANeuralNetworksModel_free((ANeuralNetworksModel*)&on_stack);
    EXPECT(strlen(nnapi_capi_last_error()) > 0);
}

int main(void) {
    model_misuse();
    device_misuse();
    compilation_and_execution_misuse();
    memory_and_event_misuse();
    handle_misuse();
    done("misuse");
    return 0;
}
