// The C API from C++: RAII owners for the NDK handles, std::vector buffers, std::thread
// workers sharing one compilation. y = TRANSPOSE(CONCATENATION(a, b, axis 1)).
#include <android/NeuralNetworks.h>
#include <nnapi/capi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

void check(int result, const char* what) {
    if (result != ANEURALNETWORKS_NO_ERROR)
        throw std::runtime_error(std::string(what) + " returned " + std::to_string(result) + ": " +
                                 nnapi_capi_last_error());
}

struct ModelDeleter { void operator()(ANeuralNetworksModel* m) const { ANeuralNetworksModel_free(m); } };
struct CompilationDeleter {
    void operator()(ANeuralNetworksCompilation* c) const { ANeuralNetworksCompilation_free(c); }
};
struct ExecutionDeleter { void operator()(ANeuralNetworksExecution* e) const { ANeuralNetworksExecution_free(e); } };
using Model = std::unique_ptr<ANeuralNetworksModel, ModelDeleter>;
using Compilation = std::unique_ptr<ANeuralNetworksCompilation, CompilationDeleter>;
using Execution = std::unique_ptr<ANeuralNetworksExecution, ExecutionDeleter>;

constexpr uint32_t kRows = 3, kColsA = 2, kColsB = 4, kCols = kColsA + kColsB;

Model build() {
    ANeuralNetworksModel* raw = nullptr;
    check(ANeuralNetworksModel_create(&raw), "Model_create");
    Model model(raw);
    uint32_t a_dims[] = {kRows, kColsA}, b_dims[] = {kRows, kColsB}, c_dims[] = {kRows, kCols};
    uint32_t y_dims[] = {kCols, kRows}, perm_dims[] = {2};
    const ANeuralNetworksOperandType types[] = {
        {ANEURALNETWORKS_TENSOR_FLOAT32, 2, a_dims, 0.0f, 0},  // 0: a
        {ANEURALNETWORKS_TENSOR_FLOAT32, 2, b_dims, 0.0f, 0},  // 1: b
        {ANEURALNETWORKS_INT32, 0, nullptr, 0.0f, 0},          // 2: axis
        {ANEURALNETWORKS_TENSOR_FLOAT32, 2, c_dims, 0.0f, 0},  // 3: concatenated
        {ANEURALNETWORKS_TENSOR_INT32, 1, perm_dims, 0.0f, 0}, // 4: permutation
        {ANEURALNETWORKS_TENSOR_FLOAT32, 2, y_dims, 0.0f, 0},  // 5: y
    };
    for (const auto& type : types) check(ANeuralNetworksModel_addOperand(model.get(), &type), "addOperand");
    const int32_t axis = 1;
    const std::vector<int32_t> permutation = {1, 0};
    check(ANeuralNetworksModel_setOperandValue(model.get(), 2, &axis, sizeof axis), "setOperandValue");
    check(ANeuralNetworksModel_setOperandValue(model.get(), 4, permutation.data(),
                                               permutation.size() * sizeof(int32_t)), "setOperandValue");
    const std::vector<uint32_t> concat_in = {0, 1, 2}, transpose_in = {3, 4}, inputs = {0, 1};
    const uint32_t concat_out = 3, y = 5;
    check(ANeuralNetworksModel_addOperation(model.get(), ANEURALNETWORKS_CONCATENATION, 3, concat_in.data(), 1,
                                            &concat_out), "addOperation");
    check(ANeuralNetworksModel_addOperation(model.get(), ANEURALNETWORKS_TRANSPOSE, 2, transpose_in.data(), 1, &y),
          "addOperation");
    check(ANeuralNetworksModel_identifyInputsAndOutputs(model.get(), 2, inputs.data(), 1, &y), "identify");
    check(ANeuralNetworksModel_finish(model.get()), "Model_finish");
    return model;
}

void run(ANeuralNetworksCompilation* compilation, int seed) {
    std::vector<float> a(kRows * kColsA), b(kRows * kColsB), y(kCols * kRows, -1.0f);
    for (size_t i = 0; i < a.size(); i++) a[i] = static_cast<float>(seed * 100 + static_cast<int>(i));
    for (size_t i = 0; i < b.size(); i++) b[i] = static_cast<float>(-seed * 100 - static_cast<int>(i));
    ANeuralNetworksExecution* raw = nullptr;
    check(ANeuralNetworksExecution_create(compilation, &raw), "Execution_create");
    Execution execution(raw);
    check(ANeuralNetworksExecution_setInput(execution.get(), 0, nullptr, a.data(), a.size() * sizeof(float)), "in0");
    check(ANeuralNetworksExecution_setInput(execution.get(), 1, nullptr, b.data(), b.size() * sizeof(float)), "in1");
    check(ANeuralNetworksExecution_setOutput(execution.get(), 0, nullptr, y.data(), y.size() * sizeof(float)), "out");
    check(ANeuralNetworksExecution_compute(execution.get()), "compute");
    for (uint32_t col = 0; col < kCols; col++)
        for (uint32_t row = 0; row < kRows; row++) {
            const float expected = col < kColsA ? a[row * kColsA + col] : b[row * kColsB + (col - kColsA)];
            if (y[col * kRows + row] != expected)
                throw std::runtime_error("y[" + std::to_string(col) + "][" + std::to_string(row) + "] = " +
                                         std::to_string(y[col * kRows + row]) + ", expected " +
                                         std::to_string(expected));
        }
}

}  // namespace

int main() {
    try {
        Model model = build();
        ANeuralNetworksCompilation* raw = nullptr;
        check(ANeuralNetworksCompilation_create(model.get(), &raw), "Compilation_create");
        Compilation compilation(raw);
        check(ANeuralNetworksCompilation_finish(compilation.get()), "Compilation_finish");
        std::vector<std::thread> workers;
        std::vector<std::string> errors(3);
        for (int t = 0; t < 3; t++)
            workers.emplace_back([&, t] {
                try {
                    for (int i = 0; i < 10; i++) run(compilation.get(), t * 10 + i);
                } catch (const std::exception& error) {
                    errors[t] = error.what();
                }
            });
        for (auto& worker : workers) worker.join();
        for (const auto& error : errors)
            if (!error.empty()) throw std::runtime_error(error);
    } catch (const std::exception& error) {
        std::printf("FAIL %s\n", error.what());
        return 1;
    }
    std::printf("PASS cpp_api\n");
    return 0;
}
