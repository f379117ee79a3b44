"""The spec's JSON Schema, for editors (yaml-language-server) and `fusegen schema`.

The pydantic models give the kernel's fields; chain steps are described from the op
registry, so a new op appears in the schema without edits here.
"""

from __future__ import annotations

from fusegen import dtypes, ops
from fusegen.spec.models import CrossEntropySpec, SpecFile

SCHEMA_ID = "https://fusegen.dev/schema/spec-v1.json"


def _activation_args(act: ops.Activation) -> dict:
    if act.name == "gelu":
        choice = {"enum": list(ops.GELU_APPROXIMATE)}
        return {
            "anyOf": [
                {"type": "null"},
                choice,
                {
                    "type": "object",
                    "properties": {"approximate": choice},
                    "additionalProperties": False,
                },
            ]
        }
    if not act.params:
        return {"type": "null"}
    props = {
        p.name: {"type": "number", **({"default": p.default} if p.default is not None else {})}
        for p in act.params
    }
    required = [p.name for p in act.params if p.default is None]
    obj = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        obj["required"] = required
    forms = [obj] if required else [{"type": "null"}, {"type": "number"}, obj]
    return {"anyOf": forms}


def _step(op: str, args: dict, description: str) -> dict:
    return {
        "type": "object",
        "description": description,
        "properties": {op: args},
        "required": [op],
        "additionalProperties": False,
    }


def chain_step_schema() -> dict:
    tensor = {"type": "string", "description": "an input's name"}
    operand = {"type": "string", "description": "an input's name, or NAME.T to read it transposed"}
    matmul = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"a": operand, "b": operand},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
            {
                "type": "string",
                "pattern": ops.MATMUL_SHORTHAND,
                "description": "A @ B, each an input's name or NAME.T (e.g. x @ w.T)",
            },
        ]
    }
    bare = sorted(
        a.name for a in ops.ACTIVATIONS.values() if all(p.default is not None for p in a.params)
    )
    activation = {
        "anyOf": [{"enum": bare}]
        + [_step(a.name, _activation_args(a), a.math) for a in ops.ACTIVATIONS.values()]
    }
    forms = [{"enum": bare, "description": "an activation with its default parameters"}]
    forms.append(_step("input", tensor, ops.STRUCTURAL["input"].summary))
    forms.append(_step("matmul", matmul, ops.STRUCTURAL["matmul"].summary))
    forms.append(
        _step(
            "gate",
            {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"matmul": matmul, "bias": tensor, "activation": activation},
                        "required": ["matmul"],
                        "additionalProperties": False,
                    },
                    matmul["anyOf"][1],
                ]
            },
            ops.STRUCTURAL["gate"].summary,
        )
    )
    forms.append(_step("bias", tensor, ops.STRUCTURAL["bias"].summary))
    forms.append(_step("scale", {"type": "number"}, ops.STRUCTURAL["scale"].summary))
    forms.append(
        _step(
            "cast",
            {"enum": sorted([*dtypes.DTYPES, *dtypes.ALIASES])},
            ops.STRUCTURAL["cast"].summary,
        )
    )
    for b in ops.BINARY.values():
        forms.append(_step(b.name, {"anyOf": [tensor, {"type": "number"}]}, b.summary))
    forms.append(_step("output", {"type": "string"}, ops.STRUCTURAL["output"].summary))
    forms.append(_step("softcap", {"type": "number"}, ops.STRUCTURAL["softcap"].summary))
    loss = CrossEntropySpec.model_json_schema()
    loss.pop("title", None)
    forms.append(
        _step(
            "cross_entropy",
            {"anyOf": [tensor, loss]},
            ops.STRUCTURAL["cross_entropy"].summary,
        )
    )
    fp8 = ["fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "float8_e5m2", "e4m3", "e5m2", "fp8"]
    forms.append(
        _step(
            "quantize",
            {
                "type": "object",
                "properties": {
                    "dtype": {"enum": fp8},
                    "scale": {
                        "anyOf": [
                            {"enum": ["per_row"]},
                            {
                                "type": "object",
                                "properties": {"per_group": {"type": "integer", "minimum": 16}},
                                "required": ["per_group"],
                                "additionalProperties": False,
                            },
                        ]
                    },
                },
                "required": ["dtype"],
                "additionalProperties": False,
            },
            "the chain's last step: its value rounded to fp8 with one scale a row (or per "
            "group along it); the launcher returns (q, scale)",
        )
    )
    forms[0]["enum"] = sorted([*bare, *ops.ROW_OPS])
    for r in ops.ROW_OPS.values():
        props = {p.name: {"type": "number", "default": p.default} for p in r.params}
        props.update({role: tensor for role in r.operands})
        args = {"type": "object", "properties": props, "additionalProperties": False}
        forms.append(_step(r.name, {"anyOf": [{"type": "null"}, args]}, r.summary))
    for a in ops.ACTIVATIONS.values():
        forms.append(_step(a.name, _activation_args(a), a.math))
    return {"anyOf": forms}


def json_schema() -> dict:
    schema = SpecFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = SCHEMA_ID
    schema["title"] = "fusegen spec"
    schema["$defs"]["KernelSpec"]["properties"]["chain"]["items"] = chain_step_schema()
    # `x: [M, K]` is short for `x: {shape: [M, K]}`.
    inputs = schema["$defs"]["KernelSpec"]["properties"]["inputs"]
    inputs["additionalProperties"] = {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"$ref": "#/$defs/InputSpec"}]
    }
    return schema
