/* A small CNN (CONV_2D + RELU, AVERAGE_POOL_2D, RESHAPE, FULLY_CONNECTED, SOFTMAX) built
 * and run through the C API only, checked against a plain C computation.
 * Also checks setOperandValue's ownership rule: values of at most 128 bytes are copied,
 * larger ones stay in the caller's memory (a later change is seen by the compilation). */
#include "capi_test.h"

#define H 6
#define W 6
#define FILTERS 2
#define POOLED 3
#define FLAT (POOLED * POOLED * FILTERS)
#define CLASSES 10

static float conv_w[FILTERS][3][3][1];
static float conv_b[FILTERS];
static float fc_w[CLASSES][FLAT];   /* 720 bytes: referenced, not copied */
static float fc_b[CLASSES];

static void reference(const float* x, const float* fcw, float* y) {
    float conv[H][W][FILTERS], pooled[FLAT], logits[CLASSES];
    for (int i = 0; i < H; i++)
        for (int j = 0; j < W; j++)
            for (int f = 0; f < FILTERS; f++) {
                float sum = conv_b[f];
                for (int di = -1; di <= 1; di++)
                    for (int dj = -1; dj <= 1; dj++) {
                        int ii = i + di, jj = j + dj;
                        if (ii >= 0 && ii < H && jj >= 0 && jj < W) sum += x[ii * W + jj] * conv_w[f][di + 1][dj + 1][0];
                    }
                conv[i][j][f] = sum > 0 ? sum : 0;
            }
    for (int i = 0; i < POOLED; i++)
        for (int j = 0; j < POOLED; j++)
            for (int f = 0; f < FILTERS; f++)
                pooled[(i * POOLED + j) * FILTERS + f] = (conv[2 * i][2 * j][f] + conv[2 * i + 1][2 * j][f] +
                                                          conv[2 * i][2 * j + 1][f] + conv[2 * i + 1][2 * j + 1][f]) / 4;
    float max = -1e30f, total = 0;
    for (int c = 0; c < CLASSES; c++) {
        logits[c] = fc_b[c];
        for (int k = 0; k < FLAT; k++) logits[c] += pooled[k] * fcw[c * FLAT + k];
        if (logits[c] > max) max = logits[c];
    }
    for (int c = 0; c < CLASSES; c++) total += (y[c] = expf(logits[c] - max));
    for (int c = 0; c < CLASSES; c++) y[c] /= total;
}

int main(void) {
    unsigned seed = 12345;
#define NEXT() ((float)((seed = seed * 1103515245u + 12345u) >> 16 & 0x7fff) / 32768.0f - 0.5f)
    for (int f = 0; f < FILTERS; f++) {
        conv_b[f] = NEXT();
        for (int i = 0; i < 9; i++) conv_w[f][i / 3][i % 3][0] = NEXT();
    }
    for (int c = 0; c < CLASSES; c++) {
        fc_b[c] = NEXT();
        for (int k = 0; k < FLAT; k++) fc_w[c][k] = NEXT();
    }

    ANeuralNetworksModel* model = NULL;
    CHECK(ANeuralNetworksModel_create(&model));
    uint32_t n = 0;
    uint32_t x_dims[4] = {1, H, W, 1}, cw_dims[4] = {FILTERS, 3, 3, 1}, cb_dims[1] = {FILTERS};
    uint32_t c_dims[4] = {1, H, W, FILTERS}, p_dims[4] = {1, POOLED, POOLED, FILTERS};
    uint32_t shape_dims[1] = {2}, r_dims[2] = {1, FLAT}, fw_dims[2] = {CLASSES, FLAT}, fb_dims[1] = {CLASSES};
    uint32_t y_dims[2] = {1, CLASSES};
    uint32_t x = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 4, x_dims));
    uint32_t cw = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 4, cw_dims));
    uint32_t cb = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, cb_dims));
    CHECK(ANeuralNetworksModel_setOperandValue(model, cw, conv_w, sizeof conv_w));
    CHECK(ANeuralNetworksModel_setOperandValue(model, cb, conv_b, sizeof conv_b));
    uint32_t same = add_int32(model, &n, ANEURALNETWORKS_PADDING_SAME), one = add_int32(model, &n, 1);
    uint32_t relu = add_int32(model, &n, ANEURALNETWORKS_FUSED_RELU);
    uint32_t c = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 4, c_dims));
    uint32_t conv_in[7] = {x, cw, cb, same, one, one, relu};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_CONV_2D, 7, conv_in, 1, &c));

    uint32_t valid = add_int32(model, &n, ANEURALNETWORKS_PADDING_VALID), two = add_int32(model, &n, 2);
    uint32_t none = add_int32(model, &n, ANEURALNETWORKS_FUSED_NONE);
    uint32_t p = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 4, p_dims));
    uint32_t pool_in[7] = {c, valid, two, two, two, two, none};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_AVERAGE_POOL_2D, 7, pool_in, 1, &p));

    uint32_t shape = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_INT32, 1, shape_dims));
    int32_t shape_value[2] = {1, FLAT};
    CHECK(ANeuralNetworksModel_setOperandValue(model, shape, shape_value, sizeof shape_value));
    uint32_t r = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, r_dims));
    uint32_t reshape_in[2] = {p, shape};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_RESHAPE, 2, reshape_in, 1, &r));

    uint32_t fw = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, fw_dims));
    uint32_t fb = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 1, fb_dims));
    CHECK(ANeuralNetworksModel_setOperandValue(model, fw, fc_w, sizeof fc_w));
    CHECK(ANeuralNetworksModel_setOperandValue(model, fb, fc_b, sizeof fc_b));
    uint32_t f = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, y_dims));
    uint32_t fc_in[4] = {r, fw, fb, none};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_FULLY_CONNECTED, 4, fc_in, 1, &f));

    uint32_t beta = add_float32(model, &n, 1.0f);
    uint32_t y = add_operand(model, &n, tensor_type(ANEURALNETWORKS_TENSOR_FLOAT32, 2, y_dims));
    uint32_t softmax_in[2] = {f, beta};
    CHECK(ANeuralNetworksModel_addOperation(model, ANEURALNETWORKS_SOFTMAX, 2, softmax_in, 1, &y));
    CHECK(ANeuralNetworksModel_identifyInputsAndOutputs(model, 1, &x, 1, &y));
    CHECK(ANeuralNetworksModel_finish(model));

    /* After setOperandValue: the 8-byte bias was copied (this change is not seen), the
     * 720-byte weights are referenced (this change is). */
    float original_bias = conv_b[0];
    conv_b[0] += 100.0f;
    float fc_w_used[CLASSES * FLAT];
    for (int i = 0; i < CLASSES * FLAT; i++) fc_w_used[i] = (((float*)fc_w)[i] *= 2.0f);

    ANeuralNetworksCompilation* compilation = NULL;
    CHECK(ANeuralNetworksCompilation_create(model, &compilation));
    CHECK(ANeuralNetworksCompilation_setPreference(compilation, ANEURALNETWORKS_PREFER_SUSTAINED_SPEED));
    CHECK(ANeuralNetworksCompilation_finish(compilation));
    conv_b[0] = original_bias;

    for (int run = 0; run < 3; run++) {
        float input[H * W], output[CLASSES], expected[CLASSES];
        for (int i = 0; i < H * W; i++) input[i] = 2.0f * NEXT();
        for (int i = 0; i < CLASSES; i++) output[i] = -1.0f;
        ANeuralNetworksExecution* execution = NULL;
        CHECK(ANeuralNetworksExecution_create(compilation, &execution));
        CHECK(ANeuralNetworksExecution_setInput(execution, 0, NULL, input, sizeof input));
        CHECK(ANeuralNetworksExecution_setOutput(execution, 0, NULL, output, sizeof output));
        CHECK(ANeuralNetworksExecution_compute(execution));
        uint32_t rank = 0, dims[2] = {0, 0};
        CHECK(ANeuralNetworksExecution_getOutputOperandRank(execution, 0, &rank));
        CHECK(ANeuralNetworksExecution_getOutputOperandDimensions(execution, 0, dims));
        EXPECT(rank == 2 && dims[0] == 1 && dims[1] == CLASSES);
        ANeuralNetworksExecution_free(execution);
        reference(input, fc_w_used, expected);
        expect_close("softmax", output, expected, CLASSES, 1e-5f);
    }
    ANeuralNetworksCompilation_free(compilation);
    ANeuralNetworksModel_free(model);
    done("cnn");
    return 0;
}
