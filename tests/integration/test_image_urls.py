"""Image URLs through the whole stack: a gateway with --image-hosts fetching from a real HTTP server on
127.0.0.1 (named by --image-hosts-private), a tokenizer and a worker of a tiny CLIP as processes. A fetched
image embeds as the same file sent inline; each hostile answer (a redirect, a 404, a body too large or too
slow, a compressed one, a host, port or address not allowed) is a clear 400 naming the input, and the stack
serves on; a gateway without the option refuses URLs, naming it."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import shlex
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.image_fetch import ImageFetcher, ImageHosts, Origin
from embedfleet.services.gateway.images import ImageUrl
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.nats.server import free_port
from tests.support.image_files import data_uri, encoded, noise
from tests.support.image_models import build_clip
from tests.support.nats_secrets import CertificateAuthority
from tests.support.procs import Service, healthy, running_fleet, wait_until

pytestmark = pytest.mark.integration

PREFIX = "image-urls"
MODEL = "clip"  # the docs' example names it
LIMIT = 100_000  # the fetching gateway's --max-image-bytes
SLOW_SECONDS = 3  # its --request-timeout: a fetch takes no longer
RNG = np.random.default_rng(3)
CAT, DOG = encoded(noise(64, 48, RNG)), encoded(noise(30, 50, RNG), "JPEG")


class ImageServer(ThreadingHTTPServer):
    """A host of images and of hostile answers; it counts the requests to each path and the most it served at once."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hits: Counter[str] = Counter()
        self.hosts: list[str] = []  # each request's Host header
        self.lock = threading.Lock()
        self.active = self.most = 0
        self.closing = threading.Event()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: ImageServer

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read the gateway's logs
        pass

    def do_GET(self) -> None:
        server, path = self.server, self.path
        with server.lock:
            server.hits[path] += 1
            server.hosts.append(self.headers.get("host", ""))
        if path in ("/cat.png", "/dog.jpg", "/text.txt"):
            self._send(200, {"cat.png": CAT, "dog.jpg": DOG, "text.txt": b"not an image at all"}[path[1:]])
        elif path == "/moved":
            self._send(302, b"", {"location": "/cat.png"})
        elif path == "/missing":
            self._send(404, b"no such image")
        elif path == "/huge.png":  # declares more than the limit: refused before the body is read
            self._send(200, CAT[:100], {"content-length": str(LIMIT * 10)})
        elif path == "/endless.png":  # no length: read until the limit cuts it off
            self.send_response(200)
            self.send_header("connection", "close")
            self.end_headers()
            self._drip(CAT[:8] + bytes(64 << 10), 400, 0)
        elif path == "/slow.png":  # a byte a second: the gateway's deadline ends it
            self.send_response(200)
            self.send_header("content-length", str(len(CAT)))
            self.end_headers()
            self._drip(CAT[:1], 30, 1.0)
        elif path == "/gzip.png":
            self._send(200, gzip.compress(CAT), {"content-encoding": "gzip"})
        elif path.startswith("/wait/"):  # held a while, to see several at once
            with server.lock:
                server.active += 1
                server.most = max(server.most, server.active)
            time.sleep(0.5)
            with server.lock:
                server.active -= 1
            self._send(200, CAT)
        else:
            self._send(404, b"")

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"content-length": str(len(body)), **(headers or {})}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, chunk: bytes, times: int, pause: float) -> None:
        try:
            for _ in range(times):
                if self.server.closing.wait(pause):
                    return
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:  # the gateway hung up: what is tested
            pass


@dataclass
class Stack:
    plain: str  # a gateway without --image-hosts
    fetching: str  # one with it
    images: ImageServer


@pytest.fixture(scope="module")
def stack(nats_url: str, tmp_path_factory) -> Iterator[Stack]:
    images = ImageServer()
    threading.Thread(target=images.serve_forever, daemon=True).start()
    folder = build_clip(tmp_path_factory.mktemp("clip-build"), shortest_edge=40)
    logs = tmp_path_factory.mktemp("image-url-logs")
    port = free_port()
    origin = images.origin
    args = ["--nats", nats_url, "--subject-prefix", PREFIX, "--port", str(port), "--max-inputs", "6"]
    hosts = f"{origin},{origin.replace('127.0.0.1', 'localhost')}"  # localhost: resolves to loopback, not private
    args += ["--image-hosts", hosts, "--image-hosts-private", "127.0.0.1", "--max-image-bytes", str(LIMIT)]
    gateway = Service("gateway", [*args, "--request-timeout", str(SLOW_SECONDS)], logs)
    try:
        with running_fleet(nats_url, PREFIX, {MODEL: folder}, logs, named=True, extra=[gateway]) as (url, _):
            fetching = f"http://127.0.0.1:{port}"
            wait_until(lambda: healthy(fetching), 60, "the fetching gateway", [gateway])
            yield Stack(url, fetching, images)
    finally:
        images.closing.set()
        images.shutdown()
        images.server_close()


def _embed(url: str, body: dict, path: str = "/v1/embeddings") -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": MODEL, **body}, timeout=60)


def _rows(reply: httpx.Response) -> np.ndarray:
    assert reply.status_code == 200, reply.text
    return np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)


def test_a_url_embeds_as_the_same_file_sent_inline_in_every_form(stack):
    base, at = stack.fetching, stack.images.origin
    hits = stack.images.hits["/cat.png"]
    inline = _rows(
        _embed(base, {"input": [{"image": data_uri(CAT)}, {"text": "a cat"}, {"image": data_uri(DOG, "image/jpeg")}]})
    )
    fetched = _rows(
        _embed(base, {"input": [{"image": f"{at}/cat.png"}, {"text": "a cat"}, {"image": f"{at}/dog.jpg"}]})
    )
    np.testing.assert_array_equal(fetched, inline)
    mixed = _rows(_embed(base, {"input": [{"image": data_uri(CAT)}, {"text": "a cat"}, {"image": f"{at}/dog.jpg"}]}))
    np.testing.assert_array_equal(mixed, inline)
    infinity = _rows(_embed(base, {"input": [f"{at}/dog.jpg", f"{at}/cat.png"], "modality": "image"}, "/embeddings"))
    np.testing.assert_array_equal(infinity, inline[[2, 0]])
    assert stack.images.hits["/cat.png"] == hits + 2 and set(stack.images.hosts) == {at.removeprefix("http://")}


def test_cohere_fetches_images_and_image_url_items_and_describes_them(stack):
    base, at = stack.fetching, stack.images.origin
    body: dict = {
        "images": [f"{at}/cat.png", data_uri(DOG, "image/jpeg")],
        "input_type": "image",
        "embedding_types": ["float"],
    }
    reply = _embed(base, body, "/v2/embed")
    assert reply.status_code == 200, reply.text
    assert [(i["width"], i["height"], i["format"]) for i in reply.json()["images"]] == [
        (64, 48, "png"),
        (30, 50, "jpeg"),
    ]
    inline = _rows(_embed(base, {"input": [{"image": data_uri(CAT)}, {"image": data_uri(DOG, "image/jpeg")}]}))
    np.testing.assert_array_equal(np.array(reply.json()["embeddings"]["float"], dtype=np.float32), inline)
    answers = []
    for image in (f"{at}/cat.png", data_uri(CAT)):  # image_url items beside a text: fetched, then inline
        items = [
            {"content": [{"type": "text", "text": "a cat"}]},
            {"content": [{"type": "image_url", "image_url": {"url": image}}]},
        ]
        body = {"inputs": items, "input_type": "search_document", "embedding_types": ["float"]}
        answers.append(_embed(base, body, "/v2/embed"))
        assert answers[-1].status_code == 200, answers[-1].text
    fetched, sent = (np.array(a.json()["embeddings"]["float"], dtype=np.float32) for a in answers)
    np.testing.assert_array_equal(fetched, sent)
    assert [(i["width"], i["height"]) for i in answers[0].json()["images"]] == [(64, 48)]


def test_a_requests_urls_are_fetched_side_by_side(stack):
    at = stack.images.origin
    reply = _embed(stack.fetching, {"input": [{"image": f"{at}/wait/{i}.png"} for i in range(4)]})
    assert len(_rows(reply)) == 4
    assert stack.images.most >= 2, "the four fetches ran one at a time"


def test_the_count_limit_holds_before_anything_is_fetched(stack):
    at = stack.images.origin
    reply = _embed(stack.fetching, {"input": [{"image": f"{at}/cat.png?n={i}"} for i in range(7)]})
    assert reply.status_code == 422 and "the limit is 6" in reply.json()["error"]["message"], reply.text
    assert not [path for path in stack.images.hits if path.startswith("/cat.png?n=")]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/moved", "answered 302 Found (to '/cat.png'): redirects are not followed"),
        ("/missing", "answered 404 Not Found, not the image"),
        ("/huge.png", f"is {LIMIT * 10} bytes, over the limit of {LIMIT} bytes (--max-image-bytes): not read further"),
        ("/endless.png", f"holds over {LIMIT} bytes, over the limit of {LIMIT} bytes (--max-image-bytes): not read further"),
        ("/slow.png", f"was not fetched within {SLOW_SECONDS} s"),
        ("/gzip.png", "answered a compressed body (Content-Encoding: gzip)"),
        ("/text.txt", "the image is not a PNG, JPEG, WebP or GIF file"),
        ("localhost", "the host 'localhost' resolves to"),  # loopback, and not named by --image-hosts-private
        ("other-port", "is not among the gateway's --image-hosts, which lists"),
        ("https", "is not among the gateway's --image-hosts, which lists"),
        ("user", "holds a user name or password (user@host): it is not fetched"),
        ("https://images.example.com/cat.png", "the host 'images.example.com' of 'https://images.example.com/cat.png' is not among the hosts the gateway's --image-hosts lists"),
    ],
    ids=["redirect", "404", "declared-huge", "endless", "slow", "gzip", "not-an-image", "private-address", "port", "scheme", "userinfo", "other-host"],
)  # fmt: skip
def test_hostile_urls_get_a_clear_400_and_the_stack_serves_on(stack, path, says):
    at = stack.images.origin
    url = {
        "localhost": f"{at.replace('127.0.0.1', 'localhost')}/cat.png",
        "other-port": f"http://127.0.0.1:{free_port()}/cat.png",
        "https": f"{at.replace('http://', 'https://')}/cat.png",
        "user": f"{at.replace('http://', 'http://me:pw@')}/cat.png",
    }.get(path, path if "://" in path else f"{at}{path}")
    started = time.monotonic()
    reply = _embed(stack.fetching, {"input": [{"image": url}, {"text": "fine"}]})
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert message.startswith("'input[0]': ") and says in message, message
    assert time.monotonic() - started < SLOW_SECONDS + 3
    cohere = _embed(stack.fetching, {"images": [url], "input_type": "image"}, "/v2/embed")
    assert cohere.status_code == 400 and says in cohere.json()["message"], cohere.text
    assert len(_rows(_embed(stack.fetching, {"input": [{"image": f"{at}/cat.png"}]}))) == 1


def test_without_the_option_a_url_is_refused_naming_it(stack):
    url = f"{stack.images.origin}/cat.png"
    hits = sum(stack.images.hits.values())
    reply = _embed(stack.plain, {"input": [{"text": "fine"}, {"image": url}]})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"] == (
        f"'input[1]': the URL '{url}' is not fetched: the gateway fetches images only from the hosts its "
        "--image-hosts option lists, and it lists none; send the image as a data URI (data:image/png;base64,...)"
    )
    cohere = _embed(
        stack.plain, {"inputs": [{"content": [{"type": "image_url", "image_url": {"url": url}}]}]}, "/v2/embed"
    )
    assert cohere.status_code == 400 and "--image-hosts" in cohere.json()["message"], cohere.text
    assert sum(stack.images.hits.values()) == hits


def test_the_docs_example_runs_as_written(stack):
    """docs/http-api.md's "Image URLs": its gateway flags make the hosts they say, and its curl, sent to the
    fetching gateway with the image host made this test's server, embeds the image as the file sent inline."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "http-api.md").read_text()
    section = page.split("### Image URLs", 1)[1].split("\n## ", 1)[0]
    (flags,) = re.findall(r"^embedfleet gateway (.*)$", section, re.M)
    cfg = GatewayConfig.from_namespace(
        build_parser().parse_args(["gateway", "--nats", "nats://x:1", *shlex.split(flags)])
    )
    hosts = ImageHosts.of(cfg.image_hosts, cfg.image_hosts_private)
    assert hosts.origins == {Origin("https", "images.example.com", 443), Origin("http", "cdn.internal", 8000)}
    assert hosts.private == {"cdn.internal"}
    (command,) = re.findall(r"^curl -s localhost:8080/v2/embed .*?'$", section, re.M | re.S)
    command = command.replace("localhost:8080", stack.fetching.removeprefix("http://"))
    done = subprocess.run(
        ["bash", "-c", command.replace("https://images.example.com", stack.images.origin)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert [(i["width"], i["height"], i["format"]) for i in answer["images"]] == [(64, 48, "png")], answer
    inline = _embed(stack.fetching, {"input_type": "image", "images": [data_uri(CAT)]}, "/v2/embed")
    assert answer["embeddings"] == inline.json()["embeddings"]


def test_https_goes_to_the_checked_address_with_the_name_as_sni_and_host(tmp_path):
    """A TLS server on 127.0.0.1 with a certificate for localhost (a CA of the test's own): a URL of localhost
    is fetched from the address the gateway resolved and checked (127.0.0.1, past ::1 where localhost has it
    and nothing listens), the name sent as SNI and Host and the certificate checked against it; the same
    server named by its address is refused, its certificate naming no address."""
    ca = CertificateAuthority(tmp_path)
    pem = ca.server("localhost")
    names: list[str | None] = []
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(pem.cert, pem.key)
    served.sni_callback = lambda sock, name, context: names.append(name)
    images = ImageServer()
    images.socket = served.wrap_socket(images.socket, server_side=True)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    port = images.server_address[1]
    trusted = ssl.create_default_context(cafile=str(ca.pem.cert))

    async def fetch(host: str) -> list:
        fetcher = ImageFetcher(ImageHosts.of([f"{host}:{port}"], [host]), ImageLimits(), 1 << 20)
        fetcher.open(verify=trusted)
        try:
            return await fetcher.checked([ImageUrl(0, f"https://{host}:{port}/cat.png", "input[0]")])
        finally:
            await fetcher.close()

    try:
        [(data, header)] = asyncio.run(fetch("localhost"))
        assert data == CAT and (header.width, header.height) == (64, 48)
        assert names == ["localhost"] and images.hosts == [f"localhost:{port}"]
        with pytest.raises(ApiError) as err:
            asyncio.run(fetch("127.0.0.1"))
        assert "connecting to https://127.0.0.1:" in err.value.message, err.value.message
        assert "CERTIFICATE_VERIFY_FAILED" in err.value.message, err.value.message
        assert images.hosts == [f"localhost:{port}"]  # nothing was asked of it
    finally:
        images.shutdown()
        images.server_close()
