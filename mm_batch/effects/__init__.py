"""The effect adapters: one module per thing mm-batch reaches outside itself."""
