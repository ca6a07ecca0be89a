"""Offline code that produced the bundled model: corpus, tokenizer and model training,
drafter training, the model card. The runtime (engine, server) never imports it."""
