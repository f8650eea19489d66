/* Memory through the C API: ANeuralNetworksMemory_createFromFd on the caller's file
 * descriptor (from ASharedMemory_create; constants, inputs and outputs live in it, and the
 * caller's own mapping sees the results); ANeuralNetworksMemory_copy; device memory from an ANeuralNetworksMemoryDesc
 * passing one execution's output to the next execution's input. */
#define _GNU_SOURCE
#include <android/sharedmem.h>
#include <sys/mman.h>
#include <unistd.h>

#include "capi_test.h"

#define SIZE 8192

/* y = x * w (element-wise), every operand TENSOR_FLOAT32 [64]. */
static ANeuralNetworksModel* mul_model(ANeuralNetworksMemory* weights, size_t offset) {
    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0, dims[1] = {64};
    uint32_t x = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims));
    uint32_t w = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims));
    CHECK(ANeuralNetworksModel_setOperandValueFromMemory(model, w, weights, offset, 64 * sizeof(float)));
    uint32_t act = add_int32(model, &n, ANEURALNETWORKS_FUSED_NONE);
    uint32_t y = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, dims));
    uint32_t in[3] = {x, w, act};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_MUL, 3, in, 1, &y));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 1, &x, 1, &y));
    CHECK(ANeuralNetworksModel_finish(model));
    return model;
}

int main(void) {
    int fd = ASharedMemory_create("capi-test", SIZE); /* as an Android program would */
    EXPECT(fd >= 0 && ASharedMemory_getSize(fd) == SIZE);
    float* mapped = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT(mapped != MAP_FAILED);
    /* floats [0, 64): weights; [256, 320): input; [512, 576): output */
    for (int i = 0; i < 64; i++) {
        mapped[i] = (float)(i + 1);
        mapped[256 + i] = 0.5f * (float)i;
        mapped[512 + i] = -1.0f;
    }
    ANeuralNetworksMemory* memory = NULL;
    CHECK(ANeuralNetworksMemory_createFromFd(SIZE, PROT_READ | PROT_WRITE, fd, 0, &memory));

    ANeuralNetworksModel* model = mul_model(memory, 0);
    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    ANeuralNetworksExecution* execution = NULL;
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInputFromMemory(execution, 0, NULL, memory, 256 * sizeof(float), 64 * sizeof(float)));
    CHECK(ANeuralNetworksExecution_setOutputFromMemory(execution, 0, NULL, memory, 512 * sizeof(float), 64 * sizeof(float)));
    CHECK(ANeuralNetworksExecution_compute(execution));
    ANeuralNetworksExecution_free(execution);
    float expected[64];
    for (int i = 0; i < 64; i++) expected[i] = 0.5f * (float)i * (float)(i + 1);
    expect_close("output in the caller's mapping", mapped + 512, expected, 64, 0.0f);

    /* Out-of-range regions are refused. */
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    EXPECT_CODE(ANEURALNETWORKS_BAD_DATA,
                ANeuralNetworksExecution_setInputFromMemory(execution, 0, NULL, memory, SIZE - 16, 64 * sizeof(float)));
    ANeuralNetworksExecution_free(execution);

    /* A second memory on the same fd at a page offset, and ANeuralNetworksMemory_copy. */
    ANeuralNetworksMemory* page = NULL;
    ANeuralNetworksMemory* first_page = NULL;
    CHECK(ANeuralNetworksMemory_createFromFd(4096, PROT_READ | PROT_WRITE, fd, 4096, &page));
    CHECK(ANeuralNetworksMemory_createFromFd(4096, PROT_READ, fd, 0, &first_page));
    CHECK(ANeuralNetworksMemory_copy(first_page, page));
    expect_close("copied page", mapped + 1024, mapped, 1024, 0.0f);
    EXPECT_CODE(ANEURALNETWORKS_BAD_DATA, ANeuralNetworksMemory_copy(page, first_page)); /* read-only dst */
    EXPECT_CODE(ANEURALNETWORKS_BAD_DATA, ANeuralNetworksMemory_copy(memory, page));      /* sizes differ */

    /* Device memory: execution 1 writes it, execution 2 reads it, then copy it out. */
    ANeuralNetworksMemoryDesc* desc = NULL;
    CHECK(ANeuralNetworksMemoryDesc_create(&desc));
    CHECK(ANeuralNetworksMemoryDesc_addOutputRole(desc, compilation, 0, 1.0f));
    CHECK(ANeuralNetworksMemoryDesc_addInputRole(desc, compilation, 0, 1.0f));
    CHECK(ANeuralNetworksMemoryDesc_finish(desc));
    ANeuralNetworksMemory* device_memory = NULL;
    CHECK(ANeuralNetworksMemory_createFromDesc(desc, &device_memory));
    ANeuralNetworksMemoryDesc_free(desc);
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInputFromMemory(execution, 0, NULL, memory, 256 * sizeof(float), 64 * sizeof(float)));
    CHECK(ANeuralNetworksExecution_setOutputFromMemory(execution, 0, NULL, device_memory, 0, 0));
    CHECK(ANeuralNetworksExecution_compute(execution));
    ANeuralNetworksExecution_free(execution);
    CHECK(ANeuralNetworksExecution_create(compilation, &execution));
    CHECK(ANeuralNetworksExecution_setInputFromMemory(execution, 0, NULL, device_memory, 0, 0));
    CHECK(ANeuralNetworksExecution_setOutputFromMemory(execution, 0, NULL, memory, 512 * sizeof(float), 64 * sizeof(float)));
    CHECK(ANeuralNetworksExecution_compute(execution));
    ANeuralNetworksExecution_free(execution);
    for (int i = 0; i < 64; i++) expected[i] *= (float)(i + 1);
    expect_close("chained through device memory", mapped + 512, expected, 64, 1e-6f);

    ANeuralNetworksMemory* out_region = NULL;
    CHECK(ANeuralNetworksMemory_createFromFd(64 * sizeof(float), PROT_READ | PROT_WRITE, fd, 768 * sizeof(float), &out_region));
    CHECK(ANeuralNetworksMemory_copy(device_memory, out_region));
    for (int i = 0; i < 64; i++) expected[i] = 0.5f * (float)i * (float)(i + 1);
    expect_close("device memory copied out", mapped + 768, expected, 64, 0.0f);

    ANeuralNetworksMemory_free(out_region);
    ANeuralNetworksMemory_free(device_memory);
    ANeuralNetworksMemory_free(page);
    ANeuralNetworksMemory_free(first_page);
    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
    ANeuralNetworksMemory_free(memory);
    /* The library duplicated the descriptor: ours is still open. */
    EXPECT(lseek(fd, 0, SEEK_SET) == 0);
    munmap(mapped, SIZE);
    close(fd);
    done("memory");
    return 0;
}
