"""Options naming the models served: a model folder, or several in a models file, and the name each is served as."""

from __future__ import annotations

from embedfleet.shared.config.commands import SERVICES
from embedfleet.shared.config.option import Option, declare

OPTIONS: tuple[Option, ...] = (
    declare(
        "--model",
        "EMBEDFLEET_MODEL",
        None,
        "local Hugging Face / sentence-transformers model folder (default: the shipped all-MiniLM-L6-v2)",
        SERVICES,
        "model",
    ),
    declare(
        "--model",
        "EMBEDFLEET_MODEL",
        None,
        "a local Hugging Face / sentence-transformers model folder to serve, with the id clients use before '=' "
        "(default id: the folder's name); repeat it to serve several models (the variable: one or more, comma "
        "separated; default: the shipped all-MiniLM-L6-v2)",
        {"up"},
        "model",
        kind="list",
        metavar="[ID=]DIR",
    ),
    declare(
        "--model-name",
        "EMBEDFLEET_MODEL_NAME",
        None,
        "the id clients use for the model (default: the folder's name); up: only with one model, with several "
        "give --model ID=DIR",
        SERVICES | {"up"},
        "model",
    ),
    declare(
        "--models-file",
        "EMBEDFLEET_MODELS_FILE",
        None,
        "file naming models to serve, one a line as [ID=]DIR (relative folders from the file's own); "
        "'#' starts a comment; served after those of --model",
        {"up"},
        "model",
    ),
)
