"""Sparse optimizers (mxRec: ``mx_rec.optimizers``): gradient_descent,
adagrad, lazy_adam, ftrl -- each module has create_hash_optimizer(...)."""
