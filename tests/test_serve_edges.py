"""`coevolve serve` at its edges, over real HTTP on loopback: every malformed request is a 4xx JSON error, a prompt
longer than the context is refused without being prefilled, `max_tokens` is clamped to the context, a model name it
does not serve is a 404, streaming is refused rather than ignored; and a bounded burst of clients is answered in
full with memory that stays bounded."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from coevolve.policy.hf_backend import TransformersBackend
from coevolve.policy.serve import MAX_BODY_BYTES, ChatServer


@pytest.fixture()
def server(tiny_model, tokenizer):
    with ChatServer(TransformersBackend(tiny_model, tokenizer), model_name="tiny", request_timeout_seconds=60) as running:
        yield running


def post(server, body, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(server.base_url + "/chat/completions", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def raw_exchange(server, head: bytes) -> tuple[int, dict]:
    host, port = server._httpd.server_address[:2]
    with socket.create_connection((host, port), timeout=30) as connection:
        connection.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                data.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0] if b"Content-Length: " in data else 0):
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")


HELLO = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, status, words", [
    ({"messages": [{"content": "no role"}]}, 400, "needs a 'role'"),
    ({"messages": HELLO, "seed": "abc"}, 400, "'seed' must be"),
    ({"messages": HELLO, "max_tokens": 0}, 400, "'max_tokens' must be"),
    ({"messages": HELLO, "temperature": -1}, 400, "'temperature' must be a number in [0, 2]"),
    ({"messages": HELLO, "temperature": float("nan")}, 400, "'temperature' must be a number"),
    ({"messages": HELLO, "temperature": float("inf")}, 400, "'temperature' must be a number"),
    ({"messages": HELLO, "top_p": 1.5}, 400, "'top_p' must be a number in [0, 1]"),
    ({"messages": HELLO, "stream": True}, 400, "stream: true is not supported"),
    ({"messages": HELLO, "model": "gpt-nothing"}, 404, "does not exist here"),
    ({"messages": "hi"}, 400, "non-empty list"),
    ({"messages": HELLO, "tools": "ls"}, 400, "'tools' must be a list"),
    ({"messages": HELLO, "n": 2}, 400, "'n' is not supported by this server (send 1 or leave it out)"),
    ({"messages": HELLO, "stop": ["\n"]}, 400, "'stop' is not supported"),
    ({"messages": HELLO, "logit_bias": {"42": 5}}, 400, "'logit_bias' is not supported"),
    ({"messages": HELLO, "presence_penalty": 0.5}, 400, "'presence_penalty' is not supported"),
])
def test_malformed_requests_are_4xx_json_errors(server, body, status, words):
    code, payload = post(server, body)
    assert code == status and words in payload["error"]["message"], payload


@pytest.mark.parametrize("length", [b"abc", b"-1"])
def test_a_bad_content_length_is_a_400_not_a_dropped_connection(server, length):
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n"
    status, payload = raw_exchange(server, head)
    assert status == 400 and "Content-Length" in payload["error"]["message"]


def test_a_huge_body_is_refused_unread_and_a_long_prompt_without_prefill(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
            + str(5 * 1024 * 1024).encode() + b"\r\n\r\n")
    status, payload = raw_exchange(server, head)  # the 5 MB never sent: answered from the headers alone
    assert status == 413 and str(MAX_BODY_BYTES) in payload["error"]["message"]
    started = time.perf_counter()
    long = "word " * (server.context_tokens * 7)  # fits the body limit, cannot fit the context
    code, payload = post(server, {"messages": [{"role": "user", "content": long}]})
    assert code == 400 and "context" in payload["error"]["message"] and time.perf_counter() - started < 20


def test_max_tokens_is_clamped_to_what_the_context_leaves(server, tokenizer):
    near = "word " * (server.context_tokens - 40)
    code, payload = post(server, {"messages": [{"role": "user", "content": near}], "max_tokens": 10_000})
    assert code == 200
    assert payload["usage"]["completion_tokens"] <= 40 and payload["choices"][0]["finish_reason"] == "length"


def test_a_burst_of_clients_is_answered_in_full_with_bounded_memory(server):
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results: list[int] = []

    def client(index: int) -> None:
        code, _ = post(server, {"messages": [{"role": "user", "content": f"tell me about {index}"}],
                                "max_tokens": 8, "seed": index})
        results.append(code)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results) == [200] * 24
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mib < 300, grown_mib


def test_other_methods_and_deep_bodies_get_json_answers(server):
    status, payload = raw_exchange(server, b"PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert status == 405 and "is not served here" in payload["error"]["message"]
    status, payload = raw_exchange(server, b"TRACE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 405 and "TRACE is not served here" in payload["error"]["message"]  # as the README says
    host, port = server._httpd.server_address[:2]
    with socket.create_connection((host, port), timeout=30) as connection:  # HEAD: the 405's headers, no body
        connection.sendall(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += connection.recv(65536)
    assert head.startswith(b"HTTP/1.1 405") and head.endswith(b"\r\n\r\n")
    status, payload = raw_exchange(server, b"BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 501 and payload["error"]["type"] == "invalid_request_error"  # JSON, not http.server's HTML
    deep = b"[" * 100_000 + b"]" * 100_000
    status, payload = post(server, None, raw=deep)
    assert status == 400 and "nested too deep" in payload["error"]["message"]


def test_a_request_dripped_slowly_is_cut_off_at_its_read_deadline(tiny_model, tokenizer, monkeypatch):
    """A byte every 0.2 s never trips the idle timeout; the whole request's deadline (here 1 s) closes it."""
    import coevolve.policy.serve as serve

    monkeypatch.setattr(serve, "READ_DEADLINE_SECONDS", 1.0)
    with ChatServer(TransformersBackend(tiny_model, tokenizer), model_name="tiny") as running:
        host, port = running._httpd.server_address[:2]
        started = time.perf_counter()
        closed_after = None
        with socket.create_connection((host, port), timeout=10) as connection:
            for byte in b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 9999\r\n\r\n" + b"x" * 100:
                try:
                    connection.sendall(bytes([byte]))
                    connection.setblocking(False)
                    try:
                        connection.recv(65536)  # an answer or the end of the stream: the server let go
                        closed_after = time.perf_counter() - started
                    except BlockingIOError:
                        pass
                    finally:
                        connection.setblocking(True)
                except OSError:  # reset by the server
                    closed_after = time.perf_counter() - started
                if closed_after is not None or time.perf_counter() - started > 6:
                    break
                time.sleep(0.2)
        assert closed_after is not None and 0.9 < closed_after < 4
        status, _ = raw_exchange(running, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200


def test_idle_connections_are_closed_and_connections_are_bounded(tiny_model, tokenizer, monkeypatch):
    import coevolve.policy.serve as serve

    monkeypatch.setattr(serve, "IDLE_TIMEOUT_SECONDS", 0.5)
    monkeypatch.setattr(serve, "MAX_CONNECTIONS", 2)
    with ChatServer(TransformersBackend(tiny_model, tokenizer), model_name="tiny") as running:
        host, port = running._httpd.server_address[:2]
        running._httpd.slots = threading.BoundedSemaphore(2)
        idle = [socket.create_connection((host, port), timeout=10) for _ in range(2)]
        for connection in idle:
            connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{")  # then silence
        time.sleep(0.2)
        status, payload = raw_exchange(running, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and "connections at once" in payload["error"]["message"]
        started = time.perf_counter()
        for connection in idle:  # the server closes each quiet connection after its idle timeout
            assert connection.recv(65536) == b""
        assert time.perf_counter() - started < 5
        for connection in idle:
            connection.close()
        time.sleep(0.2)
        status, _ = raw_exchange(running, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 200  # the slots came back
