"""Model folders: where they are, and what their sentence-transformers configs say.

A model folder is a standard Hugging Face folder (config.json, tokenizer.json, *.safetensors),
optionally with sentence-transformers files (modules.json, sentence_bert_config.json,
1_Pooling/config.json, 2_Dense/..., config_sentence_transformers.json). Tokenizer and worker read the
same facts from here, so they agree.

The module stack that modules.json lists is read as sentence-transformers 5/6 runs it:
Transformer -> Pooling -> any number of Dense -> Normalize. Any other module is refused at start,
so a folder never serves vectors that differ from ``SentenceTransformer.encode``. A CrossEncoder's
folder scores pairs instead: a ``…ForSequenceClassification`` checkpoint, or a causal LM run as
Transformer -> LogitScore (an LLM reranker such as Qwen3-Reranker, its pairs rendered by its chat template).

- ``folder``: where a folder is, and its JSON files read once (``ModelFolder``)
- ``info``: ``ModelInfo``, what a folder serves, as every service sees it
- ``load``: ``load_model_info``, a folder read into its ``ModelInfo``
- ``stack``: the embedder's modules (Pooling, Dense, Normalize) and pooling modes
- ``outputs``: sparse and multi-vector outputs (SPLADE, ColBERT-style, BGE-M3's heads)
- ``scoring``: cross-encoders and LLM rerankers
"""
