"""Scorer: reranks candidate texts against a query."""
