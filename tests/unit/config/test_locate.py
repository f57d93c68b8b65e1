"""Field locations in text-format configs, used to put line numbers on validation errors."""

from __future__ import annotations

from shoal.config._locate import FieldLocations
from shoal.protos import model_config_pb2 as pb

TEXT = """\
name: "m"                                   # 1
input [                                     # 2
  {                                         # 3
    name: "A"                               # 4
    dims: [ 1,                              # 5
            2 ]                             # 6
  },                                        # 7
  { name: "B" dims: -1 }                    # 8
]                                           # 9
input < name: "C"                           # 10
  reshape: { shape: [] } >                  # 11
parameters { key: "k" value { string_value: "v" "w" } }   # 12
dynamic_batching {                          # 13
  preferred_batch_size: 4                   # 14
  preferred_batch_size: 8                   # 15
}
"""


def lines():
    return FieldLocations(TEXT, pb.ModelConfig.DESCRIPTOR)


def test_fields_by_path():
    found = lines()
    assert found.line(("name",)) == 1
    assert found.line(("input",)) == 2
    assert found.line(("input", 0)) == 3
    assert found.line(("input", 0, "dims")) == 5
    assert found.line(("input", 1)) == 8
    assert found.line(("input", 1, "dims")) == 8
    assert found.line(("input", 2)) == 10
    assert found.line(("input", 2, "reshape", "shape")) == 11
    assert found.line(("parameters", 0, "value", "string_value")) == 12
    assert found.line(("dynamic_batching", "preferred_batch_size")) == 14


def test_unwritten_field_falls_back_to_its_message():
    found = lines()
    assert found.line(("input", 0, "data_type")) == 3
    assert found.line(("dynamic_batching", "max_queue_delay_microseconds")) == 13


def test_unwritten_element_has_no_line():
    found = lines()
    assert found.line(("input", 3, "dims")) is None
    assert found.line(("output", 0)) is None
    assert found.line(("instance_group", 0, "count")) is None


def test_broken_text_indexes_what_it_can():
    found = FieldLocations('name: "m"\ninput { name: ', pb.ModelConfig.DESCRIPTOR)
    assert found.line(("name",)) == 1
