"""orion.serve.requests and orion.serve.registry: each bad field is a 400 naming it."""

from __future__ import annotations

import pytest

from orion.serve.errors import APIError
from orion.serve.registry import ModelRegistry, Target
from orion.serve.requests import chat_request, completion_request, sampling_defaults


def test_defaults_and_values():
    r = completion_request({"model": "m", "prompt": "hi"}, 256)
    assert (r.max_tokens, r.temperature, r.top_p, r.stop, r.stream) == (256, 1.0, 1.0, [], False)
    r = completion_request({"model": "m", "prompt": ["hi"], "stop": "x", "seed": 3,
                            "max_completion_tokens": 5, "temperature": 0}, 256)
    assert (r.prompt, r.stop, r.seed, r.max_tokens, r.temperature) == ("hi", ["x"], 3, 5, 0.0)
    assert completion_request({"prompt": [1, 2]}, 64).prompt == [1, 2]
    c = chat_request({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None}]}, 64)
    assert c.messages == [{"role": "user", "content": "ab"},
                          {"role": "assistant", "content": ""}]


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "n": 3}, "n"),
    ({"prompt": "x", "n": True}, "n"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 65}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "stop": ["a"] * 5}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "presence_penalty": 1}, "presence_penalty"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({}, "prompt"),
])
def test_bad_completion_fields(body, param):
    with pytest.raises(APIError) as info:
        completion_request(body, 64)
    assert info.value.status == 400 and info.value.param == param


@pytest.mark.parametrize("messages", [None, [], "hi", [1], [{"content": "x"}],
                                      [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [{"type": "image_url"}]}]])
def test_bad_messages(messages):
    with pytest.raises(APIError) as info:
        chat_request({"messages": messages}, 64)
    assert info.value.param == "messages"


def test_registry_resolves_base_and_adapters():
    reg = ModelRegistry("base", {"poet": "/adapters/poet"})
    assert reg.names() == ["base", "poet"]
    assert reg.resolve("base") == Target("base")
    assert reg.resolve("poet") == Target("base", "poet") and reg.resolve("poet").name == "poet"
    with pytest.raises(APIError) as info:
        reg.resolve("other")
    assert info.value.status == 404 and info.value.code == "model_not_found"
    with pytest.raises(APIError):
        reg.resolve(None)
    with pytest.raises(ValueError):
        ModelRegistry("x", {"x": "/a"})


def test_generation_config_defaults():
    defaults = sampling_defaults({"temperature": 0.6, "top_p": 0.9, "do_sample": True})
    assert defaults == {"temperature": 0.6, "top_p": 0.9}
    r = completion_request({"prompt": "x"}, 64, defaults)
    assert (r.temperature, r.top_p) == (0.6, 0.9)
    r = completion_request({"prompt": "x", "temperature": 0, "top_p": 1}, 64, defaults)
    assert (r.temperature, r.top_p) == (0.0, 1.0)
    assert sampling_defaults({"do_sample": False, "temperature": 0.6})["temperature"] == 0.0
    assert sampling_defaults({}) == {"temperature": 1.0, "top_p": 1.0}
