"""Every enum and constant of the NNAPI NDK (NeuralNetworksTypes.h), with its exact value.

Names drop the ``ANEURALNETWORKS_`` prefix: ``ANEURALNETWORKS_TENSOR_FLOAT32`` is
``OperandCode.TENSOR_FLOAT32``.
"""

from __future__ import annotations

from enum import IntEnum

#: ANEURALNETWORKS_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES
MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES = 128
#: ANEURALNETWORKS_BYTE_SIZE_OF_CACHE_TOKEN
BYTE_SIZE_OF_CACHE_TOKEN = 32
#: Android's WHILE loop timeouts (ANeuralNetworks_getDefaultLoopTimeout and
#: ANeuralNetworks_getMaximumLoopTimeout), in nanoseconds
DEFAULT_LOOP_TIMEOUT_NS = 2_000_000_000
MAXIMUM_LOOP_TIMEOUT_NS = 15_000_000_000


class DeviceTypeCode(IntEnum):
    DEVICE_UNKNOWN = 0
    DEVICE_OTHER = 1
    DEVICE_CPU = 2
    DEVICE_GPU = 3
    DEVICE_ACCELERATOR = 4


class DurationCode(IntEnum):
    DURATION_ON_HARDWARE = 0
    DURATION_IN_DRIVER = 1
    FENCED_DURATION_ON_HARDWARE = 2
    FENCED_DURATION_IN_DRIVER = 3


class FeatureLevelCode(IntEnum):
    FEATURE_LEVEL_1 = 27
    FEATURE_LEVEL_2 = 28
    FEATURE_LEVEL_3 = 29
    FEATURE_LEVEL_4 = 30
    FEATURE_LEVEL_5 = 31
    FEATURE_LEVEL_6 = 1000006
    FEATURE_LEVEL_7 = 1000007
    FEATURE_LEVEL_8 = 1000008


class FuseCode(IntEnum):
    FUSED_NONE = 0
    FUSED_RELU = 1
    FUSED_RELU1 = 2
    FUSED_RELU6 = 3


class OperandCode(IntEnum):
    FLOAT32 = 0
    INT32 = 1
    UINT32 = 2
    TENSOR_FLOAT32 = 3
    TENSOR_INT32 = 4
    TENSOR_QUANT8_ASYMM = 5
    BOOL = 6
    TENSOR_QUANT16_SYMM = 7
    TENSOR_FLOAT16 = 8
    TENSOR_BOOL8 = 9
    FLOAT16 = 10
    TENSOR_QUANT8_SYMM_PER_CHANNEL = 11
    TENSOR_QUANT16_ASYMM = 12
    TENSOR_QUANT8_SYMM = 13
    TENSOR_QUANT8_ASYMM_SIGNED = 14
    MODEL = 15


class OperationCode(IntEnum):
    ADD = 0
    AVERAGE_POOL_2D = 1
    CONCATENATION = 2
    CONV_2D = 3
    DEPTHWISE_CONV_2D = 4
    DEPTH_TO_SPACE = 5
    DEQUANTIZE = 6
    EMBEDDING_LOOKUP = 7
    FLOOR = 8
    FULLY_CONNECTED = 9
    HASHTABLE_LOOKUP = 10
    L2_NORMALIZATION = 11
    L2_POOL_2D = 12
    LOCAL_RESPONSE_NORMALIZATION = 13
    LOGISTIC = 14
    LSH_PROJECTION = 15
    LSTM = 16
    MAX_POOL_2D = 17
    MUL = 18
    RELU = 19
    RELU1 = 20
    RELU6 = 21
    RESHAPE = 22
    RESIZE_BILINEAR = 23
    RNN = 24
    SOFTMAX = 25
    SPACE_TO_DEPTH = 26
    SVDF = 27
    TANH = 28
    BATCH_TO_SPACE_ND = 29
    DIV = 30
    MEAN = 31
    PAD = 32
    SPACE_TO_BATCH_ND = 33
    SQUEEZE = 34
    STRIDED_SLICE = 35
    SUB = 36
    TRANSPOSE = 37
    ABS = 38
    ARGMAX = 39
    ARGMIN = 40
    AXIS_ALIGNED_BBOX_TRANSFORM = 41
    BIDIRECTIONAL_SEQUENCE_LSTM = 42
    BIDIRECTIONAL_SEQUENCE_RNN = 43
    BOX_WITH_NMS_LIMIT = 44
    CAST = 45
    CHANNEL_SHUFFLE = 46
    DETECTION_POSTPROCESSING = 47
    EQUAL = 48
    EXP = 49
    EXPAND_DIMS = 50
    GATHER = 51
    GENERATE_PROPOSALS = 52
    GREATER = 53
    GREATER_EQUAL = 54
    GROUPED_CONV_2D = 55
    HEATMAP_MAX_KEYPOINT = 56
    INSTANCE_NORMALIZATION = 57
    LESS = 58
    LESS_EQUAL = 59
    LOG = 60
    LOGICAL_AND = 61
    LOGICAL_NOT = 62
    LOGICAL_OR = 63
    LOG_SOFTMAX = 64
    MAXIMUM = 65
    MINIMUM = 66
    NEG = 67
    NOT_EQUAL = 68
    PAD_V2 = 69
    POW = 70
    PRELU = 71
    QUANTIZE = 72
    QUANTIZED_16BIT_LSTM = 73
    RANDOM_MULTINOMIAL = 74
    REDUCE_ALL = 75
    REDUCE_ANY = 76
    REDUCE_MAX = 77
    REDUCE_MIN = 78
    REDUCE_PROD = 79
    REDUCE_SUM = 80
    ROI_ALIGN = 81
    ROI_POOLING = 82
    RSQRT = 83
    SELECT = 84
    SIN = 85
    SLICE = 86
    SPLIT = 87
    SQRT = 88
    TILE = 89
    TOPK_V2 = 90
    TRANSPOSE_CONV_2D = 91
    UNIDIRECTIONAL_SEQUENCE_LSTM = 92
    UNIDIRECTIONAL_SEQUENCE_RNN = 93
    RESIZE_NEAREST_NEIGHBOR = 94
    QUANTIZED_LSTM = 95
    IF = 96
    WHILE = 97
    ELU = 98
    HARD_SWISH = 99
    FILL = 100
    RANK = 101
    BATCH_MATMUL = 102
    PACK = 103
    MIRROR_PAD = 104
    REVERSE = 105


class PaddingCode(IntEnum):
    PADDING_SAME = 1
    PADDING_VALID = 2


class PreferenceCode(IntEnum):
    PREFER_LOW_POWER = 0
    PREFER_FAST_SINGLE_ANSWER = 1
    PREFER_SUSTAINED_SPEED = 2


class PriorityCode(IntEnum):
    PRIORITY_LOW = 90
    PRIORITY_MEDIUM = 100
    PRIORITY_HIGH = 110
    PRIORITY_DEFAULT = 100  # an alias of PRIORITY_MEDIUM, as in the NDK


class ResultCode(IntEnum):
    NO_ERROR = 0
    OUT_OF_MEMORY = 1
    INCOMPLETE = 2
    UNEXPECTED_NULL = 3
    BAD_DATA = 4
    OP_FAILED = 5
    BAD_STATE = 6
    UNMAPPABLE = 7
    OUTPUT_INSUFFICIENT_SIZE = 8
    UNAVAILABLE_DEVICE = 9
    MISSED_DEADLINE_TRANSIENT = 10
    MISSED_DEADLINE_PERSISTENT = 11
    RESOURCE_EXHAUSTED_TRANSIENT = 12
    RESOURCE_EXHAUSTED_PERSISTENT = 13
    DEAD_OBJECT = 14


#: the last operation code of each feature level (codes are assigned in order)
_LAST_OPERATION_OF_LEVEL = (
    (OperationCode.TANH, FeatureLevelCode.FEATURE_LEVEL_1),
    (OperationCode.TRANSPOSE, FeatureLevelCode.FEATURE_LEVEL_2),
    (OperationCode.RESIZE_NEAREST_NEIGHBOR, FeatureLevelCode.FEATURE_LEVEL_3),
    (OperationCode.RANK, FeatureLevelCode.FEATURE_LEVEL_4),
    (OperationCode.PACK, FeatureLevelCode.FEATURE_LEVEL_6),
)


def operation_introduced_in(code: int) -> FeatureLevelCode:
    """The NNAPI feature level that introduced operation ``code`` (its "Available since"
    line in NeuralNetworksTypes.h)."""
    for last, level in _LAST_OPERATION_OF_LEVEL:
        if code <= last:
            return level
    return FeatureLevelCode.FEATURE_LEVEL_7


def operand_type_introduced_in(code: int) -> FeatureLevelCode:
    """The NNAPI feature level that introduced operand type ``code``."""
    if code >= OperandCode.TENSOR_QUANT8_ASYMM_SIGNED:
        return FeatureLevelCode.FEATURE_LEVEL_4
    if code >= OperandCode.BOOL:
        return FeatureLevelCode.FEATURE_LEVEL_3
    return FeatureLevelCode.FEATURE_LEVEL_1
