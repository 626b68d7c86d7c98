"""A gRPC `ModelInferRequest` fed to the same bounds as an HTTP v2 request (`tensors`),
before any swap-in and before it is forwarded (pure).

Triton's gRPC frontend sizes an input from its `shape` as its HTTP frontend does, so each
input goes through `tensors.tensor_input` with what the message carries for it: its
`raw_input_contents` entry's bytes (BYTES: the strings its 4-byte length prefixes
delimit, every prefix within the entry), or the values of its datatype's typed `contents`
field (`fp32_contents` for FP32, ...); `raw_input_contents` given for some inputs only,
or typed contents of another type, are refused. The request's and its outputs'
parameters that Triton reads itself are checked for their types as HTTP's JSON ones
(`InferParameter`'s set field as the JSON value it stands for), and shared memory is
refused on inputs and outputs with HTTP's message.

    inputs = infer_request(request)                    # BadRequestError
    tensors.check_config(inputs, shape, route.name)    # once the configuration is known
"""

from __future__ import annotations

from collections.abc import Mapping

from tritonclient.grpc import service_pb2

from modelswap_sidecar.gateway import tensors
from modelswap_sidecar.gateway.errors import BadRequestError

#: The typed `InferTensorContents` field of each datatype (FP16 and BF16 have none: they
#: travel in `raw_input_contents` only).
CONTENTS_FIELD: Mapping[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ALL_CONTENTS = tuple(sorted(set(CONTENTS_FIELD.values())))


def parameters(
    fields: Mapping[str, service_pb2.InferParameter],
) -> dict[str, object]:
    """gRPC parameters as the JSON values they stand for (an unset one as None)."""
    out: dict[str, object] = {}
    for key, parameter in fields.items():
        which = parameter.WhichOneof("parameter_choice")
        out[key] = None if which is None else getattr(parameter, which)
    return out


def infer_request(request: service_pb2.ModelInferRequest) -> tensors.InferRequest:
    """The request's inputs, each checked against the contents it carries; its parameters
    and outputs checked as HTTP's. BadRequestError naming what is wrong."""
    tensors.check_request_parameters(parameters(request.parameters))
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise BadRequestError(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: "
            "give every input's data there, or none"
        )
    inputs = tuple(
        _input(tensor, raw[index] if raw else None, index)
        for index, tensor in enumerate(request.inputs)
    )
    tensors.check_names(inputs)
    for output in request.outputs:
        tensors.check_output(output.name, parameters(output.parameters))
    return tensors.InferRequest(inputs)


def _input(
    tensor: service_pb2.ModelInferRequest.InferInputTensor, raw: bytes | None, index: int
) -> tensors.TensorInput:
    where = f"input {tensor.name[:64]!r}"
    datatype = tensor.datatype
    given = [f for f in _ALL_CONTENTS if len(getattr(tensor.contents, f))]
    if raw is not None:
        if given:
            raise BadRequestError(
                f"{where}: carries both raw_input_contents[{index}] and {given[0]}"
            )
        if datatype == tensors.BYTES:
            carried = tensors.Carried(
                values=tensors.prefixed_strings(raw, where),
                name=f"raw_input_contents[{index}] (length-prefixed strings)",
            )
        else:
            carried = tensors.Carried(
                data_bytes=len(raw), name=f"raw_input_contents[{index}] is {len(raw)} bytes"
            )
    else:
        field = CONTENTS_FIELD.get(datatype)
        other = [f for f in given if f != field]
        if other:
            raise BadRequestError(
                f"{where}: {datatype or 'its'} data goes in "
                f"{field or 'raw_input_contents'}, not {other[0]}"
            )
        if field is None:
            carried = tensors.Carried(name="typed contents nor raw_input_contents")
        else:
            carried = tensors.Carried(values=len(getattr(tensor.contents, field)), name=field)
    return tensors.tensor_input(
        tensor.name, datatype, list(tensor.shape), parameters(tensor.parameters), carried
    )
