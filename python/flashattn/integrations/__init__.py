"""Integrations of flashattn with other libraries. Each submodule imports its library lazily:
``import flashattn.integrations.transformers`` needs transformers, nothing else here does."""
