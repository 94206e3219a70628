"""Which task adapter a request's rows run with (models with task adapters: jina-embeddings-v3's
retrieval.query, retrieval.passage, separation, classification, text-matching; jina-embeddings-v5's
retrieval, text-matching, clustering, classification), and the prompt that goes with it.

A request names its task directly (``task``, as Jina's API does), or through what it already says:
a TEI ``prompt_name`` that is an adapter's name, or an input type (OpenAI / TEI ``input_type``,
Cohere's mapped to query / document / classification / clustering). With none of these, the rows run
on the base model, as Jina's own code does when no task is given. A task the model lacks is refused
with the tasks it has.
"""

from __future__ import annotations

from embedfleet.shared.errors import ErrorCode, ServiceError

# an input type -> the adapters that serve it, the first the model has taken
INPUT_TYPE_ADAPTERS = {
    "query": ("retrieval.query", "retrieval"),
    "document": ("retrieval.passage", "retrieval"),
    "classification": ("classification",),
    "clustering": ("separation", "clustering"),
}
# Jina v3's retrieval task names on a model whose one retrieval adapter takes both sides (v5): the
# adapter, and the input type whose prompt marks the side
SIDED_TASKS = {"retrieval.query": ("retrieval", "query"), "retrieval.passage": ("retrieval", "document")}


def resolve_task(
    adapters: tuple[str, ...],
    prompts: dict[str, str],
    task: str | None,
    prompt_name: str | None,
    input_type: str | None,
) -> tuple[str | None, str | None]:
    """(the adapter the rows run with or None, the prompt name they get or None: the model's usual
    choice from ``input_type``), or a ServiceError naming the tasks the model has."""
    if task is not None:
        if task not in adapters and task in SIDED_TASKS and SIDED_TASKS[task][0] in adapters:
            adapter, side = SIDED_TASKS[task]
            return adapter, prompt_name if prompt_name is not None else _prompt_for(prompts, side)
        if task not in adapters:
            known = ", ".join(adapters) if adapters else "none: it has no task adapters"
            raise ServiceError(ErrorCode.INVALID_REQUEST, f"the model has no task {task[:100]!r} (its tasks: {known})")
        return task, prompt_name if prompt_name is not None else _prompt_for(prompts, task)
    if not adapters:
        return None, prompt_name
    if prompt_name is not None:
        if prompt_name in adapters:
            return prompt_name, prompt_name
        return _adapter_for(adapters, prompt_name), prompt_name
    if input_type is None:
        return None, None
    chosen = _adapter_for(adapters, input_type)
    if chosen is None:
        return None, None  # the input type's own prompt, as for any model
    # the adapter's own prompt (v3: retrieval.query's), else the input type's (v5: query's "Query: ")
    return chosen, _prompt_for(prompts, chosen)


def _adapter_for(adapters: tuple[str, ...], input_type: str) -> str | None:
    return next((a for a in INPUT_TYPE_ADAPTERS.get(input_type, ()) if a in adapters), None)


def _prompt_for(prompts: dict[str, str], name: str) -> str | None:
    return name if name in prompts else None
