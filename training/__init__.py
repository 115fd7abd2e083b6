"""Code that runs inside each training rank: models, readers, callbacks, optimizers."""
