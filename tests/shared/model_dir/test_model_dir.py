import json
import shutil
from pathlib import Path

import pytest

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.info import same_model
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.model_dir.stack import DenseSpec


def test_default_model_reads_sentence_transformers_configs(model_info):
    assert model_info.id == "all-MiniLM-L6-v2"
    # tokenizer.json says 128; the real limit is sentence_bert_config.json's max_seq_length
    assert model_info.max_seq_length == 256
    assert model_info.pooling == "mean"
    assert model_info.normalize is True
    assert model_info.dim == 384
    assert model_info.vocab_size == 30522


def _copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    return dst


def test_cls_pooling_without_normalize(model_info, tmp_path):
    folder = _copy_model(model_info.path, tmp_path / "my-model")
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    modules = [m for m in json.loads((folder / "modules.json").read_text()) if not m["type"].endswith("Normalize")]
    (folder / "modules.json").write_text(json.dumps(modules))
    info = load_model_info(str(folder))
    assert (info.id, info.pooling, info.normalize) == ("my-model", "cls", False)
    assert load_model_info(str(folder), "custom-name").id == "custom-name"


def test_xlm_roberta_limit_accounts_for_position_offset(model_info, tmp_path):
    folder = _copy_model(model_info.path, tmp_path / "xlmr")
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "xlm-roberta", "pad_token_id": 1, "max_position_embeddings": 514}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1024}))
    assert load_model_info(str(folder)).max_seq_length == 512


def test_missing_folder_and_files_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="is not a folder"):
        load_model_info(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=r"config.json is missing"):
        load_model_info(str(tmp_path))


def test_unsupported_pooling_is_refused(model_info, tmp_path):
    folder = _copy_model(model_info.path, tmp_path / "m")
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "attention"}))
    with pytest.raises(ConfigError, match="pooling mode 'attention' is not supported"):
        load_model_info(str(folder))


def test_model_aliases():
    assert same_model("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    assert same_model("all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
    assert not same_model("all-MiniLM-L12-v2", "all-MiniLM-L6-v2")


# --- the sentence-transformers module stack (modules.json), on folders written by hand -----------

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}
POOLING = {
    "idx": 1,
    "name": "1",
    "path": "1_Pooling",
    "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
}
NORMALIZE_TYPE = "sentence_transformers.base.modules.normalize.Normalize"
DENSE_TYPE = "sentence_transformers.base.modules.dense.Dense"


def _st_folder(model_info, tmp_path: Path, modules: list[dict], pooling: dict | None = None) -> Path:
    """The default model's JSON files (no weights) with ``modules`` as modules.json."""
    folder = _copy_model(model_info.path, tmp_path / "st")
    (folder / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


def _dense(folder: Path, name: str, config: dict, weights: str = "model.safetensors") -> dict:
    (folder / name).mkdir()
    (folder / name / "config.json").write_text(json.dumps(config))
    (folder / name / weights).write_bytes(b"not read at load")
    return {"idx": 2, "name": name, "path": name, "type": DENSE_TYPE}


def _stack_with_dense(model_info, tmp_path: Path, **dense_config) -> Path:
    folder = _st_folder(model_info, tmp_path, [])
    dense = _dense(folder, "2_Dense", {"in_features": 384, "out_features": 32} | dense_config)
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, POOLING, dense]))
    return folder


@pytest.mark.parametrize(
    ("pooling", "mode"),
    [
        ({"embedding_dimension": 384, "pooling_mode": "cls", "include_prompt": True}, "cls"),
        ({"embedding_dimension": 384, "pooling_mode": "max"}, "max"),
        ({"embedding_dimension": 384, "pooling_mode": "mean_sqrt_len_tokens"}, "mean_sqrt_len"),
        ({"embedding_dimension": 384, "pooling_mode": ["weightedmean"]}, "weightedmean"),
        ({"embedding_dimension": 384, "pooling_mode": "lasttoken"}, "lasttoken"),
        ({"word_embedding_dimension": 384, "pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}, "max"),
        ({"word_embedding_dimension": 384, "pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len"),
        ({"word_embedding_dimension": 384, "pooling_mode_weightedmean_tokens": True}, "weightedmean"),
        ({"word_embedding_dimension": 384, "pooling_mode_lasttoken": True}, "lasttoken"),
        ({"word_embedding_dimension": 384, "pooling_mode_mean_tokens": False}, "mean"),  # none set: ST's default
    ],
)
def test_pooling_modes_from_both_config_formats(model_info, tmp_path, pooling, mode):
    folder = _st_folder(model_info, tmp_path, [TRANSFORMER, POOLING], pooling)
    info = load_model_info(str(folder))
    assert (info.pooling, info.include_prompt, info.dim, info.dense, info.normalize) == (mode, True, 384, (), False)


def test_dense_layers_set_the_output_dimension(model_info, tmp_path):
    folder = _st_folder(model_info, tmp_path, [])
    first = _dense(
        folder,
        "2_Dense",
        {
            "in_features": 384,
            "out_features": 128,
            "bias": True,
            "activation_function": "torch.nn.modules.activation.Tanh",
        },
    )
    second = _dense(
        folder,
        "3_Dense",
        {
            "in_features": 128,
            "out_features": 64,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
        },
    )
    normalize = {"idx": 4, "name": "4", "path": "4_Normalize", "type": NORMALIZE_TYPE}
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, POOLING, first, second, normalize]))
    info = load_model_info(str(folder))
    assert info.dense == (
        DenseSpec(
            path=folder / "2_Dense" / "model.safetensors",
            in_features=384,
            out_features=128,
            bias=True,
            activation="tanh",
        ),
        DenseSpec(
            path=folder / "3_Dense" / "model.safetensors",
            in_features=128,
            out_features=64,
            bias=False,
            activation="identity",
        ),
    )
    assert (info.dim, info.pooled_dim, info.normalize, info.pooling) == (64, 384, True, "mean")


def test_legacy_module_type_names_are_read(model_info, tmp_path):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    info = load_model_info(str(_st_folder(model_info, tmp_path, modules)))
    assert (info.pooling, info.normalize, info.dim) == ("mean", True, 384)


def test_prompts_default_prompt_and_truncate_dim(model_info, tmp_path):
    folder = _st_folder(model_info, tmp_path, [TRANSFORMER, POOLING])
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps(
            {"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": "query", "truncate_dim": 128}
        )
    )
    info = load_model_info(str(folder))
    assert (info.prompts, info.default_prompt, info.truncate_dim) == (
        {"query": "query: ", "document": ""},
        "query",
        128,
    )
    assert (model_info.default_prompt, model_info.truncate_dim, model_info.include_prompt) == (None, None, True)


def _refused(folder: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_model_info(str(folder))
    return str(caught.value)


def test_unknown_module_type_is_refused(model_info, tmp_path):
    layer_norm = {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}
    folder = _st_folder(model_info, tmp_path, [TRANSFORMER, POOLING, layer_norm])
    assert _refused(folder) == (
        "modules.json module 'sentence_transformers.models.LayerNorm' (2_LayerNorm) is not supported; "
        "supported: Transformer, Pooling, Dense, Normalize"
    )


def test_custom_code_module_is_refused(model_info, tmp_path):
    custom = {"idx": 0, "name": "0", "path": "", "type": "custom_st.Transformer"}
    assert "module 'custom_st.Transformer' () is not supported" in _refused(
        _st_folder(model_info, tmp_path, [custom, POOLING])
    )


def test_jinas_own_transformer_module_is_taken_for_a_model_with_task_adapters(model_info, tmp_path):
    """jina-embeddings-v3's modules.json runs custom_st.Transformer (its forward passes a task on):
    taken where config.json lists task adapters, still refused elsewhere."""
    custom = {"idx": 0, "name": "transformer", "path": "", "type": "custom_st.Transformer", "kwargs": ["task"]}
    folder = _st_folder(model_info, tmp_path, [custom, POOLING])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "lora_adaptations": ["retrieval.query", "separation"]}))
    info = load_model_info(str(folder))
    assert info.adapters == ("retrieval.query", "separation") and info.pooling == "mean"


def test_modules_out_of_order_are_refused(model_info, tmp_path):
    folder = _st_folder(model_info, tmp_path, [])
    dense = _dense(folder, "3_Dense", {"in_features": 384, "out_features": 32})
    normalize = {"idx": 2, "name": "2", "path": "2_Normalize", "type": NORMALIZE_TYPE}
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, POOLING, normalize, dense]))
    assert (
        "modules.json runs Transformer -> Pooling -> Normalize -> Dense: only Transformer -> Pooling -> Dense"
        in _refused(folder)
    )
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, dense]))  # a Dense with nothing pooled
    assert "modules.json runs Transformer -> Dense: only" in _refused(folder)
    (folder / "modules.json").write_text(json.dumps([POOLING, TRANSFORMER]))
    assert "modules.json runs Pooling -> Transformer: only" in _refused(folder)


@pytest.mark.parametrize(
    ("pooling", "named"),
    [
        (
            {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True},
            "pooling modes pooling_mode_cls_token, pooling_mode_mean_tokens are set together",
        ),
        ({"pooling_mode": ["mean", "max"]}, "pooling modes mean, max are set together"),
    ],
)
def test_several_pooling_modes_are_refused(model_info, tmp_path, pooling, named):
    message = _refused(_st_folder(model_info, tmp_path, [TRANSFORMER, POOLING], pooling))
    assert named in message and "only one pooling mode is supported" in message


def test_include_prompt_false_is_read(model_info, tmp_path):
    pooling = {"embedding_dimension": 384, "pooling_mode": "mean", "include_prompt": False}
    assert (
        load_model_info(str(_st_folder(model_info, tmp_path, [TRANSFORMER, POOLING], pooling))).include_prompt is False
    )


def test_dense_weights_only_as_pickle_are_refused(model_info, tmp_path):
    folder = _st_folder(model_info, tmp_path, [])
    dense = _dense(folder, "2_Dense", {"in_features": 384, "out_features": 32}, weights="pytorch_model.bin")
    (folder / "modules.json").write_text(json.dumps([TRANSFORMER, POOLING, dense]))
    assert "holds its Dense weights only as pytorch_model.bin: only safetensors are loaded" in _refused(folder)
    (folder / "2_Dense" / "pytorch_model.bin").unlink()
    assert (
        _refused(folder)
        == f"{folder / '2_Dense' / 'model.safetensors'} is missing (the weights of a Dense module in modules.json)"
    )


def test_unsupported_dense_activation_is_refused(model_info, tmp_path):
    folder = _stack_with_dense(model_info, tmp_path, activation_function="torch.nn.modules.activation.LeakyReLU")
    assert "Dense activation_function 'torch.nn.modules.activation.LeakyReLU' is not supported" in _refused(folder)


def test_dense_missing_activation_is_tanh_as_in_sentence_transformers(model_info, tmp_path):
    assert load_model_info(str(_stack_with_dense(model_info, tmp_path))).dense[0].activation == "tanh"


def test_dense_options_that_change_the_math_are_refused(model_info, tmp_path):
    assert "Dense with use_residual=true is not supported" in _refused(
        _stack_with_dense(model_info, tmp_path / "a", use_residual=True)
    )
    assert "Dense with module_input_name='token_embeddings' is not supported" in _refused(
        _stack_with_dense(model_info, tmp_path / "b", module_input_name="token_embeddings")
    )
    assert "Dense in_features 300 != its input's dimension 384" in _refused(
        _stack_with_dense(model_info, tmp_path / "c", in_features=300)
    )


def test_default_prompt_must_be_a_prompt(model_info, tmp_path):
    folder = _st_folder(model_info, tmp_path, [TRANSFORMER, POOLING])
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "q: "}, "default_prompt_name": "doc"})
    )
    assert "default_prompt_name 'doc' is not one of its prompts (query)" in _refused(folder)


# --- decoders and long-context encoders without sentence-transformers files --------------------


def _hf_folder(tmp_path: Path, config: dict, tokenizer: dict | None = None, st: dict | None = None) -> Path:
    folder = tmp_path / config["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if tokenizer is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    if st is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps(st))
    return folder


QWEN3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 1024,
    "vocab_size": 151669,
    "max_position_embeddings": 40960,
}
HUGE = 1000000000000000019884624838656  # transformers' "no limit" model_max_length


@pytest.mark.parametrize(
    ("config", "tokenizer", "st", "limit", "pooling"),
    [
        (QWEN3, {"model_max_length": 131072}, None, 40960, "lasttoken"),
        (QWEN3, {"model_max_length": 131072}, {"max_seq_length": 32768}, 32768, "lasttoken"),
        (QWEN3 | {"architectures": ["Qwen3Model"]}, None, None, 40960, "lasttoken"),
        (
            {
                "model_type": "qwen2",
                "architectures": ["Qwen2Model"],
                "hidden_size": 1536,
                "vocab_size": 151646,
                "max_position_embeddings": 32768,
            },
            {"model_max_length": HUGE},
            None,
            32768,
            "lasttoken",
        ),
        (
            {
                "model_type": "mistral",
                "architectures": ["MistralModel"],
                "hidden_size": 4096,
                "vocab_size": 32000,
                "max_position_embeddings": 32768,
            },
            None,
            {"max_seq_length": 4096},
            4096,
            "lasttoken",
        ),
        (
            {"model_type": "llama", "hidden_size": 2048, "vocab_size": 128256, "max_position_embeddings": 131072},
            None,
            None,
            131072,
            "lasttoken",
        ),
        (
            {
                "model_type": "phi3",
                "architectures": ["Phi3ForCausalLM"],
                "hidden_size": 3072,
                "vocab_size": 32064,
                "max_position_embeddings": 4096,
            },
            None,
            None,
            4096,
            "lasttoken",
        ),
        (
            {
                "model_type": "modernbert",
                "architectures": ["ModernBertModel"],
                "hidden_size": 768,
                "vocab_size": 50368,
                "max_position_embeddings": 8192,
            },
            {"model_max_length": HUGE},
            None,
            8192,
            "mean",
        ),
        (
            {
                "model_type": "gemma3_text",
                "architectures": ["Gemma3TextModel"],
                "hidden_size": 768,
                "vocab_size": 262144,
                "max_position_embeddings": 2048,
            },
            {"model_max_length": HUGE},
            None,
            2048,
            "mean",
        ),
        (
            {
                "model_type": "gemma3_text",
                "architectures": ["Gemma3ForCausalLM"],
                "hidden_size": 1152,
                "vocab_size": 262144,
                "max_position_embeddings": 32768,
            },
            None,
            None,
            32768,
            "mean",
        ),
        (
            {
                "model_type": "gemma3",
                "architectures": ["Gemma3ForConditionalGeneration"],
                "text_config": {"hidden_size": 2560, "vocab_size": 262208, "max_position_embeddings": 131072},
            },
            None,
            None,
            131072,
            "mean",
        ),
    ],
)
def test_decoder_and_long_context_configs(tmp_path, config, tokenizer, st, limit, pooling):
    info = load_model_info(str(_hf_folder(tmp_path, config, tokenizer, st)))
    hidden = config.get("hidden_size") or config["text_config"]["hidden_size"]
    assert (info.max_seq_length, info.pooling, info.dim, info.normalize) == (limit, pooling, hidden, False)


@pytest.mark.parametrize(
    "extra, labels",
    [
        ({"id2label": {"0": "negative", "2": "positive", "1": "neutral"}}, ("negative", "neutral", "positive")),
        ({"num_labels": 2}, ("LABEL_0", "LABEL_1")),  # transformers leaves the default names out of config.json
        ({"id2label": {"0": "relevant"}}, ("relevant",)),
    ],
)
def test_a_classifier_names_its_labels_by_logit(model_info, tmp_path, extra, labels):
    folder = _copy_model(model_info.path, tmp_path / "classifier")
    for name in ("modules.json", "sentence_bert_config.json"):
        (folder / name).unlink()
    config = json.loads((folder / "config.json").read_text())
    config |= {"architectures": ["BertForSequenceClassification"], **extra}
    (folder / "config.json").write_text(json.dumps(config))
    info = load_model_info(str(folder))
    assert (info.task, info.dim, info.labels) == ("score", len(labels), labels)
    assert model_info.labels == ()


@pytest.mark.parametrize("architectures", [["BertModel"], ["BertForSequenceClassification"]])
def test_a_modules_json_that_is_no_list_is_refused_for_every_kind_of_folder(model_info, tmp_path, architectures):
    folder = _copy_model(model_info.path, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": architectures}))
    (folder / "modules.json").write_text(json.dumps({"0": "sentence_transformers.models.Transformer"}))
    with pytest.raises(ConfigError, match=r"modules.json is not a list of modules"):
        load_model_info(str(folder))
