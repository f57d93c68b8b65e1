"""shoal's model_config.proto against tritonclient's: same fields, same bytes, one process."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.grpc  # noqa: F401  (registers Triton's inference.* descriptors first)
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor
from google.protobuf.unknown_fields import UnknownFieldSet
from tritonclient.grpc import model_config_pb2 as triton_pb

from shoal.config import load_model_config
from shoal.protos import model_config_pb2 as shoal_pb

from .helpers import ADD_SUB, ENSEMBLE, SEQUENCE, make_model

ROOT = Path(__file__).resolve().parents[3]
TRITON = triton_pb.DESCRIPTOR.package + "."
SHOAL = shoal_pb.DESCRIPTOR.package + "."


def test_both_modules_live_in_one_process():
    assert shoal_pb.ModelConfig.DESCRIPTOR.full_name == "shoal.inference.ModelConfig"
    assert triton_pb.ModelConfig.DESCRIPTOR.full_name == "inference.ModelConfig"


def _type_name(field) -> str:
    target = field.message_type or field.enum_type
    if target is None:
        return ""
    return target.full_name.removeprefix(TRITON).removeprefix(SHOAL)


def _enum_shape(enum: EnumDescriptor) -> dict[str, int]:
    return {value.name: value.number for value in enum.values}


def _message_shape(message: Descriptor) -> dict[str, object]:
    return {
        "fields": {
            field.name: (field.number, field.type, field.is_repeated, _type_name(field))
            for field in message.fields
        },
        "field_order": [field.name for field in message.fields],
        "oneofs": {oneof.name: [f.name for f in oneof.fields] for oneof in message.oneofs},
        "map_entry": message.GetOptions().map_entry,
        "enums": {enum.name: _enum_shape(enum) for enum in message.enum_types},
        "nested": {nested.name: _message_shape(nested) for nested in message.nested_types},
    }


def test_every_message_field_and_enum_matches_triton():
    ours, theirs = shoal_pb.DESCRIPTOR, triton_pb.DESCRIPTOR
    assert set(ours.message_types_by_name) == set(theirs.message_types_by_name)
    assert set(ours.enum_types_by_name) == set(theirs.enum_types_by_name)
    for name, message in theirs.message_types_by_name.items():
        assert _message_shape(ours.message_types_by_name[name]) == _message_shape(message), name
    for name, enum in theirs.enum_types_by_name.items():
        assert _enum_shape(ours.enum_types_by_name[name]) == _enum_shape(enum), name


def _everything() -> shoal_pb.ModelConfig:
    """A configuration that sets at least one field of every message."""
    config = shoal_pb.ModelConfig(
        name="all",
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        runtime="rt",
        max_batch_size=8,
        default_model_filename="m.onnx",
    )
    config.version_policy.specific.versions.extend([1, 2])
    config.input.add(
        name="I",
        data_type=shoal_pb.TYPE_BF16,
        format=shoal_pb.ModelInput.FORMAT_NCHW,
        dims=[3, -1, 5],
        reshape=shoal_pb.ModelTensorReshape(shape=[3, -1, 5]),
        is_shape_tensor=True,
        allow_ragged_batch=True,
        optional=True,
        is_non_linear_format_io=True,
    )
    config.output.add(name="O", data_type=shoal_pb.TYPE_STRING, dims=[1], label_filename="l.txt")
    config.batch_input.add(
        kind=shoal_pb.BatchInput.BATCH_ITEM_SHAPE,
        target_name=["T"],
        data_type=shoal_pb.TYPE_INT32,
        source_input=["I"],
    )
    config.batch_output.add(target_name=["O"], source_input=["I"])
    opt = config.optimization
    opt.graph.level = 1
    opt.priority = shoal_pb.ModelOptimizationPolicy.PRIORITY_MAX
    opt.cuda.graphs = True
    spec = opt.cuda.graph_spec.add(batch_size=4)
    spec.input["I"].dim.extend([4, 3])
    spec.graph_lower_bound.batch_size = 1
    spec.graph_lower_bound.input["I"].dim.extend([1, 3])
    opt.execution_accelerators.gpu_execution_accelerator.add(name="tensorrt").parameters["p"] = "v"
    opt.input_pinned_memory.enable = True
    opt.gather_kernel_buffer_threshold = 3
    opt.eager_batching = True
    batching = config.dynamic_batching
    batching.preferred_batch_size.extend([4, 8])
    batching.max_queue_delay_microseconds = 2**40
    batching.priority_levels = 2
    batching.default_priority_level = 1
    batching.default_queue_policy.max_queue_size = 9
    batching.priority_queue_policy[2].timeout_action = shoal_pb.ModelQueuePolicy.DELAY
    group = config.instance_group.add(
        name="g",
        kind=shoal_pb.ModelInstanceGroup.KIND_GPU,
        count=2,
        gpus=[0, 1],
        profile=["0"],
        passive=True,
        host_policy="numa0",
    )
    group.rate_limiter.resources.add(name="R", count=2, **{"global": True})
    group.rate_limiter.priority = 3
    group.secondary_devices.add(device_id=1)
    config.cc_model_filenames["7.5"] = "a.plan"
    config.metric_tags["team"] = "x"
    config.parameters["k"].string_value = "v"
    warmup = config.model_warmup.add(name="w", batch_size=1, count=2)
    warmup.inputs["I"].data_type = shoal_pb.TYPE_FP32
    warmup.inputs["I"].random_data = True
    config.model_operations.op_library_filename.append("ops.so")
    config.model_transaction_policy.decoupled = True
    config.model_repository_agents.agents.add(name="checksum").parameters["MD5:1"] = "x"
    config.response_cache.enable = True
    control = config.model_metrics.metric_control.add()
    control.metric_identifier.family = "nv_inference_first_response_histogram_ms"
    control.histogram_options.buckets.extend([1.0, 2.5])
    return config


def _sequence_and_ensemble() -> list[shoal_pb.ModelConfig]:
    sequence = shoal_pb.ModelConfig(name="s")
    batcher = sequence.sequence_batching
    batcher.oldest.max_candidate_sequences = 3
    batcher.oldest.preferred_batch_size.append(2)
    batcher.oldest.preserve_ordering = True
    batcher.max_sequence_idle_microseconds = 10
    control = batcher.control_input.add(name="S").control.add()
    control.kind = shoal_pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY
    control.bool_false_true.extend([False, True])
    corrid = batcher.control_input.add(name="C").control.add(data_type=shoal_pb.TYPE_UINT64)
    corrid.kind = shoal_pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID
    state = batcher.state.add(
        input_name="si",
        output_name="so",
        data_type=shoal_pb.TYPE_FP32,
        dims=[2],
        use_same_buffer_for_input_output=True,
        use_growable_memory=True,
    )
    state.initial_state.add(name="init", data_type=shoal_pb.TYPE_FP32, dims=[2], data_file="f")
    batcher.iterative_sequence = True
    ensemble = shoal_pb.ModelConfig(name="e", platform="ensemble")
    step = ensemble.ensemble_scheduling.step.add(model_name="a", model_version=-1)
    step.input_map["x"] = "IN"
    step.output_map["y"] = "OUT"
    step.model_namespace = "ns"
    ensemble.ensemble_scheduling.max_inflight_requests = 4
    return [sequence, ensemble]


def _as_dict(message) -> dict[str, object]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@pytest.mark.parametrize(
    "config", [_everything(), *_sequence_and_ensemble()], ids=["everything", "sequence", "ensemble"]
)
def test_tritonclient_reads_what_shoal_writes_and_back(config):
    wire = config.SerializeToString()
    theirs = triton_pb.ModelConfig.FromString(wire)
    assert _as_dict(theirs) == _as_dict(config)
    assert theirs.SerializeToString(deterministic=True) == config.SerializeToString(
        deterministic=True
    )
    assert shoal_pb.ModelConfig.FromString(theirs.SerializeToString()) == config
    assert len(UnknownFieldSet(theirs)) == 0


@pytest.mark.parametrize(
    ("name", "text"), [("add_sub", ADD_SUB), ("accumulate", SEQUENCE), ("pipeline", ENSEMBLE)]
)
def test_config_files_parse_the_same_with_tritons_proto(tmp_path, name, text):
    model_dir = make_model(tmp_path, name, text)
    ours = load_model_config(model_dir).proto
    theirs = triton_pb.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), theirs)
    raw = shoal_pb.ModelConfig()
    text_format.Parse((model_dir / "config.pbtxt").read_text(), raw)
    assert raw.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)
    completed = triton_pb.ModelConfig.FromString(ours.SerializeToString())
    assert completed.name == name


def _load_script():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The generator runs grpcio-tools (a test extra pinned in setup.cfg): machines without it, a GPU
# machine with only the carried wheels say, skip the three tests that run it.
needs_protoc = pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed"
)


@needs_protoc
def test_generated_code_is_current():
    problems = _load_script().check(ROOT)
    assert problems == [], "run: python scripts/gen_protos.py\n" + "\n".join(problems)


@needs_protoc
def test_check_reports_a_changed_proto(tmp_path):
    script = _load_script()
    protos = tmp_path / "shoal" / "protos"
    protos.mkdir(parents=True)
    for name in ("model_config.proto", "model_config_pb2.py", "model_config_pb2.pyi"):
        (protos / name).write_bytes((ROOT / "shoal" / "protos" / name).read_bytes())
    assert script.check(tmp_path) == []
    proto = protos / "model_config.proto"
    proto.write_text(proto.read_text().replace("bool passive = 7;", "bool passive = 7;\n  // x"))
    assert script.check(tmp_path) == []  # comments do not change the generated code
    proto.write_text(proto.read_text().replace("string host_policy = 9;", "string host = 9;"))
    assert [p.split(":")[0] for p in script.check(tmp_path)] == [
        "shoal/protos/model_config_pb2.py",
        "shoal/protos/model_config_pb2.pyi",
    ]
    (protos / "gone_pb2.py").write_text("")
    assert any("gone_pb2.py: generated file has no .proto" in p for p in script.check(tmp_path))


@needs_protoc
def test_check_command_exit_status():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
