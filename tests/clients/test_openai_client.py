"""The official openai Python client against a running `redline serve` (bundled stories260K).

Env: REDLINE_URL (http://127.0.0.1:PORT), REDLINE_KEY (the server's API key).
Run: python3 -m unittest -v tests/clients/test_openai_client.py
"""

import json
import os
import pathlib
import time
import unittest

import httpx
import jsonschema
import openai

URL = os.environ["REDLINE_URL"]
KEY = os.environ["REDLINE_KEY"]
ROOT = pathlib.Path(__file__).resolve().parents[2]
# llama.cpp's greedy continuation of the same prompt with the same model.
REFERENCE = json.loads((ROOT / "tests/data/stories260K.reference.jsonl").read_text().splitlines()[0])

client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, timeout=120, max_retries=0)
MODEL = client.models.list().data[0].id
CHAT = [{"role": "user", "content": "Tell me a story about a cat."}]


class Models(unittest.TestCase):
    def test_lists_the_loaded_model(self):
        models = client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].id, "stories260K")


class Completions(unittest.TestCase):
    def test_greedy_completion_matches_llama_cpp(self):
        r = client.completions.create(model=MODEL, prompt=REFERENCE["prompt"], max_tokens=64, temperature=0)
        self.assertEqual(r.choices[0].text, REFERENCE["content"])
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.prompt_tokens, REFERENCE["prompt_n"])
        self.assertEqual(r.usage.completion_tokens, 64)
        self.assertEqual(r.usage.total_tokens, REFERENCE["prompt_n"] + 64)

    def test_streamed_completion_equals_whole(self):
        chunks = list(client.completions.create(model=MODEL, prompt=REFERENCE["prompt"], max_tokens=64,
                                                temperature=0, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, REFERENCE["content"])
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")

    def test_stop_sequence_cuts_before_it(self):
        stop = " big"
        r = client.completions.create(model=MODEL, prompt=REFERENCE["prompt"], max_tokens=64, temperature=0, stop=[stop])
        self.assertEqual(r.choices[0].text, REFERENCE["content"].split(stop)[0])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_max_tokens(self):
        r = client.completions.create(model=MODEL, prompt="Once", max_tokens=5, temperature=0.8)
        self.assertEqual(r.usage.completion_tokens, 5)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_logprobs(self):
        r = client.completions.create(model=MODEL, prompt=REFERENCE["prompt"], max_tokens=4, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 4)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        for token, top in zip(lp.tokens, lp.top_logprobs):
            self.assertEqual(len(top), 3)
            # Greedy: the chosen token is the most likely one.
            self.assertEqual(max(top, key=top.get), token)


class Chat(unittest.TestCase):
    def test_chat_completion(self):
        r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20)
        m = r.choices[0].message
        self.assertEqual(m.role, "assistant")
        self.assertIsInstance(m.content, str)
        self.assertGreater(len(m.content), 0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.usage.completion_tokens, 20)
        self.assertEqual(r.model, MODEL)

    def test_stream_with_usage_equals_whole(self):
        whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
        stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 24)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)

    def test_seed_reproducibility(self):
        def sample(seed):
            return client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=1.0,
                                                  top_p=1.0, seed=seed).choices[0].message.content
        self.assertEqual(sample(1234), sample(1234))
        self.assertGreater(len({sample(s) for s in range(5)}), 1, "different seeds should differ")

    def test_system_and_multi_turn_messages(self):
        msgs = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": [{"type": "text", "text": "Go on"}]}]
        r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_chat_logprobs(self):
        r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6, temperature=0, logprobs=True,
                                           top_logprobs=2)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 6)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 2)
            self.assertEqual(t.top_logprobs[0].token, t.token)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                        "unit": {"enum": ["c", "f"]}},
                       "required": ["city", "unit"], "additionalProperties": False},
    },
}


class Structured(unittest.TestCase):
    def test_json_schema_output_parses_and_validates(self):
        for seed in range(3):
            r = client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=200, seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
            self.assertEqual(r.choices[0].finish_reason, "stop", r.choices[0].message.content)
            value = json.loads(r.choices[0].message.content)
            jsonschema.validate(value, PERSON)

    def test_json_object_output_parses(self):
        r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=300, temperature=0.5, seed=3,
                                           response_format={"type": "json_object"})
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(r.choices[0].message.content), dict)

    def test_forced_tool_call_is_parsed(self):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                           tools=[WEATHER_TOOL], tool_choice="required", max_tokens=200)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        call = choice.message.tool_calls[0]
        self.assertEqual(call.type, "function")
        self.assertEqual(call.function.name, "get_weather")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
        self.assertTrue(call.id)

        # The conversation goes on with the tool's answer.
        msgs = [{"role": "user", "content": "Weather in Paris?"}, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        r2 = client.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER_TOOL], max_tokens=10)
        self.assertIn(r2.choices[0].finish_reason, ("stop", "length", "tool_calls"))

    def test_named_tool_choice_streams_a_tool_call(self):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], max_tokens=200,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
        calls = [tc for c in stream if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual(calls[0].function.name, "get_weather")
        json.loads(calls[0].function.arguments)


def metric(name):
    text = httpx.get(URL + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


class Cancellation(unittest.TestCase):
    def test_closing_a_stream_frees_its_slot(self):
        before = metric("redline_requests_cancelled_total")
        body = {"prompt": "Once", "max_tokens": 900, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", URL + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=60) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 6:
                    break  # hang up mid-stream
        deadline = time.time() + 5
        while metric("redline_requests_cancelled_total") <= before:
            self.assertLess(time.time(), deadline, "the server did not cancel the abandoned stream")
            time.sleep(0.05)
        while metric("redline_slots_busy") != 0:
            self.assertLess(time.time(), deadline, "the slot stayed busy")
            time.sleep(0.05)


class Errors(unittest.TestCase):
    def test_bad_values_are_400s(self):
        with self.assertRaises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=CHAT, temperature=5)
        self.assertEqual(e.exception.status_code, 400)
        self.assertEqual(e.exception.body["param"], "temperature")
        with self.assertRaises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=[])
        with self.assertRaises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "x"}])
        with self.assertRaises(openai.BadRequestError):
            client.completions.create(model=MODEL, prompt="x", n=3)

    def test_too_long_is_context_length_exceeded(self):
        with self.assertRaises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10 ** 6)
        self.assertEqual(e.exception.code, "context_length_exceeded")
        with self.assertRaises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt="word " * 20000, max_tokens=1)
        self.assertEqual(e.exception.code, "context_length_exceeded")

    def test_wrong_api_key_is_401(self):
        bad = openai.OpenAI(base_url=URL + "/v1", api_key="not-the-key", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()
        with self.assertRaises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL, messages=CHAT)

    def test_unknown_fields_are_ignored(self):
        r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3,
                                           extra_body={"some_new_option": {"x": 1}, "user": "u1"})
        self.assertEqual(r.usage.completion_tokens, 3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
