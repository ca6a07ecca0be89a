"""Request classification: rules plus a small linear text model (numpy only) turn a
typed request into a `RequestProfile`. The offline code that builds the labelled set and
fits the model with scikit-learn lives in `training/` and is never imported at runtime."""
