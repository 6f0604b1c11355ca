"""The engine's chunk layout (spec §5.4, §11 item 5): leaf-major, step-major inside a leaf [INF]."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from protocol.engine.chunks import ChunkLayout
from protocol.engine.networks import build_decoder
from protocol.errors import ConfigError
from protocol.nne.layers import Array, Concat, Denormalize, Layer
from protocol.nne.reference import evaluate
from protocol.schema import SchemaNode, parse_schema
from tests.support.schemas import cont

MOVE_LOOK = parse_schema(
    {
        "VectorSize": 5,
        "DistributionSize": 10,
        "EncodedSize": 10,
        "ModifierSize": 13,
        "Type": "And",
        "Elements": {"Move": cont(2, index=0, role="action"), "Look": cont(3, index=1, role="action")},
    },
    "action",
)

ARRAY = parse_schema(
    {
        "VectorSize": 6,
        "DistributionSize": 12,
        "EncodedSize": 12,
        "ModifierSize": 13,
        "Type": "Array",
        "Num": 3,
        "Element": cont(2, role="action"),
    },
    "action",
)

NESTED = parse_schema(
    {
        "VectorSize": 6,
        "DistributionSize": 12,
        "EncodedSize": 12,
        "ModifierSize": 14,
        "Type": "And",
        "Elements": {
            "Grip": {
                "VectorSize": 1,
                "DistributionSize": 1,
                "EncodedSize": 1,
                "ModifierSize": 1,
                "Type": "DiscreteExclusive",
                "Num": 1,
                "Index": 0,
            },
            "Arms": {
                "VectorSize": 4,
                "DistributionSize": 8,
                "EncodedSize": 8,
                "ModifierSize": 9,
                "Type": "Array",
                "Num": 2,
                "Element": cont(2, role="action"),
                "Index": 1,
            },
            "Turn": {
                "VectorSize": 1,
                "DistributionSize": 2,
                "EncodedSize": 2,
                "ModifierSize": 3,
                "Type": "Encoding",
                "EncodingSize": 4,
                "EncodingDepth": 1,
                "ActivationFunction": "ELU",
                "Element": cont(1, role="action"),
                "Index": 2,
            },
        },
    },
    "action",
)


def test_one_step_and_one_leaf_chunks_are_the_step_major_chunk() -> None:
    assert ChunkLayout.from_schema(MOVE_LOOK, 1).is_identity
    single = parse_schema(cont(2, role="action"), "action")
    layout = ChunkLayout.from_schema(single, 8)
    assert layout.is_identity and layout.width == 16


def test_and_of_two_leaves_is_leaf_major_with_the_steps_of_each_leaf_in_order() -> None:
    # Move (2 values) then Look (3 values); step k's vector is columns 5k..5k+4 of the step-major chunk.
    layout = ChunkLayout.from_schema(MOVE_LOOK, 2)
    assert layout.source.tolist() == [0, 1, 5, 6, 2, 3, 4, 7, 8, 9]
    assert layout.step_positions(0).tolist() == [0, 1, 4, 5, 6]
    assert layout.step_positions(1).tolist() == [2, 3, 7, 8, 9]


def test_array_elements_each_hold_their_own_steps() -> None:
    layout = ChunkLayout.from_schema(ARRAY, 2)
    assert layout.source.tolist() == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]


@pytest.mark.parametrize("schema", [MOVE_LOOK, ARRAY, NESTED], ids=["and", "array", "nested"])
@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_to_steps_inverts_to_engine(schema: SchemaNode, chunk: int) -> None:
    layout = ChunkLayout.from_schema(schema, chunk)
    steps = np.random.default_rng(chunk).standard_normal((4, chunk, schema.vector_size))
    engine = layout.to_engine(steps.reshape(4, -1))
    np.testing.assert_array_equal(layout.to_steps(engine), steps)
    for k in range(chunk):
        np.testing.assert_array_equal(engine[:, layout.step_positions(k)], steps[:, k])


def _marked(layer: Layer, counter: list[int]) -> Layer:
    """The decoder with every leaf Denormalize's mean set to its leaf number (1, 2, ...) in build order."""
    if isinstance(layer, Denormalize):
        counter[0] += 1
        return dataclasses.replace(layer, mean=np.full(layer.size, counter[0], np.float32))
    if isinstance(layer, Concat):
        return dataclasses.replace(layer, layers=tuple(_marked(sub, counter) for sub in layer.layers))
    if isinstance(layer, Array):
        return dataclasses.replace(layer, layer=_marked(layer.layer, counter))
    return layer


@pytest.mark.parametrize("schema", [MOVE_LOOK, ARRAY, NESTED], ids=["and", "array", "nested"])
def test_the_engine_built_decoder_reads_each_leaf_where_the_layout_puts_it(schema: SchemaNode) -> None:
    chunk = 3
    decoder = _marked(build_decoder(schema, chunk), [0])
    marks = evaluate(decoder, np.zeros((1, schema.vector_size * chunk), np.float32))[0]
    layout = ChunkLayout.from_schema(schema, chunk)
    # Per-step leaf numbers: an Array's elements share one sub-layer (one mark), repeated per element.
    step_marks = layout.to_steps(marks[None])[0]
    for k in range(1, chunk):
        np.testing.assert_array_equal(step_marks[k], step_marks[0])
    # Leaf-major: each leaf's block is contiguous, so the marks never decrease along the engine's layout.
    assert np.all(np.diff(marks) >= 0)


def test_masked_or_and_opaque_leaves_have_no_chunked_layout() -> None:
    masked = parse_schema(
        {
            "VectorSize": 5,
            "DistributionSize": 8,
            "EncodedSize": 8,
            "ModifierSize": 9,
            "Type": "OrExclusive",
            "Elements": {"A": cont(1, index=0, role="action"), "B": cont(2, index=1, role="action")},
        },
        "action",
    )
    assert ChunkLayout.from_schema(masked, 1).is_identity
    with pytest.raises(ConfigError, match=r"Mask|OrExclusive"):
        ChunkLayout.from_schema(masked, 2)


@pytest.mark.parametrize("chunk", [0, -1, True])
def test_bad_chunk_sizes_are_config_errors(chunk: Any) -> None:
    with pytest.raises(ConfigError):
        ChunkLayout.from_schema(MOVE_LOOK, chunk)


def test_shapes_are_checked() -> None:
    layout = ChunkLayout.from_schema(MOVE_LOOK, 2)
    with pytest.raises(ValueError):
        layout.to_steps(np.zeros((2, 9)))
    with pytest.raises(ValueError):
        layout.step_positions(2)
    with pytest.raises(ValueError):
        ChunkLayout(2, 5, np.zeros(10, dtype=np.int64))
