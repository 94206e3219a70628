"""kitoken's path of the tokenizer against HF tokenizers: the same token IDs, or HF tokenizers serves."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.fast_charset import DIVERGENT
from embedfleet.services.tokenizer.fast_check import KITOKEN, TOKENIZERS, choose, corpus
from embedfleet.services.tokenizer.fast_encoder import Charset, unsupported
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.corpus import long_texts, mixed_texts

if sys.platform != "linux":  # the test extra installs kitoken on Linux only: there, its absence fails these tests
    pytest.importorskip("kitoken", reason="the extra 'fast-tokenizer' is not installed")

ROOT = Path(__file__).resolve().parents[2]


def _random_text(rng: random.Random) -> str:
    """Words of code points from every plane and category, divergent ones included."""
    blocks = [
        (0x20, 0x7E),
        (0x0, 0x1F),
        (0x80, 0x24F),
        (0x300, 0x36F),
        (0x370, 0x4FF),
        (0x590, 0x6FF),
        (0x900, 0xE7F),
        (0x2000, 0x206F),
        (0x3000, 0x30FF),
        (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3),
        (0xE000, 0xF8FF),
        (0xFE00, 0xFFFF),
        (0x1F300, 0x1FAFF),
        (0x20000, 0x2A6DF),
        (0xE0000, 0xE007F),
        (0x10000, 0x10FFFF),
    ]
    out = []
    for _ in range(rng.choice([1, 3, 10, 40, 200])):
        r = rng.random()
        if r < 0.15:
            out.append(" ")
        elif r < 0.2:
            out.append(rng.choice(["[CLS]", "[SEP]", "[MASK]", "[cls]", "##", "\u200d", "\r\n", "\t", "Σ"]))
        else:
            c = rng.randint(*rng.choice(blocks))
            out.append(chr(0x41 if 0xD800 <= c <= 0xDFFF else c))
    return "".join(out)


def test_kitoken_is_installed_with_the_test_extra():
    import importlib.util

    assert importlib.util.find_spec("kitoken") is not None, (
        "pip install -e '.[test]' (kitoken, the extra 'fast-tokenizer')"
    )


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rng = random.Random(7)
    return [*mixed_texts(800), *long_texts(40), *corpus(), *(_random_text(rng) for _ in range(1500))]


@pytest.fixture(scope="module")
def encoders(model_info) -> tuple[TextEncoder, TextEncoder]:
    """(kitoken's, HF tokenizers') encoders of the model."""
    fast, slow = TextEncoder(model_info), TextEncoder(model_info)
    assert choose(fast, model_info.path, "auto") == KITOKEN
    assert choose(slow, model_info.path, "off") == TOKENIZERS
    return fast, slow


@pytest.mark.parametrize("truncate,direction", [(True, "right"), (True, "left"), (False, "right")])
def test_the_same_ids_as_tokenizers(encoders, texts, truncate, direction):
    fast, slow = encoders
    got = fast._encode(texts, truncate, direction)
    want = slow._encode(texts, truncate, direction)
    differ = [(t[:60], g[:10], w[:10]) for t, g, w in zip(texts, got, want) if g != w]
    assert not differ, differ[:3]
    assert max(map(len, got)) == (256 if truncate else max(map(len, want)))


def test_kitoken_itself_tokenizes_most_texts(encoders, texts):
    """The texts above go mostly through kitoken (else their identity would prove little): its own
    content tokens, for every text free of divergent code points, are tokenizers' own."""
    fast, slow = encoders
    mine = [t for t in texts if fast.fast.agrees(t)]
    assert len(mine) >= 0.6 * len(texts), (len(mine), len(texts))
    assert sum(fast.fast.agrees(t) for t in mixed_texts(800)) == 800
    reference = slow._by_mode["none"].encode_batch(mine, add_special_tokens=False)
    assert fast.fast.content(mine) == [e.ids for e in reference]


def test_texts_with_divergent_code_points_are_tokenized_by_tokenizers(encoders):
    fast, slow = encoders
    texts = ["new \u0378 code point", "ΟΔΥΣΣΕΥΣ", "a\u061db", "plain text"]
    sent: list[str] = []

    def reference(rest: list[str]) -> list[list[int]]:
        sent.extend(rest)
        return slow._encode_hf(rest, True, "right")

    assert fast.fast.encode(texts, "right", reference) == slow._encode(texts, True, "right")
    assert sent == texts[:3]
    # kitoken alone differs on each of them: the reason they go to tokenizers
    for text in texts[:3]:
        assert fast.fast.content([text]) != slow._by_mode["none"].encode(text, add_special_tokens=False).ids


def test_charset_is_the_table():
    charset, inside = Charset(), set()
    for a, b in DIVERGENT:
        inside.update(range(a, b + 1))
    points = [*range(0x10000), *(c for a, b in DIVERGENT for c in (a - 1, a, b, b + 1)), 0x1F600, 0x1FAE0, 0xE0041]
    wrong = [
        hex(c)
        for c in points
        if 0 <= c <= 0x10FFFF
        and not 0xD800 <= c <= 0xDFFF
        and (charset.holds(f"ab {chr(c)} é😀"), charset.holds(f"😀 {chr(c)}")) != (c in inside, c in inside)
    ]
    assert not wrong, wrong[:10]
    assert (
        not charset.holds("plain ascii") and not charset.holds("Ünïcödé 中文 😀") and charset.holds("emoji \U000e0000")
    )


def _folder(model_info, tmp_path: Path, edit) -> Path:
    """A copy of the model folder (weights linked) whose tokenizer.json ``edit`` changed."""
    folder = tmp_path / "model"
    shutil.copytree(model_info.path, folder, copy_function=_link_weights)
    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text())
    edit(spec)
    path.write_text(json.dumps(spec))
    return folder


def _link_weights(src: str, dst: str) -> None:
    if src.endswith((".json", ".txt")):
        shutil.copy2(src, dst)
    else:
        Path(dst).symlink_to(src)


def _served_by(folder: Path, mode: str = "auto") -> tuple[str, TextEncoder]:
    encoder = TextEncoder(load_model_info(str(folder)))
    return choose(encoder, folder, mode), encoder


def test_a_tokenizer_json_the_check_fails_on_is_served_by_tokenizers(model_info, tmp_path, caplog):
    """No [UNK] in the vocabulary: both libraries raise on the corpus's unknown characters; the service
    still starts, with tokenizers."""
    folder = _folder(model_info, tmp_path, lambda spec: spec["model"]["vocab"].pop("[UNK]"))
    with caplog.at_level("INFO", "embedfleet.tokenizer"):
        path, encoder = _served_by(folder)
    assert (path, encoder.fast) == (TOKENIZERS, None)
    assert "the check failed: WordPiece error: Missing [UNK] token from the vocabulary" in caplog.text
    assert encoder.encode(["hello world"]) == [[101, 7592, 2088, 102]]


def test_a_tokenizer_json_kitoken_gets_wrong_is_served_by_tokenizers(model_info, tmp_path, caplog):
    """A special token written over a word's ID: kitoken matches it in the text, tokenizers does not."""

    def edit(spec: dict) -> None:
        spec["added_tokens"].append(
            {
                "id": 1037,
                "special": True,
                "content": "hello",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
            }
        )

    folder = _folder(model_info, tmp_path, edit)
    with caplog.at_level("INFO", "embedfleet.tokenizer"):
        path, encoder = _served_by(folder)
    assert (path, encoder.fast) == (TOKENIZERS, None)
    assert "instead of" in caplog.text and "kitoken cannot stand in" in caplog.text


def test_a_tokenizer_of_another_kind_is_served_by_tokenizers(model_info, tmp_path):
    folder = _folder(model_info, tmp_path, lambda spec: spec["normalizer"].update(lowercase=False))
    assert unsupported(folder / "tokenizer.json").startswith("the normalizer is not an uncased BertNormalizer")
    assert _served_by(folder)[0] == TOKENIZERS


def test_off_uses_tokenizers(model_info):
    encoder = TextEncoder(model_info)
    assert choose(encoder, model_info.path, "off") == TOKENIZERS and encoder.fast is None


def test_without_kitoken_installed_tokenizers_serves():
    """kitoken is optional: with it unimportable the service's choice is tokenizers, and encoding works."""
    code = (
        "import sys; sys.modules['kitoken'] = None\n"
        "from embedfleet.services.tokenizer.encoder import TextEncoder\n"
        "from embedfleet.services.tokenizer.fast_check import choose\n"
        "from embedfleet.shared.model_dir.load import load_model_info\n"
        "info = load_model_info(None); e = TextEncoder(info)\n"
        "print(choose(e, info.path, 'auto'), e.encode(['hello world']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tokenizers [[101, 7592, 2088, 102]]"


@pytest.mark.parametrize(
    "flag, env, path",
    [
        ([], None, KITOKEN),
        ([], "off", TOKENIZERS),
        (["--fast-tokenizer", "off"], "auto", TOKENIZERS),
        (["--fast-tokenizer", "auto"], "off", KITOKEN),
    ],
)
def test_the_service_serves_the_path_its_option_asks_for(monkeypatch, flag, env, path):
    """--fast-tokenizer and EMBEDFLEET_FAST_TOKENIZER, through the CLI's parser and config, to the service."""
    from embedfleet.services.cli.main import build_parser
    from embedfleet.services.tokenizer.config import TokenizerConfig
    from embedfleet.services.tokenizer.service import TokenizerService

    if env is None:
        monkeypatch.delenv("EMBEDFLEET_FAST_TOKENIZER", raising=False)
    else:
        monkeypatch.setenv("EMBEDFLEET_FAST_TOKENIZER", env)
    cfg = TokenizerConfig.from_namespace(
        build_parser().parse_args(["tokenizer", "--nats", "nats://127.0.0.1:4222", *flag])
    )
    service = TokenizerService(None, cfg)  # no NATS until start()
    assert service.tokenizer_path == path
    assert (service._encoder.fast is not None) == (path == KITOKEN)


def test_a_fast_tokenizer_value_outside_its_choices_is_refused(capsys):
    from embedfleet.services.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["tokenizer", "--fast-tokenizer", "on"])
    assert "invalid choice: 'on' (choose from 'auto', 'off')" in capsys.readouterr().err
