"""services/gateway/image_fetch.py's checks, without a network: what --image-hosts takes, which URLs it lets
through (host, scheme, port, user info), which addresses it refuses, and that a refused URL is a 400 naming
the input before anything is fetched; images.py's split of a request's images into data URIs and URLs."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

from embedfleet.services.cli.main import build_parser
from embedfleet.services.gateway.cohere.api import parse_embed, with_fetched
from embedfleet.services.gateway.config import GatewayConfig
from embedfleet.services.gateway.http.errors import ApiError
from embedfleet.services.gateway.image_fetch import (
    ImageFetcher,
    ImageHosts,
    Origin,
    Target,
    address_refused,
    addresses,
    origin_of,
)
from embedfleet.services.gateway.images import ImageUrl, checked_file, placed, sources
from embedfleet.services.gateway.inputs import Inputs, Limits
from embedfleet.services.gateway.openai.api import parse_embeddings_request
from embedfleet.services.gateway.tei.api import parse_embed_all, read_embed_all
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.images.decode import ImageError, ImageLimits
from tests.support.image_files import data_uri, encoded, noise

LIMITS = Limits(max_inputs=4, max_input_chars=100)
HOSTS = ImageHosts.of(["Images.Example.com", "cdn.example.com:8443", "http://store.internal:8000", "127.0.0.1"])


@pytest.mark.parametrize(
    ("entry", "origin"),
    [
        ("images.example.com", Origin("https", "images.example.com", 443)),
        (" IMAGES.Example.COM. ", Origin("https", "images.example.com", 443)),
        ("images.example.com:8443", Origin("https", "images.example.com", 8443)),
        ("https://images.example.com", Origin("https", "images.example.com", 443)),
        ("HTTP://store.internal", Origin("http", "store.internal", 80)),
        ("http://store.internal:8000", Origin("http", "store.internal", 8000)),
        ("[::1]:8443", Origin("https", "::1", 8443)),
        ("10.0.0.7", Origin("https", "10.0.0.7", 443)),
    ],
)
def test_an_entry_is_a_scheme_host_and_port(entry, origin):
    assert origin_of(entry) == origin


@pytest.mark.parametrize(
    "entry",
    [
        "images.example.com/cats",
        "user@images.example.com",
        "*.example.com",
        ".example.com",
        "ftp://images.example.com",
        "images.example.com:99999",
        "images.example.com:https",
        "https://",
        "bücher.example",
    ],
)
def test_an_entry_that_is_not_a_host_is_refused_naming_it(entry):
    with pytest.raises(ConfigError) as err:
        origin_of(entry)
    assert str(err.value).startswith(f"--image-hosts {entry!r}: an entry of --image-hosts is a host name"), err.value


def test_the_private_hosts_are_hosts_of_the_list():
    assert ImageHosts.of(["http://127.0.0.1:8000", "a.example"], ["127.0.0.1"]).private == frozenset({"127.0.0.1"})
    with pytest.raises(ConfigError, match=r"--image-hosts-private names hosts of --image-hosts .*; b\.example is not"):
        ImageHosts.of(["a.example"], ["b.example"])
    with pytest.raises(ConfigError, match=r"http://127\.0\.0\.1:8000 is not one"):  # a host, not an entry
        ImageHosts.of(["http://127.0.0.1:8000"], ["http://127.0.0.1:8000"])


def test_the_gateway_config_takes_both_options_and_says_a_bad_one_at_once():
    args = ["gateway", "--nats", "nats://127.0.0.1:4222", "--image-hosts", "a.example, http://127.0.0.1:9000"]
    cfg = GatewayConfig.from_namespace(build_parser().parse_args([*args, "--image-hosts-private", "127.0.0.1"]))
    assert (cfg.image_hosts, cfg.image_hosts_private) == (("a.example", "http://127.0.0.1:9000"), ("127.0.0.1",))
    with pytest.raises(ConfigError, match=r"--image-hosts 'a\.example/x'"):
        GatewayConfig.from_namespace(build_parser().parse_args([*args[:4], "a.example/x"]))
    plain = GatewayConfig.from_namespace(build_parser().parse_args(args[:3]))
    assert (plain.image_hosts, plain.image_hosts_private) == ((), ())


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("https://images.example.com/cat.png", Target(Origin("https", "images.example.com", 443), "/cat.png")),
        ("HTTPS://IMAGES.example.com:443/a/b.png?size=2#top", Target(Origin("https", "images.example.com", 443), "/a/b.png?size=2")),
        ("https://cdn.example.com:8443", Target(Origin("https", "cdn.example.com", 8443), "/")),
        ("http://store.internal:8000/x%20y.jpg", Target(Origin("http", "store.internal", 8000), "/x%20y.jpg")),
        ("https://127.0.0.1/a.png", Target(Origin("https", "127.0.0.1", 443), "/a.png")),
    ],
)  # fmt: skip
def test_a_url_of_a_listed_host_scheme_and_port_is_let_through(url, target):
    assert HOSTS.target(url) == target


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://evil.example/cat.png", "the host 'evil.example' of 'https://evil.example/cat.png' is not among the hosts the gateway's --image-hosts lists"),
        ("https://images.example.com.evil.example/a.png", "the host 'images.example.com.evil.example'"),
        ("https://images.example.com:8443/a.png", "https://images.example.com:8443 is not among the gateway's --image-hosts, which lists https://images.example.com for 'images.example.com'"),
        ("http://images.example.com/a.png", "http://images.example.com is not among the gateway's --image-hosts"),
        ("https://store.internal:8000/a.png", "which lists http://store.internal:8000 for 'store.internal'"),
        ("http://store.internal/a.png", "http://store.internal is not among"),
        ("https://user:secret@images.example.com/a.png", "holds a user name or password (user@host): it is not fetched"),
        ("https://images.example.com@evil.example/a.png", "holds a user name or password"),
        ("ftp://images.example.com/a.png", "only https:// URLs are (and http:// ones from a host --image-hosts lists as http://host)"),
        ("file:///etc/passwd", "only https:// URLs are"),
        ("https://images.example.com/a b.png", "holds spaces, control or non-ASCII characters"),
        ("https://images.example.com/\n.png", "holds spaces, control or non-ASCII characters"),
        ("https://images.example.com:99999/a.png", "has an invalid port"),
        ("https://[::1]/a.png", "the host '::1'"),
        ("https:///a.png", "names no host"),
    ],
)  # fmt: skip
def test_any_other_url_is_refused_naming_why(url, says):
    with pytest.raises(ImageError) as err:
        HOSTS.target(url)
    assert says in str(err.value), err.value


def test_without_hosts_no_url_is_fetched_and_the_message_names_the_option():
    with pytest.raises(ImageError) as err:
        ImageHosts().target("https://images.example.com/cat.png")
    assert str(err.value) == (
        "the URL 'https://images.example.com/cat.png' is not fetched: the gateway fetches images only from the "
        "hosts its --image-hosts option lists, and it lists none; send the image as a data URI "
        "(data:image/png;base64,...)"
    )


@pytest.mark.parametrize(
    ("address", "refused", "private"),
    [
        ("93.184.216.34", None, None),
        ("2606:4700:4700::1111", None, None),
        ("127.0.0.1", "a loopback address", None),
        ("::1", "a loopback address", None),
        ("10.1.2.3", "a private address", None),
        ("172.16.0.9", "a private address", None),
        ("192.168.1.1", "a private address", None),
        ("169.254.169.254", "a link-local address", None),  # cloud metadata
        ("fe80::1%eth0", "a link-local address", None),
        ("fd00::5", "a private address", None),
        ("::ffff:10.0.0.1", "a private address", None),  # IPv4-mapped: reaches 10.0.0.1
        ("100.64.0.1", "a non-public address", None),  # carrier-grade NAT
        ("224.0.0.1", "a multicast address", "a multicast address"),
        ("ff02::1", "a multicast address", "a multicast address"),
        ("0.0.0.0", "the unspecified address", "the unspecified address"),
        ("::", "the unspecified address", "the unspecified address"),
    ],
)
def test_an_address_is_refused_unless_public_or_the_host_is_named_private(address, refused, private):
    assert address_refused(address, private=False) == refused
    assert address_refused(address, private=True) == private


def test_a_host_that_resolves_to_a_loopback_address_is_refused_unless_named_private():
    origin = Origin("http", "127.0.0.1", 8000)  # an address: getaddrinfo answers it without asking DNS
    with pytest.raises(ImageError) as err:
        asyncio.run(addresses(origin, private=False))
    assert str(err.value) == (
        "the host '127.0.0.1' resolves to 127.0.0.1, a loopback address: images are not fetched from it "
        "(--image-hosts-private may name a host of the gateway's own network)"
    )
    assert asyncio.run(addresses(origin, private=True)) == ["127.0.0.1"]


PNG = data_uri(encoded(noise(3, 2, np.random.default_rng(0))))


def test_a_refused_url_is_a_400_naming_the_input_before_anything_is_fetched():
    """The fetcher is never opened here: a refused URL must not reach the network (no client, no lookup)."""
    fetcher = ImageFetcher(HOSTS, ImageLimits(), 1 << 20)
    urls = [
        ImageUrl(0, "https://images.example.com/a.png", "input[0]"),
        ImageUrl(1, "https://evil.example/b.png", "input[2]"),
    ]
    with pytest.raises(ApiError) as err:
        asyncio.run(fetcher.checked(urls))
    assert (err.value.code, err.value.param) == (ErrorCode.INVALID_REQUEST, "input")
    assert err.value.message.startswith("'input[2]': the host 'evil.example'"), err.value.message
    assert err.value.response("/v1/embeddings").status_code == 400
    none = ImageFetcher(ImageHosts(), ImageLimits(), 1 << 20)
    with pytest.raises(ApiError, match=r"^'images\[1\]': the URL .* --image-hosts option lists, and it lists none"):
        asyncio.run(none.checked([ImageUrl(0, "https://a.example/x.png", "images[1]")]))


def test_the_budget_of_a_request_is_at_least_one_image():
    assert ImageFetcher(HOSTS, ImageLimits(max_bytes=5000), 1000).max_total == 5000
    assert ImageFetcher(HOSTS, ImageLimits(max_bytes=5000), 9000).max_total == 9000
    assert ImageFetcher(HOSTS, ImageLimits(), 1000, timeout=60).timeout == 10  # at most FETCH_SECONDS
    assert ImageFetcher(HOSTS, ImageLimits(), 1000, timeout=2).timeout == 2  # --request-timeout shorter


def test_a_requests_images_split_into_data_uris_checked_now_and_urls_kept_in_place():
    uris = ["https://a.example/1.png", PNG, "http://b.example/2.png", PNG]
    checked, urls = sources(uris, [f"input[{i}]" for i in (0, 2, 5, 6)], ImageLimits())
    assert [(h.width, h.height) for _, h in checked] == [(3, 2), (3, 2)]
    assert urls == (ImageUrl(0, uris[0], "input[0]"), ImageUrl(2, uris[2], "input[5]"))
    assert placed(["d1", "d3"], urls, ["u0", "u2"]) == ["u0", "d1", "u2", "d3"]
    assert placed([], urls[:1], ["u0"]) == ["u0"]
    with pytest.raises(ApiError, match=r"^'input\[6\]': .*base64"):  # a bad data URI is still refused at once
        sources([uris[0], "data:image/png;base64,!!"], ["input[0]", "input[6]"], ImageLimits())


def test_each_route_keeps_the_urls_of_its_images_for_the_serving_step():
    url = "https://a.example/1.png"
    jina = parse_embeddings_request(
        orjson.dumps({"model": "m", "input": [{"text": "t"}, {"image": url}, {"image": PNG}]}), LIMITS
    )
    assert (jina.image_rows, jina.image_urls) == ((1, 2), (ImageUrl(0, url, "input[1]"),))
    assert jina.images is not None and jina.images.count == 1 and jina.inputs.texts == ["t"]
    infinity = parse_embeddings_request(orjson.dumps({"model": "m", "input": [url], "modality": "image"}), LIMITS)
    assert infinity.images == Inputs([], None, []) and infinity.image_urls == (ImageUrl(0, url, "input[0]"),)
    tei = parse_embed_all(
        read_embed_all(orjson.dumps({"inputs": [{"image": PNG}, {"image": url}]})), LIMITS, ("tokens",)
    )
    assert tei.image_rows == (0, 1) and tei.image_urls == (ImageUrl(1, url, "inputs[1]"),)
    items = [
        {"content": [{"type": "text", "text": "t"}]},
        {"content": [{"type": "image_url", "image_url": {"url": url}}]},
    ]
    cohere = parse_embed(orjson.dumps({"inputs": items}), LIMITS, 2)
    assert cohere.image_rows == (1,) and cohere.image_urls == (ImageUrl(0, url, "inputs[1]"),) and cohere.sizes == ()
    with pytest.raises(ApiError) as err:  # the count first: nothing is kept, nor fetched, past the limit
        parse_embeddings_request(orjson.dumps({"model": "m", "input": [url] * 5, "modality": "image"}), LIMITS)
    assert err.value.code == ErrorCode.TOO_MANY_INPUTS


def test_cohere_puts_fetched_files_and_their_sizes_in_place():
    url = "https://a.example/1.png"
    req = parse_embed(orjson.dumps({"images": [url, PNG], "input_type": "image"}), LIMITS, 2)
    wide = encoded(noise(7, 5, np.random.default_rng(1)))
    done = with_fetched(req, [checked_file(wide, "images[0]", ImageLimits())])
    assert done.images is not None and done.images.images is not None and done.images.images[0] == wide
    assert [(s.width, s.height) for s in done.sizes] == [(7, 5), (3, 2)] and done.image_urls == ()
