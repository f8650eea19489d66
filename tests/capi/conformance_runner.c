/* CTS conformance through the C API only: reads vectors written by convert_vectors.py,
 * builds each model (and the models IF / WHILE reference) with ANeuralNetworksModel_*,
 * compiles, executes and judges the outputs with the CTS accuracy criteria
 * (shared/conformance/README.md). CONSTANT_REFERENCE values go through shared memory
 * (memfd + ANeuralNetworksMemory_createFromFd), as on Android.
 *
 * usage: conformance_runner VECTORS.txt [-v]    prints FAIL lines and a SUMMARY line. */
#define _GNU_SOURCE
#include <android/NeuralNetworks.h>
#include <math.h>
#include <nnapi/capi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { TEMPORARY, SUBGRAPH_INPUT, SUBGRAPH_OUTPUT, CONSTANT_COPY, CONSTANT_REFERENCE, NO_VALUE, SUBGRAPH };

typedef struct {
    int32_t type;
    uint32_t rank;
    uint32_t* dims;
    float scale;
    int32_t zero_point;
    int lifetime;
    int32_t channel_dim;
    uint32_t scale_count;
    float* scales;
    int ignored;
    long size; /* -1: no data */
    uint8_t* data;
} Operand;

typedef struct {
    int32_t type;
    uint32_t input_count, output_count;
    uint32_t *inputs, *outputs;
} Operation;

typedef struct {
    uint32_t operand_count, operation_count, input_count, output_count;
    Operand* operands;
    Operation* operations;
    uint32_t *inputs, *outputs;
    ANeuralNetworksModel* model;
    int building;
} Subgraph;

typedef struct {
    char name[512];
    int expect_failure, relaxed;
    double multinomial_tolerance;
    uint32_t subgraph_count;
    Subgraph* subgraphs;
} Test;

/* --- reading ------------------------------------------------------------------------- */
static char* cursor;

static char* token(void) {
    while (*cursor == ' ' || *cursor == '\n') cursor++;
    char* start = cursor;
    while (*cursor && *cursor != ' ' && *cursor != '\n') cursor++;
    if (*cursor) *cursor++ = '\0';
    return start;
}
static long integer(void) { return strtol(token(), NULL, 10); }
static double real(void) { return strtod(token(), NULL); }

static uint32_t* index_list(uint32_t count) {
    uint32_t* list = calloc(count + 1, sizeof(uint32_t));
    for (uint32_t i = 0; i < count; i++) list[i] = (uint32_t)integer();
    return list;
}

static int hex_value(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

static void read_operand(Operand* operand) {
    operand->type = (int32_t)integer();
    operand->rank = (uint32_t)integer();
    operand->dims = index_list(operand->rank);
    operand->scale = (float)real();
    operand->zero_point = (int32_t)integer();
    operand->lifetime = (int)integer();
    operand->channel_dim = (int32_t)integer();
    operand->scale_count = (uint32_t)integer();
    operand->scales = calloc(operand->scale_count + 1, sizeof(float));
    for (uint32_t i = 0; i < operand->scale_count; i++) operand->scales[i] = (float)real();
    operand->ignored = (int)integer();
    operand->size = integer();
    char* hex = token();
    /* 64-byte aligned storage, as a client would allocate tensors */
    size_t capacity = operand->size > 0 ? (size_t)operand->size : 1;
    operand->data = aligned_alloc(64, (capacity + 63) / 64 * 64);
    for (long i = 0; i < operand->size; i++) operand->data[i] = (uint8_t)(hex_value(hex[2 * i]) << 4 | hex_value(hex[2 * i + 1]));
}

/* Reads the next test; 0 at the end of the file. */
static int read_test(FILE* file, Test* test, char** line, size_t* capacity) {
    if (getline(line, capacity, file) <= 0) return 0;
    cursor = *line;
    if (strcmp(token(), "TEST") != 0) return 0;
    snprintf(test->name, sizeof test->name, "%s", token());
    test->expect_failure = (int)integer();
    test->relaxed = (int)integer();
    test->multinomial_tolerance = real();
    test->subgraph_count = (uint32_t)integer();
    test->subgraphs = calloc(test->subgraph_count, sizeof(Subgraph));
    for (uint32_t s = 0; s < test->subgraph_count; s++) {
        Subgraph* subgraph = &test->subgraphs[s];
        if (getline(line, capacity, file) <= 0) return 0;
        cursor = *line;
        token();
        subgraph->operand_count = (uint32_t)integer();
        subgraph->operation_count = (uint32_t)integer();
        subgraph->operands = calloc(subgraph->operand_count + 1, sizeof(Operand));
        subgraph->operations = calloc(subgraph->operation_count + 1, sizeof(Operation));
        for (uint32_t i = 0; i < subgraph->operand_count; i++) {
            if (getline(line, capacity, file) <= 0) return 0;
            cursor = *line;
            token();
            read_operand(&subgraph->operands[i]);
        }
        for (uint32_t i = 0; i < subgraph->operation_count; i++) {
            if (getline(line, capacity, file) <= 0) return 0;
            cursor = *line;
            token();
            Operation* operation = &subgraph->operations[i];
            operation->type = (int32_t)integer();
            operation->input_count = (uint32_t)integer();
            operation->inputs = index_list(operation->input_count);
            operation->output_count = (uint32_t)integer();
            operation->outputs = index_list(operation->output_count);
        }
        if (getline(line, capacity, file) <= 0) return 0;
        cursor = *line;
        token();
        subgraph->input_count = (uint32_t)integer();
        subgraph->inputs = index_list(subgraph->input_count);
        subgraph->output_count = (uint32_t)integer();
        subgraph->outputs = index_list(subgraph->output_count);
    }
    return 1;
}

static void free_test(Test* test) {
    for (uint32_t s = 0; s < test->subgraph_count; s++) {
        Subgraph* subgraph = &test->subgraphs[s];
        ANeuralNetworksModel_free(subgraph->model);
        for (uint32_t i = 0; i < subgraph->operand_count; i++) {
            free(subgraph->operands[i].dims);
            free(subgraph->operands[i].scales);
            free(subgraph->operands[i].data);
        }
        for (uint32_t i = 0; i < subgraph->operation_count; i++) {
            free(subgraph->operations[i].inputs);
            free(subgraph->operations[i].outputs);
        }
        free(subgraph->operands);
        free(subgraph->operations);
        free(subgraph->inputs);
        free(subgraph->outputs);
    }
    free(test->subgraphs);
}

/* --- building, through the C API only ----------------------------------------------------- */
#define MAX_MEMORIES 64
static ANeuralNetworksMemory* memories[MAX_MEMORIES];
static int memory_count;
static char failure[2048];

#define TRY(call)                                                                                    \
    do {                                                                                             \
        int result_ = (call);                                                                        \
        if (result_ != ANEURALNETWORKS_NO_ERROR) {                                                   \
            snprintf(failure, sizeof failure, "%s returned %d: %s", #call, result_, nnapi_capi_last_error()); \
            return result_;                                                                          \
        }                                                                                            \
    } while (0)

static int shared_memory_value(ANeuralNetworksModel* model, uint32_t index, const Operand* operand) {
    if (memory_count == MAX_MEMORIES) return ANeuralNetworksModel_setOperandValue(model, (int32_t)index, operand->data, (size_t)operand->size);
    int fd = memfd_create("cts-constant", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, operand->size) != 0 || pwrite(fd, operand->data, (size_t)operand->size, 0) != operand->size) {
        snprintf(failure, sizeof failure, "memfd for constant %u failed", index);
        if (fd >= 0) close(fd);
        return ANEURALNETWORKS_OP_FAILED;
    }
    ANeuralNetworksMemory* memory = NULL;
    int result = ANeuralNetworksMemory_createFromFd((size_t)operand->size, PROT_READ, fd, 0, &memory);
    close(fd); /* the memory holds its own duplicate */
    TRY(result);
    memories[memory_count++] = memory;
    TRY(ANeuralNetworksModel_setOperandValueFromMemory(model, (int32_t)index, memory, 0, (size_t)operand->size));
    return ANEURALNETWORKS_NO_ERROR;
}

static int build(Test* test, uint32_t which) {
    Subgraph* subgraph = &test->subgraphs[which];
    if (subgraph->model != NULL) return ANEURALNETWORKS_NO_ERROR;
    if (subgraph->building) {
        snprintf(failure, sizeof failure, "subgraph %u references itself", which);
        return ANEURALNETWORKS_BAD_DATA;
    }
    subgraph->building = 1;
    ANeuralNetworksModel* model = NULL;
    TRY(ANeuralNetworksModel_create(&model));
    subgraph->model = model;
    for (uint32_t i = 0; i < subgraph->operand_count; i++) {
        const Operand* operand = &subgraph->operands[i];
        ANeuralNetworksOperandType type = {operand->type, operand->rank, operand->rank ? operand->dims : NULL,
                                           operand->scale, operand->zero_point};
        TRY(ANeuralNetworksModel_addOperand(model, &type));
        if (operand->channel_dim >= 0) {
            ANeuralNetworksSymmPerChannelQuantParams params = {(uint32_t)operand->channel_dim, operand->scale_count,
                                                               operand->scales};
            TRY(ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(model, (int32_t)i, &params));
        }
        switch (operand->lifetime) {
            case CONSTANT_COPY:
            case CONSTANT_REFERENCE:
                if (operand->size < 0) break;
                if (operand->lifetime == CONSTANT_REFERENCE && operand->size > 0) {
                    int result = shared_memory_value(model, i, operand);
                    if (result != ANEURALNETWORKS_NO_ERROR) return result;
                } else {
                    TRY(ANeuralNetworksModel_setOperandValue(model, (int32_t)i, operand->size ? operand->data : NULL,
                                                             (size_t)operand->size));
                }
                break;
            case NO_VALUE:
                TRY(ANeuralNetworksModel_setOperandValue(model, (int32_t)i, NULL, 0));
                break;
            case SUBGRAPH: {
                uint32_t target;
                memcpy(&target, operand->data, sizeof target);
                if (target >= test->subgraph_count) {
                    snprintf(failure, sizeof failure, "operand %u references subgraph %u of %u", i, target,
                             test->subgraph_count);
                    return ANEURALNETWORKS_BAD_DATA;
                }
                int result = build(test, target);
                if (result != ANEURALNETWORKS_NO_ERROR) return result;
                TRY(ANeuralNetworksModel_setOperandValueFromModel(model, (int32_t)i, test->subgraphs[target].model));
                break;
            }
            default:
                break;
        }
    }
    for (uint32_t i = 0; i < subgraph->operation_count; i++) {
        const Operation* operation = &subgraph->operations[i];
        TRY(ANeuralNetworksModel_addOperation(model, operation->type, operation->input_count, operation->inputs,
                                              operation->output_count, operation->outputs));
    }
    TRY(ANeuralNetworksModel_identifyInputsAndOutputs(model, subgraph->input_count, subgraph->inputs,
                                                      subgraph->output_count, subgraph->outputs));
    if (test->relaxed) TRY(ANeuralNetworksModel_relaxComputationFloat32toFloat16(model, true));
    TRY(ANeuralNetworksModel_finish(model));
    subgraph->building = 0;
    return ANEURALNETWORKS_NO_ERROR;
}

/* --- judging -------------------------------------------------------------------------------- */
static size_t element_size(int32_t type) {
    switch (type) {
        case ANEURALNETWORKS_FLOAT32: case ANEURALNETWORKS_INT32: case ANEURALNETWORKS_UINT32:
        case ANEURALNETWORKS_TENSOR_FLOAT32: case ANEURALNETWORKS_TENSOR_INT32: return 4;
        case ANEURALNETWORKS_FLOAT16: case ANEURALNETWORKS_TENSOR_FLOAT16: case ANEURALNETWORKS_TENSOR_QUANT16_SYMM:
        case ANEURALNETWORKS_TENSOR_QUANT16_ASYMM: return 2;
        default: return 1;
    }
}

static double half_to_double(uint16_t h) {
    int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    double value;
    if (exponent == 0) value = ldexp(mantissa, -24);
    else if (exponent == 31) value = mantissa ? NAN : INFINITY;
    else value = ldexp(mantissa | 0x400, exponent - 25);
    return sign ? -value : value;
}

static double element(int32_t type, const uint8_t* data, size_t i) {
    switch (type) {
        case ANEURALNETWORKS_TENSOR_FLOAT32: case ANEURALNETWORKS_FLOAT32: { float v; memcpy(&v, data + 4 * i, 4); return v; }
        case ANEURALNETWORKS_TENSOR_INT32: case ANEURALNETWORKS_INT32: { int32_t v; memcpy(&v, data + 4 * i, 4); return v; }
        case ANEURALNETWORKS_UINT32: { uint32_t v; memcpy(&v, data + 4 * i, 4); return v; }
        case ANEURALNETWORKS_TENSOR_FLOAT16: case ANEURALNETWORKS_FLOAT16: { uint16_t v; memcpy(&v, data + 2 * i, 2); return half_to_double(v); }
        case ANEURALNETWORKS_TENSOR_QUANT16_SYMM: { int16_t v; memcpy(&v, data + 2 * i, 2); return v; }
        case ANEURALNETWORKS_TENSOR_QUANT16_ASYMM: { uint16_t v; memcpy(&v, data + 2 * i, 2); return v; }
        case ANEURALNETWORKS_TENSOR_QUANT8_ASYMM_SIGNED: case ANEURALNETWORKS_TENSOR_QUANT8_SYMM:
        case ANEURALNETWORKS_TENSOR_QUANT8_SYMM_PER_CHANNEL: return (int8_t)data[i];
        default: return data[i];
    }
}

static int compare(const Test* test, const Operand* operand, const uint8_t* actual, size_t actual_size) {
    size_t size = element_size(operand->type), count = operand->size > 0 ? (size_t)operand->size / size : 0;
    if (actual_size / size != count) {
        snprintf(failure, sizeof failure, "%zu values, expected %zu", actual_size / size, count);
        return 0;
    }
    int is_float = operand->type == ANEURALNETWORKS_TENSOR_FLOAT32 || operand->type == ANEURALNETWORKS_TENSOR_FLOAT16;
    int uses_float16 = 0;
    for (uint32_t i = 0; i < test->subgraphs[0].operand_count; i++) {
        int32_t type = test->subgraphs[0].operands[i].type;
        uses_float16 |= type == ANEURALNETWORKS_TENSOR_FLOAT16 || type == ANEURALNETWORKS_FLOAT16;
    }
    double atol = 1e-5, rtol = 5 * 1.1920928955078125e-7;
    if (operand->type == ANEURALNETWORKS_TENSOR_FLOAT16 || test->relaxed || uses_float16) atol = rtol = 5 * 0.0009765625;
    int quant8 = operand->type == ANEURALNETWORKS_TENSOR_QUANT8_ASYMM || operand->type == ANEURALNETWORKS_TENSOR_QUANT8_ASYMM_SIGNED;
    double limit = quant8 && strstr(test->name, "mobilenet") ? 3 : 1;
    int is_bool = operand->type == ANEURALNETWORKS_TENSOR_BOOL8 || operand->type == ANEURALNETWORKS_BOOL;
    for (size_t i = 0; i < count; i++) {
        double got = element(operand->type, actual, i), want = element(operand->type, operand->data, i);
        int ok;
        if (is_float) ok = (isnan(got) && isnan(want)) || (isinf(want) && got == want) || fabs(got - want) <= atol + rtol * fabs(want);
        else if (is_bool) ok = (got != 0) == (want != 0);
        else ok = fabs(got - want) <= limit;
        if (!ok) {
            snprintf(failure, sizeof failure, "value %zu of %zu: got %.9g, expected %.9g", i, count, got, want);
            return 0;
        }
    }
    return 1;
}

static int multinomial_ok(const Test* test, const uint8_t* samples, size_t sample_bytes) {
    const Subgraph* main = &test->subgraphs[0];
    const Operand* logits = &main->operands[main->inputs[0]];
    size_t classes_total = (size_t)logits->size / element_size(logits->type);
    size_t batches = logits->rank ? logits->dims[0] : 1, classes = classes_total / batches;
    size_t per_batch = sample_bytes / sizeof(int32_t) / batches;
    for (size_t b = 0; b < batches; b++) {
        double max = -INFINITY, total = 0;
        for (size_t c = 0; c < classes; c++) max = fmax(max, element(logits->type, logits->data, b * classes + c));
        for (size_t c = 0; c < classes; c++) total += exp(element(logits->type, logits->data, b * classes + c) - max);
        for (size_t c = 0; c < classes; c++) {
            size_t hits = 0;
            for (size_t s = 0; s < per_batch; s++) {
                int32_t v;
                memcpy(&v, samples + 4 * (b * per_batch + s), 4);
                hits += (size_t)v == c;
            }
            double probability = exp(element(logits->type, logits->data, b * classes + c) - max) / total;
            if (fabs((double)hits / (double)per_batch - probability) > test->multinomial_tolerance) {
                snprintf(failure, sizeof failure, "batch %zu class %zu: frequency %g, probability %g", b, c,
                         (double)hits / (double)per_batch, probability);
                return 0;
            }
        }
    }
    return 1;
}

/* Runs one test: 1 if it passes. */
static int run(Test* test) {
    failure[0] = '\0';
    memory_count = 0;
    ANeuralNetworksCompilation* compilation = NULL;
    ANeuralNetworksExecution* execution = NULL;
    const Subgraph* main = &test->subgraphs[0];
    uint8_t** outputs = calloc(main->output_count + 1, sizeof(uint8_t*));
    size_t* output_sizes = calloc(main->output_count + 1, sizeof(size_t));
    int result = build(test, 0);
    if (result == ANEURALNETWORKS_NO_ERROR) result = ANeuralNetworksCompilation_create(main->model, &compilation);
    if (result == ANEURALNETWORKS_NO_ERROR) result = ANeuralNetworksCompilation_finish(compilation);
    if (result == ANEURALNETWORKS_NO_ERROR) result = ANeuralNetworksExecution_create(compilation, &execution);
    for (uint32_t i = 0; result == ANEURALNETWORKS_NO_ERROR && i < main->input_count; i++) {
        const Operand* operand = &main->operands[main->inputs[i]];
        if (operand->size < 0) {
            result = ANeuralNetworksExecution_setInput(execution, (int32_t)i, NULL, NULL, 0);
            continue;
        }
        int unknown = 0;
        for (uint32_t d = 0; d < operand->rank; d++) unknown |= operand->dims[d] == 0;
        if (unknown) { /* only 1-D inputs can be completed from the data alone */
            if (operand->rank != 1) { snprintf(failure, sizeof failure, "input with unknown shape"); result = -1; break; }
            uint32_t dims[1] = {(uint32_t)((size_t)operand->size / element_size(operand->type))};
            ANeuralNetworksOperandType type = {operand->type, 1, dims, operand->scale, operand->zero_point};
            result = ANeuralNetworksExecution_setInput(execution, (int32_t)i, &type, operand->data, (size_t)operand->size);
        } else {
            result = ANeuralNetworksExecution_setInput(execution, (int32_t)i, NULL, operand->size ? operand->data : NULL,
                                                       (size_t)operand->size);
        }
    }
    for (uint32_t i = 0; result == ANEURALNETWORKS_NO_ERROR && i < main->output_count; i++) {
        const Operand* operand = &main->operands[main->outputs[i]];
        int32_t t = operand->type;
        int is_tensor = !(t == ANEURALNETWORKS_FLOAT32 || t == ANEURALNETWORKS_INT32 || t == ANEURALNETWORKS_UINT32 ||
                          t == ANEURALNETWORKS_BOOL || t == ANEURALNETWORKS_FLOAT16);
        size_t count = 1;
        int specified = !is_tensor || operand->rank > 0;
        for (uint32_t d = 0; is_tensor && d < operand->rank; d++) {
            count *= operand->dims[d];
            specified &= operand->dims[d] != 0;
        }
        size_t bytes = specified ? count * element_size(operand->type) : (size_t)(operand->size > 0 ? operand->size : 0);
        output_sizes[i] = bytes;
        outputs[i] = aligned_alloc(64, (bytes + 64) / 64 * 64);
        memset(outputs[i], 0, bytes);
        result = ANeuralNetworksExecution_setOutput(execution, (int32_t)i, NULL, bytes ? outputs[i] : NULL, bytes);
    }
    if (result == ANEURALNETWORKS_NO_ERROR) result = ANeuralNetworksExecution_compute(execution);
    if (result != ANEURALNETWORKS_NO_ERROR && failure[0] == '\0')
        snprintf(failure, sizeof failure, "error %d: %s", result, nnapi_capi_last_error());
    int passed;
    if (test->expect_failure) {
        passed = result != ANEURALNETWORKS_NO_ERROR;
        if (passed) failure[0] = '\0'; else snprintf(failure, sizeof failure, "expected a failure, but it succeeded");
    } else if (result != ANEURALNETWORKS_NO_ERROR) {
        passed = 0;
    } else if (test->multinomial_tolerance > 0) {
        passed = multinomial_ok(test, outputs[0], output_sizes[0]);
    } else {
        passed = 1;
        for (uint32_t i = 0; passed && i < main->output_count; i++) {
            const Operand* operand = &main->operands[main->outputs[i]];
            if (!operand->ignored) passed = compare(test, operand, outputs[i], output_sizes[i]);
        }
    }
    ANeuralNetworksExecution_free(execution);
    ANeuralNetworksCompilation_free(compilation);
    for (int i = 0; i < memory_count; i++) ANeuralNetworksMemory_free(memories[i]);
    for (uint32_t i = 0; i < main->output_count; i++) free(outputs[i]);
    free(outputs);
    free(output_sizes);
    return passed;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s VECTORS.txt [-v]\n", argv[0]);
        return 2;
    }
    int verbose = argc > 2 && strcmp(argv[2], "-v") == 0;
    FILE* file = fopen(argv[1], "r");
    if (!file) {
        perror(argv[1]);
        return 2;
    }
    char* line = NULL;
    size_t capacity = 0;
    int passed = 0, failed = 0;
    Test test;
    while (memset(&test, 0, sizeof test), read_test(file, &test, &line, &capacity)) {
        if (run(&test)) {
            passed++;
            if (verbose) printf("PASS %s\n", test.name);
        } else {
            failed++;
            printf("FAIL %s: %s\n", test.name, failure);
        }
        fflush(stdout);
        free_test(&test);
    }
    free(line);
    fclose(file);
    printf("SUMMARY passed %d failed %d\n", passed, failed);
    return failed ? 1 : 0;
}
