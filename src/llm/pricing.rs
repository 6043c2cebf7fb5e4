//! USD per token by model.
