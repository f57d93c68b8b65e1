"""Model configuration: ``config.pbtxt`` parsing, Triton's defaults, validation, typed views.

The server reads a model's configuration through :func:`load_model_config`, which returns a
frozen :class:`ModelConfig`; :func:`config_to_json` gives Triton's JSON form of it. Every problem
is a :class:`ConfigError` that names the file, the line and what to change.
"""

from .datatypes import V2_DATATYPES, config_dtype_to_v2, v2_to_config_dtype
from .errors import ConfigError, FieldPath
from .json_form import config_to_json, json_to_config
from .loader import (
    CONFIG_FILENAME,
    ConfigSource,
    complete_config,
    detect_backend,
    load_model_config,
    read_config,
)
from .model_config import (
    DynamicBatchingConfig,
    EnsembleStep,
    InstanceGroupConfig,
    InstanceSpec,
    ModelConfig,
    QueuePolicy,
    TensorConfig,
    VersionPolicy,
)
from .parsing import parse_config_text
from .sequence import (
    SequenceBatchingConfig,
    SequenceControl,
    SequenceInitialState,
    SequenceState,
)
from .versions import NoVersionToServe, list_versions, select_versions

__all__ = [
    "CONFIG_FILENAME",
    "V2_DATATYPES",
    "ConfigError",
    "ConfigSource",
    "DynamicBatchingConfig",
    "EnsembleStep",
    "FieldPath",
    "InstanceGroupConfig",
    "InstanceSpec",
    "ModelConfig",
    "NoVersionToServe",
    "QueuePolicy",
    "SequenceBatchingConfig",
    "SequenceControl",
    "SequenceInitialState",
    "SequenceState",
    "TensorConfig",
    "VersionPolicy",
    "complete_config",
    "config_dtype_to_v2",
    "config_to_json",
    "detect_backend",
    "json_to_config",
    "list_versions",
    "load_model_config",
    "parse_config_text",
    "read_config",
    "select_versions",
    "v2_to_config_dtype",
]
