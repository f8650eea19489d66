"""The C signatures of every ANeuralNetworks* function of feature level 8, as the NDK
declares them (NeuralNetworks.h, and NeuralNetworksExtensions.h for vendor extensions).
One table drives the generated headers, the cffi embedding declarations and the C entry
points, so the three cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: (feature level the function appeared in, C prototype)
_PROTOTYPES: tuple[tuple[int, str], ...] = (
    # --- devices (feature level 3) ---
    (29, "int ANeuralNetworks_getDeviceCount(uint32_t* numDevices)"),
    (29, "int ANeuralNetworks_getDevice(uint32_t devIndex, ANeuralNetworksDevice** device)"),
    (29, "int ANeuralNetworksDevice_getName(const ANeuralNetworksDevice* device, const char** name)"),
    (29, "int ANeuralNetworksDevice_getType(const ANeuralNetworksDevice* device, int32_t* type)"),
    (29, "int ANeuralNetworksDevice_getVersion(const ANeuralNetworksDevice* device, const char** version)"),
    (29, "int ANeuralNetworksDevice_getFeatureLevel(const ANeuralNetworksDevice* device, int64_t* featureLevel)"),
    (30, "int ANeuralNetworksDevice_wait(const ANeuralNetworksDevice* device)"),
    (29, "int ANeuralNetworksModel_getSupportedOperationsForDevices(const ANeuralNetworksModel* model, "
         "const ANeuralNetworksDevice* const* devices, uint32_t numDevices, bool* supportedOps)"),
    (29, "int ANeuralNetworksCompilation_createForDevices(ANeuralNetworksModel* model, "
         "const ANeuralNetworksDevice* const* devices, uint32_t numDevices, "
         "ANeuralNetworksCompilation** compilation)"),
    (29, "int ANeuralNetworksCompilation_setCaching(ANeuralNetworksCompilation* compilation, "
         "const char* cacheDir, const uint8_t* token)"),
    (29, "int ANeuralNetworksExecution_compute(ANeuralNetworksExecution* execution)"),
    (29, "int ANeuralNetworksExecution_getOutputOperandRank(ANeuralNetworksExecution* execution, "
         "int32_t index, uint32_t* rank)"),
    (29, "int ANeuralNetworksExecution_getOutputOperandDimensions(ANeuralNetworksExecution* execution, "
         "int32_t index, uint32_t* dimensions)"),
    (29, "int ANeuralNetworksBurst_create(ANeuralNetworksCompilation* compilation, ANeuralNetworksBurst** burst)"),
    (29, "void ANeuralNetworksBurst_free(ANeuralNetworksBurst* burst)"),
    (29, "int ANeuralNetworksExecution_burstCompute(ANeuralNetworksExecution* execution, "
         "ANeuralNetworksBurst* burst)"),
    (29, "int ANeuralNetworksMemory_createFromAHardwareBuffer(const AHardwareBuffer* ahwb, "
         "ANeuralNetworksMemory** memory)"),
    (29, "int ANeuralNetworksExecution_setMeasureTiming(ANeuralNetworksExecution* execution, bool measure)"),
    (29, "int ANeuralNetworksExecution_getDuration(const ANeuralNetworksExecution* execution, "
         "int32_t durationCode, uint64_t* duration)"),
    # --- memory (feature level 1, 4) ---
    (27, "int ANeuralNetworksMemory_createFromFd(size_t size, int protect, int fd, size_t offset, "
         "ANeuralNetworksMemory** memory)"),
    (27, "void ANeuralNetworksMemory_free(ANeuralNetworksMemory* memory)"),
    (30, "int ANeuralNetworksMemoryDesc_create(ANeuralNetworksMemoryDesc** desc)"),
    (30, "void ANeuralNetworksMemoryDesc_free(ANeuralNetworksMemoryDesc* desc)"),
    (30, "int ANeuralNetworksMemoryDesc_addInputRole(ANeuralNetworksMemoryDesc* desc, "
         "const ANeuralNetworksCompilation* compilation, uint32_t index, float frequency)"),
    (30, "int ANeuralNetworksMemoryDesc_addOutputRole(ANeuralNetworksMemoryDesc* desc, "
         "const ANeuralNetworksCompilation* compilation, uint32_t index, float frequency)"),
    (30, "int ANeuralNetworksMemoryDesc_setDimensions(ANeuralNetworksMemoryDesc* desc, uint32_t rank, "
         "const uint32_t* dimensions)"),
    (30, "int ANeuralNetworksMemoryDesc_finish(ANeuralNetworksMemoryDesc* desc)"),
    (30, "int ANeuralNetworksMemory_createFromDesc(const ANeuralNetworksMemoryDesc* desc, "
         "ANeuralNetworksMemory** memory)"),
    (30, "int ANeuralNetworksMemory_copy(const ANeuralNetworksMemory* src, const ANeuralNetworksMemory* dst)"),
    # --- model (feature level 1) ---
    (27, "int ANeuralNetworksModel_create(ANeuralNetworksModel** model)"),
    (27, "void ANeuralNetworksModel_free(ANeuralNetworksModel* model)"),
    (27, "int ANeuralNetworksModel_finish(ANeuralNetworksModel* model)"),
    (27, "int ANeuralNetworksModel_addOperand(ANeuralNetworksModel* model, const ANeuralNetworksOperandType* type)"),
    (27, "int ANeuralNetworksModel_setOperandValue(ANeuralNetworksModel* model, int32_t index, "
         "const void* buffer, size_t length)"),
    (29, "int ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(ANeuralNetworksModel* model, "
         "int32_t index, const ANeuralNetworksSymmPerChannelQuantParams* channelQuant)"),
    (27, "int ANeuralNetworksModel_setOperandValueFromMemory(ANeuralNetworksModel* model, int32_t index, "
         "const ANeuralNetworksMemory* memory, size_t offset, size_t length)"),
    (30, "int ANeuralNetworksModel_setOperandValueFromModel(ANeuralNetworksModel* model, int32_t index, "
         "const ANeuralNetworksModel* value)"),
    (27, "int ANeuralNetworksModel_addOperation(ANeuralNetworksModel* model, ANeuralNetworksOperationType type, "
         "uint32_t inputCount, const uint32_t* inputs, uint32_t outputCount, const uint32_t* outputs)"),
    (27, "int ANeuralNetworksModel_identifyInputsAndOutputs(ANeuralNetworksModel* model, uint32_t inputCount, "
         "const uint32_t* inputs, uint32_t outputCount, const uint32_t* outputs)"),
    (28, "int ANeuralNetworksModel_relaxComputationFloat32toFloat16(ANeuralNetworksModel* model, bool allow)"),
    # --- compilation (feature level 1) ---
    (27, "int ANeuralNetworksCompilation_create(ANeuralNetworksModel* model, "
         "ANeuralNetworksCompilation** compilation)"),
    (27, "void ANeuralNetworksCompilation_free(ANeuralNetworksCompilation* compilation)"),
    (27, "int ANeuralNetworksCompilation_setPreference(ANeuralNetworksCompilation* compilation, int32_t preference)"),
    (27, "int ANeuralNetworksCompilation_finish(ANeuralNetworksCompilation* compilation)"),
    (30, "int ANeuralNetworksCompilation_setPriority(ANeuralNetworksCompilation* compilation, int priority)"),
    (30, "int ANeuralNetworksCompilation_setTimeout(ANeuralNetworksCompilation* compilation, uint64_t duration)"),
    (31, "int ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput("
         "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* alignment)"),
    (31, "int ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput("
         "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* padding)"),
    (31, "int ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput("
         "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* alignment)"),
    (31, "int ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput("
         "const ANeuralNetworksCompilation* compilation, uint32_t index, uint32_t* padding)"),
    # --- execution (feature level 1) ---
    (27, "int ANeuralNetworksExecution_create(ANeuralNetworksCompilation* compilation, "
         "ANeuralNetworksExecution** execution)"),
    (27, "void ANeuralNetworksExecution_free(ANeuralNetworksExecution* execution)"),
    (27, "int ANeuralNetworksExecution_setInput(ANeuralNetworksExecution* execution, int32_t index, "
         "const ANeuralNetworksOperandType* type, const void* buffer, size_t length)"),
    (27, "int ANeuralNetworksExecution_setInputFromMemory(ANeuralNetworksExecution* execution, int32_t index, "
         "const ANeuralNetworksOperandType* type, const ANeuralNetworksMemory* memory, size_t offset, "
         "size_t length)"),
    (27, "int ANeuralNetworksExecution_setOutput(ANeuralNetworksExecution* execution, int32_t index, "
         "const ANeuralNetworksOperandType* type, void* buffer, size_t length)"),
    (27, "int ANeuralNetworksExecution_setOutputFromMemory(ANeuralNetworksExecution* execution, int32_t index, "
         "const ANeuralNetworksOperandType* type, const ANeuralNetworksMemory* memory, size_t offset, "
         "size_t length)"),
    (27, "int ANeuralNetworksExecution_startCompute(ANeuralNetworksExecution* execution, "
         "ANeuralNetworksEvent** event)"),
    (30, "int ANeuralNetworksExecution_setTimeout(ANeuralNetworksExecution* execution, uint64_t duration)"),
    (30, "int ANeuralNetworksExecution_setLoopTimeout(ANeuralNetworksExecution* execution, uint64_t duration)"),
    (30, "uint64_t ANeuralNetworks_getDefaultLoopTimeout(void)"),
    (30, "uint64_t ANeuralNetworks_getMaximumLoopTimeout(void)"),
    (27, "int ANeuralNetworksEvent_wait(ANeuralNetworksEvent* event)"),
    (27, "void ANeuralNetworksEvent_free(ANeuralNetworksEvent* event)"),
    (30, "int ANeuralNetworksEvent_createFromSyncFenceFd(int sync_fence_fd, ANeuralNetworksEvent** event)"),
    (30, "int ANeuralNetworksEvent_getSyncFenceFd(const ANeuralNetworksEvent* event, int* sync_fence_fd)"),
    (30, "int ANeuralNetworksExecution_startComputeWithDependencies(ANeuralNetworksExecution* execution, "
         "const ANeuralNetworksEvent* const* dependencies, uint32_t num_dependencies, uint64_t duration, "
         "ANeuralNetworksEvent** event)"),
    (31, "int64_t ANeuralNetworks_getRuntimeFeatureLevel(void)"),
    (31, "int ANeuralNetworksExecution_enableInputAndOutputPadding(ANeuralNetworksExecution* execution, "
         "bool enable)"),
    (31, "int ANeuralNetworksExecution_setReusable(ANeuralNetworksExecution* execution, bool reusable)"),
)

#: NeuralNetworksExtensions.h: vendor extensions (feature level 3), declared in their own
#: header as Android does.
_EXTENSION_PROTOTYPES: tuple[tuple[int, str], ...] = (
    (29, "int ANeuralNetworksDevice_getExtensionSupport(const ANeuralNetworksDevice* device, "
         "const char* extensionName, bool* isExtensionSupported)"),
    (29, "int ANeuralNetworksModel_getExtensionOperandType(ANeuralNetworksModel* model, "
         "const char* extensionName, uint16_t operandCodeWithinExtension, int32_t* type)"),
    (29, "int ANeuralNetworksModel_getExtensionOperationType(ANeuralNetworksModel* model, "
         "const char* extensionName, uint16_t operationCodeWithinExtension, ANeuralNetworksOperationType* type)"),
    (29, "int ANeuralNetworksModel_setOperandExtensionData(ANeuralNetworksModel* model, int32_t index, "
         "const void* data, size_t length)"),
)

#: The header each table's functions are declared in (under android/).
MAIN_HEADER = "NeuralNetworks.h"
EXTENSIONS_HEADER = "NeuralNetworksExtensions.h"


@dataclass(frozen=True)
class Function:
    """One C function: ``result name(params)``."""

    api_level: int
    result: str
    name: str
    params: tuple[tuple[str, str], ...]  # (C type, parameter name)
    header: str = MAIN_HEADER  # the android/ header that declares it

    @property
    def prototype(self) -> str:
        return f"{self.result} {self.name}({self.parameter_list})"

    @property
    def parameter_list(self) -> str:
        return ", ".join(f"{ctype} {pname}" for ctype, pname in self.params) or "void"

    @property
    def argument_list(self) -> str:
        return ", ".join(pname for _, pname in self.params)


_PROTOTYPE = re.compile(r"^(?P<result>[\w ]+?\**)\s*(?P<name>ANeuralNetworks\w+)\((?P<params>.*)\)$")


def _parse(api_level: int, text: str, header: str = MAIN_HEADER) -> Function:
    match = _PROTOTYPE.match(text)
    if match is None:
        raise ValueError(f"not a prototype: {text}")
    params: list[tuple[str, str]] = []
    body = match["params"].strip()
    if body and body != "void":
        for param in body.split(","):
            ctype, _, pname = param.strip().rpartition(" ")
            ctype += "*" * (len(pname) - len(pname.lstrip("*")))
            params.append((ctype.strip(), pname.lstrip("*")))
    return Function(api_level, match["result"].strip(), match["name"], tuple(params), header)


#: Every ANeuralNetworks* function of feature level 8 (NeuralNetworks.h, then
#: NeuralNetworksExtensions.h), in the tables' order.
FUNCTIONS: tuple[Function, ...] = (tuple(_parse(level, text) for level, text in _PROTOTYPES)
                                   + tuple(_parse(level, text, EXTENSIONS_HEADER)
                                           for level, text in _EXTENSION_PROTOTYPES))

#: The opaque object types of the NDK.
OPAQUE_TYPES = ("ANeuralNetworksMemory", "ANeuralNetworksModel", "ANeuralNetworksCompilation",
                "ANeuralNetworksExecution", "ANeuralNetworksBurst", "ANeuralNetworksEvent",
                "ANeuralNetworksDevice", "ANeuralNetworksMemoryDesc")

#: The structures of the NDK, field by field.
STRUCTS = """\
typedef struct ANeuralNetworksOperandType {
    int32_t type;
    uint32_t dimensionCount;
    const uint32_t* dimensions;
    float scale;
    int32_t zeroPoint;
} ANeuralNetworksOperandType;

typedef struct ANeuralNetworksSymmPerChannelQuantParams {
    uint32_t channelDim;
    uint32_t scaleCount;
    const float* scales;
} ANeuralNetworksSymmPerChannelQuantParams;
"""
