"""Offline: the labelled set (data, vocab, snippets) and the scikit-learn fit (train)
that write `gateway/classifier/assets/`. `python -m bench.training.classifier.train`."""
