"""What the Tinker suites share: the test key, the base model, a sentence's ids and datum helpers.

Imported after the suite has set HF_HUB_CACHE (the SDK reads it when imported)."""

import tinker
from tinker import types


KEY = "tinker-test-key"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
# A short sentence's token ids in SmolLM2's vocabulary (any ids below its 49,152 would do).
TOKENS = [504, 3458, 282, 4649, 314, 7042, 30, 378, 3458, 282, 6129, 314, 4141, 30]


def service(server, key=KEY):
    return tinker.ServiceClient(base_url=f"http://{server.host}:{server.port}", api_key=f"tml-{key}")


def datum(tokens=TOKENS, **inputs):
    """Position i of the input predicts token i + 1."""
    n = len(tokens) - 1
    loss_inputs = {"target_tokens": tokens[1:]}
    for k, v in inputs.items():
        loss_inputs[k] = v if isinstance(v, list) else [v] * n
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=loss_inputs)


def logprobs(out, i=0):
    return out.loss_fn_outputs[i]["logprobs"].tolist()
